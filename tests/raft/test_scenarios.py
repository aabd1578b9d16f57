"""Scenario tests: one per rule of the Raft paper's figure 2 and per feature, plus the
classic failures. Every Cluster also runs the simulator's invariant checker.

The map from each figure-2 rule, feature and classic failure to its test(s) is in
docs/raft.md ("What the scenario tests cover")."""

from __future__ import annotations

import pytest

from doq.raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    NotLeader,
    ProgressState,
    ProposalDropped,
    RaftCore,
    Ready,
    Role,
    Snapshot,
    SnapshotTemporarilyUnavailable,
    codec,
)
from tools.sim.harness import Cluster
from tools.sim.node import SimNode
from tools.sim.runner import SimOptions, run_seed

MT = MessageType


def ok(c: Cluster) -> None:
    assert c.checker.violations == []


def roles(c: Cluster) -> dict[str, Role]:
    return {n: c.core(n).role for n, node in c.nodes.items() if node.core is not None}


# ----------------------------------------------------------------------------- elections
def test_election_by_timeout_yields_one_leader_everyone_follows() -> None:
    c = Cluster(("a", "b", "c"))
    c.tick(40)
    leaders = [n for n, r in roles(c).items() if r == Role.LEADER]
    assert len(leaders) == 1
    term = c.core(leaders[0]).term
    assert term >= 2
    assert all(c.core(n).term == term and c.core(n).lead == leaders[0] for n in c.nodes)
    ok(c)


def test_vote_granted_at_most_once_per_term_and_persisted_before_reply() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
    b.step(Message(MT.VOTE, to="b", frm="c", term=5, index=1, log_term=1))
    rd = b.ready()
    assert [(m.to, m.reject) for m in rd.messages] == [("a", False), ("c", True)]
    assert rd.hard_state == HardState(5, "a", 1)
    assert rd.must_sync


def test_vote_survives_a_restart() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    c.core("b").step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
    c.flush()  # b persists its vote and replies
    c.crash("b")
    c.restart("b")
    b = c.core("b")
    assert (b.term, b.vote) == (5, "a")
    b.step(Message(MT.VOTE, to="b", frm="c", term=5, index=1, log_term=1))
    assert [m.reject for m in b.ready().messages] == [True]


def test_vote_in_the_current_term_survives_a_restart() -> None:
    """A vote cast without a term change (the term came earlier, from a rejected
    candidate) must be persisted as well before the grant leaves."""
    c = Cluster(("a", "b", "c", "d", "e"), pre_vote=False, check_quorum=False)
    c.elect("a")  # everyone holds 2@2
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="c", term=7, index=1, log_term=1))  # stale log
    c.flush()
    assert (b.term, b.vote) == (7, "")
    b.step(Message(MT.VOTE, to="b", frm="d", term=7, index=2, log_term=2))
    c.flush()
    assert c.nodes["b"].storage.hard_state.vote == "d"
    c.crash("b")
    c.restart("b")
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="e", term=7, index=2, log_term=2))
    assert [(m.to, m.reject) for m in b.ready().messages] == [("e", True)]


def test_no_persist_vote_bug_forgets_the_vote_after_a_restart() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False, bugs=frozenset({"no-persist-vote"}))
    c.core("b").step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
    c.flush()
    c.crash("b")
    c.restart("b")
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="c", term=5, index=1, log_term=1))
    assert [m.reject for m in b.ready().messages] == [False]  # a second vote in term 5


def test_candidate_increments_term_votes_for_itself_and_requests_votes() -> None:
    """Candidates: on conversion increment the term, vote for self, reset the election
    timer, send RequestVote to all others; if the election times out, start a new one."""
    c = Cluster(("a", "b", "c"), pre_vote=False)
    a = c.core("a")
    term = a.term
    c.isolate("a")  # nobody will answer
    for _ in range(3):
        a.tick()
    a.campaign()
    assert (a.role, a.term, a.vote, a.election_elapsed) == (Role.CANDIDATE, term + 1, "a", 0)
    c.flush()
    requests = sorted((m.to, m.term, m.index, m.log_term) for m in c.queue if m.type == MT.VOTE)
    assert requests == [("b", term + 1, 1, 1), ("c", term + 1, 1, 1)]
    hs = c.nodes["a"].storage.hard_state
    assert (hs.term, hs.vote) == (term + 1, "a")  # persisted before the requests left
    c.stabilize()
    ticks = 0
    while a.term == term + 1:
        c.tick(1, nodes=["a"])
        ticks += 1
    assert 10 <= ticks < 20  # a randomized timeout in [election_tick, 2*election_tick)
    assert (a.role, a.term, a.vote) == (Role.CANDIDATE, term + 2, "a")
    c.heal()
    c.isolate("c")
    c.tick(20, nodes=["a"])
    assert c.leader() == "a"  # its own vote + b's make a majority of three


def test_follower_campaigns_only_after_a_timeout_without_leader_or_vote() -> None:
    """Followers: become a candidate once the election timeout elapses without an
    AppendEntries/heartbeat from the current leader or granting a vote; both reset it."""
    c = Cluster(("a", "b", "c"), pre_vote=False)
    b = c.core("b")
    term = b.term
    timeout = b.randomized_election_timeout
    assert 10 <= timeout < 20

    def idle(n: int) -> None:
        for _ in range(n):
            b.tick()

    idle(timeout - 1)
    b.step(Message(MT.VOTE, to="b", frm="c", term=term, index=1, log_term=1))
    assert b.vote == "c" and b.election_elapsed == 0  # granting a vote resets the timer
    idle(timeout - 1)
    b.step(Message(MT.HEARTBEAT, to="b", frm="c", term=term))
    assert b.lead == "c" and b.election_elapsed == 0  # so does hearing from the leader...
    idle(timeout - 1)
    b.step(Message(MT.APP, to="b", frm="c", term=term, index=1, log_term=1))
    assert b.election_elapsed == 0  # ...by heartbeat or AppendEntries
    idle(timeout - 1)
    assert (b.role, b.term) == (Role.FOLLOWER, term)
    b.tick()
    assert (b.role, b.term, b.vote) == (Role.CANDIDATE, term + 1, "b")


