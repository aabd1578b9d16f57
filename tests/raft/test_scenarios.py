"""Scenario tests: one per rule of the Raft paper's figure 2 and per feature, plus the
classic failures. Every Cluster also runs the simulator's invariant checker."""

from __future__ import annotations

import pytest

from doq.raft import (
    ConfChange,
    ConfChangeType,
    HardState,
    Message,
    MessageType,
    NotLeader,
    ProposalDropped,
    Role,
)
from doq.sim.harness import Cluster

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


def test_no_persist_vote_bug_forgets_the_vote_after_a_restart() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False, bugs=frozenset({"no-persist-vote"}))
    c.core("b").step(Message(MT.VOTE, to="b", frm="a", term=5, index=1, log_term=1))
    c.flush()
    c.crash("b")
    c.restart("b")
    b = c.core("b")
    b.step(Message(MT.VOTE, to="b", frm="c", term=5, index=1, log_term=1))
    assert [m.reject for m in b.ready().messages] == [False]  # a second vote in term 5


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


def test_higher_term_in_any_message_turns_leader_into_follower() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    old = a.term
    a.step(Message(MT.APP_RESP, to="a", frm="b", term=old + 3))
    assert (a.role, a.term, a.lead) == (Role.FOLLOWER, old + 3, "")


def test_initial_leader_appends_empty_entry_of_its_term() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    last = a.log.last_index()
    assert a.log.term(last) == a.term and a.log.committed == last
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


# ----------------------------------------------------------------------------- membership
def test_learner_catches_up_before_promotion() -> None:
    c = Cluster(("a", "b", "c"), snapshot_every=5)
    c.elect("a")
    for i in range(12):
        c.propose("a", b"v%d" % i)
    c.add_node("d")
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    c.stabilize()
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


def test_only_one_conf_change_at_a_time() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.isolate("a")  # the first change cannot commit
    c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    with pytest.raises(ProposalDropped):
        c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))


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