def test_idle_leader_heartbeats_keep_followers_from_campaigning() -> None:
    """Leaders: send heartbeats during idle periods to prevent election timeouts."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    term = c.core("a").term
    c.delivered.clear()
    c.tick(100)
    beats = [m.to for m in c.delivered if m.type == MT.HEARTBEAT and m.frm == "a"]
    assert sorted(set(beats)) == ["b", "c"] and len(beats) == 200  # every tick (heartbeat_tick=1)
    assert not any(m.type in (MT.VOTE, MT.PRE_VOTE) for m in c.delivered)
    assert c.leader() == "a" and all(c.core(n).term == term for n in "abc")
    ok(c)


def test_vote_request_of_an_older_term_is_refused() -> None:
    """RequestVote receiver rule 1: no vote for a candidate whose term is older."""
    for pre_vote in (False, True):
        c = Cluster(("a", "b", "c"), pre_vote=pre_vote)
        b = c.core("b")
        b.step(Message(MT.APP_RESP, to="b", frm="c", term=5))  # b moves to term 5, no vote
        assert (b.term, b.vote) == (5, "")
        vote = MT.PRE_VOTE if pre_vote else MT.VOTE
        b.step(Message(vote, to="b", frm="c", term=4, index=99, log_term=4))
        assert (b.term, b.vote) == (5, "")
        replies = [(m.type, m.reject, m.term) for m in b.ready().messages if m.to == "c"]
        # a stale VOTE is ignored (as in etcd); a stale pre-candidate learns the term
        assert replies == ([(MT.PRE_VOTE_RESP, True, 5)] if pre_vote else [])


def test_vote_is_granted_again_to_the_same_candidate() -> None:
    """RequestVote receiver rule 2: granted if votedFor is null *or candidateId*
    (a duplicated or retried request gets the same answer)."""
    c = Cluster(("a", "b", "c"), pre_vote=False)
    b = c.core("b")
    for _ in range(2):
        b.step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
    rd = b.ready()
    assert [(m.type, m.to, m.reject) for m in rd.messages] == [(MT.VOTE_RESP, "a", False)] * 2
    assert rd.hard_state == HardState(5, "a", 1)


@pytest.mark.parametrize(
    ("last_index", "last_term", "granted"),
    [(1, 3, True), (5, 2, True), (9, 2, True), (4, 2, False), (9, 1, False)],
)
def test_vote_only_for_a_log_at_least_as_up_to_date(
    last_index: int, last_term: int, granted: bool
) -> None:
    """RequestVote receiver rule 2, up-to-date check (section 5.4.1): a higher last term
    wins whatever the length; with equal last terms the longer log wins."""
    c = Cluster(("a", "b", "c"), pre_vote=False, check_quorum=False)
    c.elect("a")  # term 2, noop at 2
    for i in range(3):
        c.propose("a", b"v%d" % i)
    b = c.core("b")
    assert (b.log.last_index(), b.log.last_term()) == (5, 2)
    b.step(Message(MT.VOTE, to="b", frm="c", term=9, index=last_index, log_term=last_term))
    (resp,) = [m for m in b.ready().messages if m.type == MT.VOTE_RESP]
    assert resp.reject is not granted
    assert b.vote == ("c" if granted else "")


def test_vote_denied_to_candidate_with_stale_log() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    c.elect("a")
    c.isolate("c")
    c.propose("a", b"x")
    c.heal()
    c.blocked = {("a", "c"), ("c", "a")}  # c only reaches b, whose log is newer
    c.core("c").campaign()
    c.stabilize()
    assert c.core("c").role != Role.LEADER
    ok(c)


def test_dueling_candidates_end_with_one_leader() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    c.core("b").campaign()
    c.core("c").campaign()  # both candidates in the same term before any delivery
    c.stabilize()
    assert c.core("b").term == c.core("c").term
    c.tick(60)
    assert list(roles(c).values()).count(Role.LEADER) == 1
    ok(c)


def test_candidate_steps_down_on_append_from_leader_of_its_term() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    c.elect("a")
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="x", term=9))  # move b to term 9
    b.campaign()  # b: candidate in term 10
    assert b.role == Role.CANDIDATE
    b.step(Message(MT.APP, to="b", frm="c", term=b.term, index=1, log_term=1))
    assert (b.role, b.lead) == (Role.FOLLOWER, "c")


@pytest.mark.parametrize("mtype", [MT.APP_RESP, MT.HEARTBEAT_RESP, MT.VOTE_RESP, MT.READ_INDEX])
@pytest.mark.parametrize("role", [Role.LEADER, Role.CANDIDATE])
def test_higher_term_in_any_message_turns_leader_or_candidate_into_follower(
    mtype: MessageType, role: Role
) -> None:
    """Rules for all servers: a request or response with term T > currentTerm sets
    currentTerm = T (forgetting the vote) and converts to follower."""
    c = Cluster(("a", "b", "c"), pre_vote=False)
    if role == Role.LEADER:
        c.elect("a")
    else:
        c.isolate("a")
        c.core("a").campaign()
    a = c.core("a")
    assert a.role == role
    old = a.term
    a.step(Message(mtype, to="a", frm="b", term=old + 3))
    assert (a.role, a.term, a.lead, a.vote) == (Role.FOLLOWER, old + 3, "", "")


def test_initial_leader_appends_empty_entry_of_its_term() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    last = a.log.last_index()
    assert a.log.term(last) == a.term and a.log.committed == last
    ok(c)


def test_entries_apply_in_order_once_and_only_after_commit() -> None:
    """Rules for all servers: apply log[lastApplied+1..commitIndex] in order.
    Leaders: a client command is appended to the leader's log in its term, and is
    answered only once applied, which needs a commit."""
    c = Cluster(("a", "b", "c"))
    applied: dict[str, list[int]] = {n: [] for n in "abc"}
    on_apply = c.checker.on_apply

    def record(node: SimNode, e: Entry, h: bytes) -> None:
        applied[node.id].append(e.index)
        on_apply(node, e, h)

    c.checker.on_apply = record  # type: ignore[method-assign,assignment]
    c.elect("a")
    c.filters.append(lambda m: m.type != MT.APP_RESP)  # replicated, but nothing commits
    a = c.core("a")
    idx = a.propose(b"x")
    c.checker.proposed("a", b"x")
    assert idx == a.log.last_index() and a.log.term(idx) == a.term
    c.stabilize()
    assert all(c.nodes[n].storage.last_index() == idx for n in "abc")
    assert all(idx not in applied[n] for n in "abc")
    c.heal()
    c.propose("a", b"y")
    c.tick(2)
    for n in "abc":
        assert applied[n] == list(range(2, idx + 2))  # noop, x, y: each once, in order
    assert c.checker.acked == {b"x": idx, b"y": idx + 1}
    ok(c)


# ------------------------------------------------------------------------ AppendEntries
def test_append_from_stale_term_is_refused_with_our_term() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    b = c.core("b")
    b.step(Message(MT.APP, to="b", frm="c", term=1, index=2, log_term=2))
    (resp,) = b.ready().messages
    assert resp.type == MT.APP_RESP and resp.term == b.term


def test_append_without_matching_prev_is_rejected_with_a_hint() -> None:
    c = Cluster(("a", "b", "c"))
    b = c.core("b")
    b.step(Message(MT.APP, to="b", frm="a", term=3, index=7, log_term=3))
    (resp,) = b.ready().messages
    assert resp.reject and resp.index == 7 and resp.reject_hint == b.log.last_index() == 1


def test_append_rejected_when_prev_entry_has_another_term() -> None:
    """AppendEntries receiver rule 2, at an index the follower has but with another term."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")  # noop 2@2 everywhere
    b = c.core("b")
    new = (Entry(b.term, 3, data=b"z"),)
    b.step(Message(MT.APP, to="b", frm="a", term=b.term, index=2, log_term=1, entries=new))
    (resp,) = b.ready().messages
    assert resp.reject and resp.index == 2 and (resp.reject_hint, resp.log_term) == (1, 1)
    assert b.log.last_index() == 2


def test_append_keeps_entries_already_present_and_appends_only_new_ones() -> None:
    """AppendEntries receiver rules 3-4: a late or duplicated AppendEntries whose entries
    the follower already holds must not truncate what follows them; new ones are added."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.filters.append(lambda m: m.type != MT.APP_RESP)  # keep 3..5 uncommitted on b
    for i in range(3):
        c.propose("a", b"v%d" % i)
    b = c.core("b")
    assert (b.log.committed, b.log.last_index()) == (2, 5)
    st = c.nodes["b"].storage
    term = b.term
    b.step(Message(MT.APP, to="b", frm="a", term=term, index=2, log_term=term,
                   entries=tuple(st.entries(3, 4, 1 << 20))))
    (resp,) = b.ready().messages
    assert not resp.reject and resp.index == 3
    assert b.log.last_index() == 5 and b.log.unstable.entries == []  # nothing rewritten
    tail = (Entry(term, 5, data=b"v2"), Entry(term, 6, data=b"v3"))
    b.step(Message(MT.APP, to="b", frm="a", term=term, index=4, log_term=term, entries=tail))
    assert [e.index for e in b.log.unstable.entries] == [6]  # only the new entry
    assert b.log.last_index() == 6


def test_commit_index_is_min_of_leader_commit_and_last_new_entry() -> None:
    from doq.raft import Entry

    c = Cluster(("a", "b", "c"))
    b = c.core("b")
    ents = (Entry(2, 2), Entry(2, 3))
    b.step(Message(MT.APP, to="b", frm="a", term=2, index=1, log_term=1, entries=ents, commit=9))
    assert b.log.committed == 3


def test_conflicting_uncommitted_tail_is_truncated() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("a")
    for i in range(3):
        c.core("a").propose(b"lost%d" % i)
    c.stabilize()
    c.heal()
    c.blocked = {("a", x) for x in "bc"} | {(x, "a") for x in "bc"}
    c.tick(60, nodes=["b", "c"])
    new = c.leader()
    assert new in ("b", "c")
    c.propose(new, b"kept")
    c.heal()
    c.tick(3)
    for n in "abc":
        assert c.log_data(n) == [b"kept"]
    assert c.nodes["a"].sm.hash == c.nodes[new].sm.hash
    ok(c)


def diverge(c: Cluster, stale: int, fresh: int) -> str:
    """Leave a with an uncommitted tail of ``stale`` entries (term 2) while b and c move
    on; leadership then passes to a node whose log is longer than a's tail."""
    c.elect("a")
    c.isolate("a")
    c.core("a").propose_batch([b"stale%d" % i for i in range(stale)])
    c.stabilize()
    c.tick(60, nodes=["b", "c"])
    new = c.leader()
    assert new in ("b", "c")
    c.core(new).propose_batch([b"fresh%d" % i for i in range(fresh)])
    c.stabilize()
    other = "c" if new == "b" else "b"
    c.core(new).transfer_leadership(other)
    c.stabilize()
    assert c.leader() == other
    return other


def test_fast_backoff_uses_conflict_hints() -> None:
    c = Cluster(("a", "b", "c"), max_entries_per_msg=4)
    lead = diverge(c, stale=60, fresh=60)
    c.heal()
    c.delivered.clear()
    c.tick(2)
    rejects = [m for m in c.delivered if m.type == MT.APP_RESP and m.reject and m.frm == "a"]
    assert len(rejects) == 1  # not one rejection per conflicting entry
    assert c.nodes["a"].sm.hash == c.nodes[lead].sm.hash
    assert all(not d.startswith(b"stale") for d in c.log_data("a"))
    ok(c)


def test_leader_commits_old_term_entries_only_via_current_term_entry() -> None:
    """Figure 8: an entry of an older term replicated on a majority is not committed by
    counting replicas; the commit-old-term bug commits it and the checker catches the
    later leader that lacks it."""

    def run(bugs: frozenset[str]) -> tuple[Cluster, int]:
        c = Cluster("abcde", pre_vote=False, check_quorum=False, max_entries_per_msg=1,
                    bugs=bugs)
        c.elect("a")  # term 2, noop at 2
        c.partition("ab", "cde")
        x_index = c.core("a").propose(b"x")  # index 3, only on a and b
        c.stabilize()
        c.filters.append(lambda m: not (m.frm == "e" and m.type == MT.APP and m.entries))
        c.elect("e")  # term 3; its entry 3@3 never leaves e
        c.heal()
        c.isolate("e")
        c.crash("a")  # a restarts as a follower of term 2 with x persisted
        c.restart("a")

        def hold_term4_entries(m: Message) -> bool:  # let probes that will be rejected pass
            would_accept = c.nodes[m.to].storage.last_index() >= m.index
            return not (m.type == MT.APP and would_accept and any(x.term >= 4 for x in m.entries))

        c.filters.append(hold_term4_entries)
        c.core("a").campaign()  # rejected in term 3 (c, d voted for e)...
        c.stabilize()
        c.core("a").campaign()  # ...wins term 4; replicates x but not its own entry 4@4
        c.stabilize()
        assert c.core("a").role == Role.LEADER and c.core("a").term == 4
        assert c.nodes["c"].storage.term(x_index) == 2  # x is on a majority now
        committed = c.core("a").log.committed
        c.crash("a")
        c.heal()
        c.isolate("a")
        c.crash("e")  # e restarts as a follower of term 3
        c.restart("e")
        c.core("e").campaign()  # term 4: b, c, d already voted for a
        c.stabilize()
        c.elect("e")  # term 5: e's log (last term 3) beats x (term 2)
        c.tick(3)
        return c, committed >= x_index

    c, committed = run(frozenset())
    assert not committed
    assert all(b"x" not in c.log_data(n) for n in "bcde")
    ok(c)
    c, committed = run(frozenset({"commit-old-term"}))
    assert committed
    assert any("leader completeness" in v for v in c.checker.violations)


def test_skip_prev_check_bug_breaks_log_matching() -> None:
    for bugs, broken in ((frozenset(), False), (frozenset({"skip-prev-check"}), True)):
        c = Cluster(("a", "b", "c"), bugs=bugs)
        diverge(c, stale=10, fresh=3)
        c.heal()
        c.tick(5)
        assert any("log matching" in v for v in c.checker.violations) == broken


# ---------------------------------------------------------------------- classic failures
def test_stale_leader_after_partition_cannot_commit_and_steps_down() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    old_term = c.core("a").term
    c.isolate("a")
    c.tick(60, nodes=["b", "c"])
    new = c.leader()
    assert new in ("b", "c") and c.core(new).term > old_term
    idx = c.core("a").propose(b"stale")  # a still believes it leads
    c.stabilize()
    assert c.core("a").log.committed < idx
    c.propose(new, b"fresh")
    c.heal()
    c.tick(3)
    assert c.core("a").role == Role.FOLLOWER and c.core("a").lead == new
    assert c.log_data("a") == [b"fresh"]
    ok(c)


def test_leader_crash_mid_replication_keeps_committed_and_drops_uncommitted() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.filters.append(lambda m: not (m.type == MT.APP and m.to == "c" and m.entries))
    c.propose("a", b"committed")  # on a and b: a majority
    assert c.core("a").log.committed == c.core("a").log.last_index()
    c.filters.append(lambda m: not (m.type == MT.APP and m.entries and m.frm == "a"))
    c.core("a").propose(b"uncommitted")
    c.stabilize()
    c.crash("a")
    c.heal()
    c.tick(60, nodes=["b", "c"])
    assert c.leader() == "b"  # c lacks the committed entry: b must win
    c.restart("a")
    c.tick(5)
    for n in "abc":
        assert c.log_data(n) == [b"committed"]
    ok(c)


def test_restart_rebuilds_state_from_persisted_log() -> None:
    c = Cluster(("a", "b", "c"), snapshot_every=4)
    c.elect("a")
    for i in range(10):
        c.propose("a", b"v%d" % i)
    before = {n: c.nodes[n].sm.hash for n in "abc"}
    for n in "abc":
        c.crash(n)
        c.restart(n)
    c.tick(40)
    assert c.leader() is not None
    assert len({c.nodes[n].sm.hash for n in "abc"}) == 1
    assert c.nodes["a"].sm.index >= 12 and before["a"] == before["b"]
    ok(c)


# ------------------------------------------------------------------- PreVote, CheckQuorum
def test_prevote_keeps_a_rejoining_node_from_disrupting_the_leader() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    term = c.core("a").term
    c.isolate("c")
    c.tick(100)
    assert c.core("c").term == term  # pre-votes failed: no term inflation
    c.heal()
    c.tick(5)
    assert c.leader() == "a" and c.core("a").term == term
    ok(c)


def test_without_prevote_a_rejoining_node_disrupts_the_leader() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False, check_quorum=False)
    c.elect("a")
    term = c.core("a").term
    c.isolate("c")
    c.tick(100, nodes=["c"])
    assert c.core("c").term > term
    c.heal()
    c.tick(30)
    assert c.core("a").term > term  # the old leader was deposed by c's term


def test_check_quorum_leader_steps_down_when_isolated() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("a")
    c.tick(25, nodes=["a"])
    assert c.core("a").role == Role.FOLLOWER
    c2 = Cluster(("a", "b", "c"), check_quorum=False)
    c2.elect("a")
    c2.isolate("a")
    c2.tick(25, nodes=["a"])
    assert c2.core("a").role == Role.LEADER


def test_check_quorum_lease_ignores_disruptive_vote_requests() -> None:
    """A follower that heard from its leader within the election timeout ignores a vote
    request of a higher term (but not one sent after a leadership transfer)."""
    from doq.raft import CAMPAIGN_TRANSFER

    c = Cluster(("a", "b", "c"), pre_vote=False)
    c.elect("a")
    b = c.core("b")
    term = b.term
    b.step(Message(MT.VOTE, to="b", frm="c", term=term + 5, index=9, log_term=9))
    assert (b.term, b.lead, b.vote) == (term, "a", "a") and not b.ready().messages
    c2 = Cluster(("a", "b", "c"), pre_vote=False)
    c2.elect("a")
    b2 = c2.core("b")
    b2.step(Message(MT.VOTE, to="b", frm="c", term=term + 5, index=9, log_term=9,
                    context=CAMPAIGN_TRANSFER))
    assert (b2.term, b2.vote) == (term + 5, "c")


# ------------------------------------------------------------------ replication mechanics
def test_proposals_are_batched_into_one_append_per_follower() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    for i in range(100):
        a.propose(b"e%d" % i)
    c.delivered.clear()
    c.stabilize()
    apps = [m for m in c.delivered if m.type == MT.APP and m.entries]
    assert sorted(m.to for m in apps) == ["b", "c"]
    assert all(len(m.entries) == 100 for m in apps)
    ok(c)


def test_commit_is_broadcast_at_once_by_default() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.filters.append(lambda m: not (m.type == MT.APP_RESP and m.frm == "c"))  # b's answer commits
    c.delivered.clear()
    i = c.propose("a", b"x")
    assert c.core("a").log.committed == i
    # the commit index left at once, in an append of its own (no entries) to each follower
    bcast = [m for m in c.delivered if m.type == MT.APP and not m.entries and m.commit == i]
    assert sorted(m.to for m in bcast) == ["b", "c"]
    assert c.core("b").log.committed == c.core("c").log.committed == i
    ok(c)


def test_lazy_commit_rides_the_next_append_or_heartbeat() -> None:
    """`broadcast_commit=False`: a commit sends nothing by itself; followers learn the
    commit index from the leader's next append (applied in the Ready that persists it)
    or its next heartbeat (Raft paper 5.3)."""
    c = Cluster(("a", "b", "c"), broadcast_commit=False)
    c.elect("a")
    c.tick(1)  # the new leader's empty entry: its commit reaches the followers
    c.delivered.clear()
    i = c.propose("a", b"x")
    assert c.core("a").log.committed == i
    assert [m for m in c.delivered if m.type == MT.APP and not m.entries] == []
    assert c.core("b").log.committed == c.core("c").log.committed == i - 1
    assert c.nodes["b"].sm.hash != c.nodes["a"].sm.hash  # not applied on b yet
    # the next entry carries the commit: b persists i + 1 and applies i in one Ready
    seen: list[tuple[list[int], list[int]]] = []
    orig = c.nodes["b"].handle_ready

    def spy() -> list[Message]:
        rd_entries = [e.index for e in c.core("b").log.unstable_entries()]
        applied_before = c.core("b").log.applied
        out = orig()
        seen.append((rd_entries, list(range(applied_before + 1, c.core("b").log.applied + 1))))
        return out

    c.nodes["b"].handle_ready = spy  # type: ignore[method-assign]
    j = c.propose("a", b"y")
    assert (seen[0][0], seen[0][1][:1]) == ([j], [i])
    assert c.core("b").log.committed == j - 1
    c.nodes["b"].handle_ready = orig  # type: ignore[method-assign]
    # with nothing more to append, the heartbeat brings the last commit
    c.delivered.clear()
    c.tick(1)
    assert any(m.type == MT.HEARTBEAT and m.commit == j for m in c.delivered)
    assert c.core("b").log.committed == c.core("c").log.committed == j
    assert c.nodes["b"].sm.hash == c.nodes["c"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_inflight_window_bounds_pipelined_appends() -> None:
    c = Cluster(("a", "b", "c"), max_inflight_msgs=2, max_entries_per_msg=1)
    c.elect("a")
    c.filters.append(lambda m: not (m.type == MT.APP_RESP and m.frm == "b"))
    c.delivered.clear()
    for i in range(10):
        c.propose("a", b"e%d" % i)
    to_b = [m for m in c.delivered if m.type == MT.APP and m.to == "b" and m.entries]
    assert len(to_b) == 2
    assert c.core("a").log.committed == c.core("a").log.last_index()  # a + c suffice
    c.heal()
    c.tick(3)
    assert c.nodes["b"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_progress_probes_then_pipelines_and_probes_again_after_a_gap() -> None:
    """Leaders: on success update nextIndex/matchIndex, on an inconsistency move
    nextIndex back and retry. PROBE sends one MsgApp at a time until the match is known,
    REPLICATE pipelines within the window, a rejection falls back to PROBE."""
    c = Cluster(("a", "b", "c"), max_entries_per_msg=1, max_inflight_msgs=8)
    to_b: list[tuple[int, int, ProgressState]] = []  # (prev index, entries, a's state for b)
    drop_prev: set[int] = set()

    def watch_b(m: Message) -> bool:
        if m.type != MT.APP or m.to != "b":
            return True
        to_b.append((m.index, len(m.entries), c.core("a").prs["b"].state))
        if m.index in drop_prev:
            drop_prev.discard(m.index)
            return False
        return True

    c.filters.append(lambda m: m.to != "b")  # b hears nothing at first
    c.elect("a")
    pr = c.core("a").prs["b"]
    assert (pr.state, pr.probe_sent, pr.match, pr.next) == (ProgressState.PROBE, True, 0, 2)
    for i in range(3):
        c.propose("a", b"v%d" % i)
    assert pr.probe_sent and pr.next == 2  # paused: no second MsgApp while probing
    c.heal()
    c.filters.append(watch_b)
    c.tick(1)  # heartbeat response unpauses the probe; the ack switches b to REPLICATE
    assert (pr.state, pr.match, pr.next) == (ProgressState.REPLICATE, 5, 6)
    assert to_b[0] == (1, 1, ProgressState.PROBE)
    assert to_b[1:] == [(i, 1, ProgressState.REPLICATE) for i in (2, 3, 4)]  # pipelined...
    resp = [i for i, m in enumerate(c.delivered) if m.type == MT.APP_RESP and m.frm == "b"]
    apps = [i for i, m in enumerate(c.delivered) if m.type == MT.APP and m.to == "b"]
    assert apps[-1] < resp[-3]  # ...before the first of them was acknowledged
    to_b.clear()
    drop_prev.add(5)  # lose the MsgApp carrying entry 6
    c.propose("a", b"v3")  # committed by a + c; the commit notice to b (prev 6) has a gap
    rejects = [m for m in c.delivered if m.type == MT.APP_RESP and m.frm == "b" and m.reject]
    assert [(m.index, m.reject_hint) for m in rejects] == [(6, 5)]
    assert to_b[:3] == [
        (5, 1, ProgressState.REPLICATE),  # lost
        (6, 0, ProgressState.REPLICATE),  # rejected: b lacks 6
        (5, 1, ProgressState.PROBE),  # back to probing from match + 1
    ]
    c.propose("a", b"v4")
    assert (pr.state, pr.match, pr.next) == (ProgressState.REPLICATE, 7, 8)
    assert c.nodes["b"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_propose_on_follower_raises_not_leader_with_hint() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    with pytest.raises(NotLeader) as exc:
        c.core("b").propose(b"x")
    assert exc.value.leader_hint == "a"


# ------------------------------------------------------------------------------ snapshots
def test_follower_far_behind_receives_a_chunked_snapshot() -> None:
    c = Cluster(("a", "b", "c"), snapshot_every=5, snapshot_chunk_bytes=4)
    c.elect("a")
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"v%d" % i)
    assert c.nodes["a"].storage.first_index() > c.nodes["c"].storage.last_index() + 1
    c.heal()
    c.delivered.clear()
    c.tick(3)
    chunks = [m for m in c.delivered if m.type == MT.SNAP and m.to == "c"]
    assert len(chunks) >= 6 and chunks[-1].done  # 24-byte snapshot in 4-byte chunks
    assert c.nodes["c"].storage.snapshot().meta.index > 1
    assert c.nodes["c"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_installed_snapshot_is_synced_before_it_is_acknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: the Ready carrying a received snapshot (and the APP_RESP that
    acknowledges it) had must_sync=False, so a driver fsyncing only on must_sync could
    ack a snapshot it then lost; the leader, whose match covers it, ignores the
    follower's later rejections as stale and never resends."""
    readies: list[tuple[str, bool, list[Message]]] = []
    ready = RaftCore.ready

    def recording(self: RaftCore) -> Ready:
        rd = ready(self)
        if rd.snapshot is not None:
            readies.append((self.id, rd.must_sync, list(rd.messages)))
        return rd

    monkeypatch.setattr(RaftCore, "ready", recording)
    c = Cluster(("a", "b", "c"), snapshot_every=5)
    c.elect("a")
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"v%d" % i)
    c.heal()
    c.tick(3)
    ((nid, must_sync, msgs),) = readies
    assert nid == "c" and any(m.type == MT.APP_RESP and not m.reject for m in msgs)
    assert must_sync
    ok(c)


def test_snapshot_data_produced_on_demand_is_sent_once_the_storage_has_it() -> None:
    """A storage that produces snapshot data lazily (the node's LMDB one) raises
    SnapshotTemporarilyUnavailable until it has it: the leader sends nothing meanwhile
    (no error, nothing else disturbed) and sends the snapshot on a later heartbeat
    response once it is there."""
    c = Cluster(("a", "b", "c"), snapshot_every=5)
    c.elect("a")
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"v%d" % i)
    storage = c.nodes["a"].storage
    stored = storage.snapshot
    asked: list[int] = []
    ready: list[Snapshot] = []

    def lazy() -> Snapshot:
        asked.append(1)
        if not ready:
            raise SnapshotTemporarilyUnavailable("being produced")
        return ready[0]

    storage.snapshot = lazy  # type: ignore[method-assign]
    c.heal()
    c.delivered.clear()
    c.tick(3)
    assert asked and not [m for m in c.delivered if m.type == MT.SNAP]
    c.propose("a", b"meanwhile")  # the others go on
    assert c.nodes["b"].sm.hash == c.nodes["a"].sm.hash != c.nodes["c"].sm.hash
    ready.append(stored())
    c.tick(3)
    assert [m for m in c.delivered if m.type == MT.SNAP and m.to == "c"]
    assert c.nodes["c"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_snapshot_needed_while_a_live_follower_is_behind_the_log_or_being_sent_one() -> None:
    """`snapshot_needed` (the driver keeps snapshot data while it holds): a leader with a
    follower being sent a snapshot, or one that answers and is behind the first index;
    not for a follower silent for an election timeout, nor once it caught up."""
    c = Cluster(("a", "b", "c"), snapshot_every=5)
    c.elect("a")
    a = c.core("a")
    assert not a.snapshot_needed()
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"v%d" % i)
    c.tick(25)  # c silent for over an election timeout
    assert a.prs["c"].match < a.log.first_index() and not a.snapshot_needed()
    c.heal()
    c.filters.append(lambda m: not (m.type == MT.SNAP and m.to == "c"))  # lost on the way
    c.tick(3)
    assert a.snapshot_needed() and not c.core("b").snapshot_needed()
    c.filters.clear()
    c.tick(40)  # sent again, installed, acknowledged
    assert c.nodes["c"].sm.hash == c.nodes["a"].sm.hash
    assert c.core("a") is a and not a.snapshot_needed()
    ok(c)


def test_lost_snapshot_chunk_is_retried() -> None:
    c = Cluster(("a", "b", "c"), snapshot_every=5, snapshot_chunk_bytes=4)
    c.elect("a")
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"v%d" % i)
    c.heal()
    dropped: list[Message] = []

    def drop_second_chunk(m: Message) -> bool:
        if m.type == MT.SNAP and m.offset == 4 and not dropped:
            dropped.append(m)
            return False
        return True

    c.filters.append(drop_second_chunk)
    c.tick(40)
    assert dropped and c.nodes["c"].sm.hash == c.nodes["a"].sm.hash
    ok(c)


def test_snapshot_is_taken_at_the_applied_index_with_its_conf_state() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.add_learner("a", "d")
    for i in range(3):
        c.propose("a", b"v%d" % i)
    a, node = c.core("a"), c.nodes["a"]
    applied = a.log.applied
    assert applied == a.log.committed == node.sm.index
    with pytest.raises(ValueError):
        a.make_snapshot(applied - 1, b"")  # only at the applied index
    snap = a.make_snapshot(applied, node.sm.snapshot())
    assert (snap.meta.index, snap.meta.term) == (applied, a.term)
    assert snap.meta.conf_state == ConfState(("a", "b", "c"), ("d",))
    node.storage.create_snapshot(snap)
    node.storage.compact(applied)
    assert node.storage.first_index() == applied + 1
    before = node.sm.hash
    c.crash("a")
    c.restart("a")  # restores the state machine and the conf state from the snapshot
    assert c.nodes["a"].sm.hash == before and c.core("a").learners == ("d",)
    c.tick(40)
    lead = c.leader()
    assert lead is not None
    c.propose(lead, b"after")
    c.tick(2)
    assert len({c.nodes[n].sm.hash for n in "abcd"}) == 1
    ok(c)


# ----------------------------------------------------------------------------- membership
def test_learner_catches_up_before_promotion() -> None:
    c = Cluster(("a", "b", "c"), snapshot_every=5)
    c.elect("a")
    for i in range(12):
        c.propose("a", b"v%d" % i)
    c.add_learner("a", "d")
    c.tick(2)
    assert c.core("a").learners == ("d",) and c.core("d").learners == ("d",)
    assert c.nodes["d"].sm.hash == c.nodes["a"].sm.hash
    c.isolate("d")
    c.propose("a", b"more")
    with pytest.raises(ProposalDropped):
        c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, "d"))
    c.heal()
    c.tick(2)
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, "d"))
    c.stabilize()
    assert c.core("a").voters == ("a", "b", "c", "d") and c.core("a").learners == ()
    c.crash("a")  # 3 of the 4 voters remain: still a quorum
    c.tick(60)
    assert c.leader() in ("b", "c", "d")
    ok(c)


def test_conf_change_context_reaches_every_member_and_the_learner_it_adds() -> None:
    """The opaque context of a conf change (the driver's member addresses) is replicated
    with the entry: every member, the added learner included, applies the same bytes."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.add_node("d")
    ctx = b'{"raft_addr": "127.0.0.1:9004"}'
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d", ctx))
    c.stabilize()
    c.tick(2)
    for nid in "abcd":
        applied = [
            codec.decode_conf_change(e.data)
            for e in c.nodes[nid].storage.entries(2, c.nodes[nid].storage.last_index() + 1, 1 << 30)
            if e.type == EntryType.CONF_CHANGE
        ]
        assert applied == [ConfChange(ConfChangeType.ADD_LEARNER, "d", ctx)], nid
        assert c.core(nid).learners == ("d",)
    ok(c)


def test_only_one_conf_change_at_a_time() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("a")  # the first change cannot commit
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    with pytest.raises(ProposalDropped):
        c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))


def test_removing_a_follower_shrinks_the_quorum() -> None:
    c = Cluster(("a", "b", "c", "d"))
    c.elect("a")
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "d"))
    c.stabilize()
    assert all(c.core(n).voters == ("a", "b", "c") for n in "abc")
    assert "d" not in c.core("a").prs
    c.crash("c")
    c.crash("d")
    idx = c.propose("a", b"x")  # a + b: 2 of 3 voters now (it would be 2 of 4 before)
    assert c.core("a").log.committed >= idx
    ok(c)


def test_a_learner_never_campaigns_and_cannot_be_transfer_target() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.add_learner("a", "d")
    c.tick(2)
    term = c.core("a").term
    c.isolate("d")
    c.tick(60, nodes=["d"])
    assert (c.core("d").role, c.core("d").term) == (Role.FOLLOWER, term)
    c.core("d").step(Message(MT.TIMEOUT_NOW, to="d", frm="a", term=term))
    assert c.core("d").role == Role.FOLLOWER
    with pytest.raises(ProposalDropped):
        c.core("a").transfer_leadership("d")


def test_removing_the_leader() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "a"))
    c.stabilize()
    assert c.core("a").role == Role.FOLLOWER and c.nodes["a"].removed
    c.crash("a")  # the driver shuts a removed node down
    c.tick(60)
    new = c.leader()
    assert new in ("b", "c") and c.core(new).voters == ("b", "c")
    c.propose(new, b"after")
    assert c.core(new).log.committed == c.core(new).log.last_index()
    ok(c)


# ---------------------------------------------------------------------- leadership transfer
def test_leadership_transfer_catches_target_up_then_timeout_now() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    term = c.core("a").term
    c.filters.append(lambda m: not (m.type == MT.APP and m.to == "c"))
    for i in range(5):
        c.propose("a", b"v%d" % i)
    c.heal()
    c.delivered.clear()
    c.core("a").transfer_leadership("c")
    with pytest.raises(ProposalDropped):
        c.core("a").propose(b"during transfer")
    c.stabilize()
    assert any(m.type == MT.TIMEOUT_NOW and m.to == "c" for m in c.delivered)
    assert c.leader() == "c" and c.core("c").term == term + 1
    assert c.core("a").role == Role.FOLLOWER
    ok(c)


def test_transfer_aborts_after_an_election_timeout() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("c")
    c.core("a").transfer_leadership("c")
    c.tick(12, nodes=["a", "b"])
    assert c.core("a").role == Role.LEADER and c.core("a").lead_transferee == ""
    c.propose("a", b"ok again")


# ------------------------------------------------------------------------------ ReadIndex
def test_read_index_on_leader_waits_for_heartbeat_quorum() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.propose("a", b"w")
    c.core("a").read_index(b"r1")
    c.stabilize()
    ((node, rs),) = c.checker.read_log
    assert node == "a" and rs.context == b"r1" and rs.index == c.core("a").log.committed


def test_read_index_from_follower_is_forwarded() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.propose("a", b"w")
    c.core("b").read_index(b"r2")
    c.stabilize()
    ((node, rs),) = c.checker.read_log
    assert node == "b" and rs.index == c.core("a").log.committed


def test_isolated_leader_serves_no_read() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("a")
    c.core("a").read_index(b"r3")
    c.stabilize()
    assert c.checker.read_log == []


def test_new_leader_serves_reads_only_after_committing_in_its_term() -> None:
    c = Cluster(("a", "b", "c"))
    c.filters.append(lambda m: not (m.type == MT.APP))
    c.elect("a")
    c.core("a").read_index(b"r4")
    c.stabilize()
    assert c.checker.read_log == []  # noop of the term not committed yet
    c.heal()
    c.tick(2)
    ((_, rs),) = c.checker.read_log
    assert rs.index == c.core("a").log.committed and rs.context == b"r4"


# ---------------------------------------------------------------------- Ready contract
def contract_breaches(node: SimNode, msgs: list[Message]) -> list[str]:
    """Messages a node sends after running a Ready must not depend on state that is not
    durable yet: its term and vote, the entries it acknowledges or replicates."""
    st = node.storage
    hs = st.hard_state
    out: list[str] = []
    for m in msgs:
        kind = f"{node.id}: {m.type.name} to {m.to} in term {m.term}"
        if m.type in (MT.PRE_VOTE, MT.PRE_VOTE_RESP):
            continue  # pre-votes are for a term nobody has entered
        if m.term > hs.term:
            out.append(f"{kind} but persisted term {hs.term}")
        elif m.term == hs.term:
            if m.type == MT.VOTE and hs.vote != m.frm:
                out.append(f"{kind} but persisted vote {hs.vote!r}")
            if m.type == MT.VOTE_RESP and not m.reject and hs.vote != m.to:
                out.append(f"{kind} grants a vote but persisted vote {hs.vote!r}")
            if m.type == MT.APP_RESP and not m.reject and m.index > st.last_index():
                out.append(f"{kind} acks {m.index} but persisted last {st.last_index()}")
        if m.type == MT.APP and m.entries:
            last = m.entries[-1]
            if last.index > st.last_index() or (
                last.index >= st.first_index() and st.term(last.index) != last.term
            ):
                out.append(f"{kind} replicates {last.index}@{last.term} not persisted")
    return out


def test_ready_contract_holds_in_simulated_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hard state and entries are durable before any message that depends on them is
    sent, through elections, crashes, snapshots and membership changes."""
    breaches: list[str] = []
    checked: dict[MessageType, int] = {}
    handle_ready = SimNode.handle_ready

    def handle_and_check(self: SimNode) -> list[Message]:
        msgs = handle_ready(self)
        breaches.extend(contract_breaches(self, msgs))
        for m in msgs:
            checked[m.type] = checked.get(m.type, 0) + 1
        return msgs

    monkeypatch.setattr(SimNode, "handle_ready", handle_and_check)
    for seed in range(3):
        assert run_seed(seed, SimOptions(nodes=5, steps=2000)).violations == []
    assert breaches == []
    assert all(checked.get(t, 0) > 20 for t in (MT.VOTE, MT.VOTE_RESP, MT.APP, MT.APP_RESP))


def test_ready_contract_check_catches_an_unpersisted_vote() -> None:
    for bugs, broken in ((frozenset(), False), (frozenset({"no-persist-vote"}), True)):
        c = Cluster(("a", "b", "c"), pre_vote=False, bugs=bugs)
        c.core("b").step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
        node = c.nodes["b"]
        assert bool(contract_breaches(node, node.handle_ready())) == broken
