"""Edges of the Raft core that the scenario tests pass through without pinning down: each
test here fails on a specific wrong variant of the code (found by mutation testing,
docs/testing.md)."""

from __future__ import annotations

import pytest

from doq.raft import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    Message,
    MessageType,
    ProgressState,
    ProposalDropped,
    Role,
    SnapshotMeta,
    codec,
)
from tools.sim.harness import Cluster

MT = MessageType


def test_a_campaign_starts_with_a_pre_vote_without_the_transfer_context() -> None:
    """`campaign()` is the election timer firing: with PreVote the node becomes a
    pre-candidate in the same term and asks for pre-votes with an empty context (only a
    leadership transfer skips the pre-vote and marks its requests)."""
    c = Cluster(("a", "b", "c"), pre_vote=True)
    a = c.core("a")
    term = a.term
    a.campaign()
    assert (a.role, a.term) == (Role.PRE_CANDIDATE, term)
    sent = a.ready().messages
    assert sorted(m.to for m in sent) == ["b", "c"]
    assert all(m.type == MT.PRE_VOTE and m.term == term + 1 and m.context == b"" for m in sent)


def test_snapshot_needed_for_a_follower_being_sent_one_even_if_silent_and_caught_up() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    pr = a.prs["b"]
    pr.state, pr.recent_active = ProgressState.SNAPSHOT, False
    assert pr.next >= a.log.first_index()
    assert a.snapshot_needed()


def test_snapshot_needed_only_for_a_follower_strictly_behind_the_first_index() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    first = a.log.first_index()
    pr = a.prs["b"]
    pr.state, pr.recent_active = ProgressState.PROBE, True
    pr.next = first  # the next entry it needs is still in the log
    assert not a.snapshot_needed()
    pr.next = first - 1
    assert a.snapshot_needed()
    pr.recent_active = False  # silent: no snapshot kept for it
    assert not a.snapshot_needed()


def test_a_message_of_an_unknown_type_is_refused_naming_the_type() -> None:
    good = bytearray(codec.encode_message(Message(MT.APP, to="b", frm="a", term=1)))
    good[1] = 0x7F  # the type varint: 127 is no MessageType
    with pytest.raises(codec.DecodeError, match="127"):
        codec.decode_message(bytes(good))


def test_is_leader_only_on_the_leader() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    assert c.core("a").is_leader()
    assert not c.core("b").is_leader() and not c.core("c").is_leader()


def test_conf_changes_move_a_node_between_learners_and_voters_and_out() -> None:
    """`apply_conf_change` directly (it is what the driver calls for a committed change):
    a learner promoted is a voter only; a removed learner is gone from both sets."""
    c = Cluster(("a", "b", "c"))
    a = c.core("a")
    assert a.apply_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d")) == ConfState(
        ("a", "b", "c"), ("d",))
    assert a.apply_conf_change(ConfChange(ConfChangeType.ADD_NODE, "d")) == ConfState(
        ("a", "b", "c", "d"), ())
    assert a.apply_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d")) == ConfState(
        ("a", "b", "c", "d"), ())  # a voter is never demoted by ADD_LEARNER
    a.apply_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))
    assert a.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "e")) == ConfState(
        ("a", "b", "c", "d"), ())
    assert a.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "d")) == ConfState(
        ("a", "b", "c"), ())


def test_a_leader_that_removes_itself_is_a_follower_without_a_leader() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    term = a.term
    a.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "a"))
    assert (a.role, a.term, a.lead) == (Role.FOLLOWER, term, NONE)
    assert a.soft_state().lead == NONE


def test_removing_the_transfer_target_cancels_the_transfer_removing_another_does_not() -> None:
    c = Cluster(("a", "b", "c", "d"))
    c.elect("a")
    a = c.core("a")
    a.transfer_leadership("c")  # TimeoutNow not delivered: the transfer is in progress
    assert a.lead_transferee == "c"
    a.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "b"))
    assert a.lead_transferee == "c"
    a.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, "c"))
    assert a.lead_transferee == NONE
    assert a.propose(b"x") > 0  # proposals are accepted again


def test_a_leader_accepts_a_conf_change_once_the_previous_one_is_applied() -> None:
    """One membership change at a time (the paper's single-server changes): refused while
    the previous one (or the leader's first entry) is unapplied, accepted as soon as it is."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    assert a.log.applied == a.log.last_index()  # the leader's empty entry is applied
    first = a.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    with pytest.raises(ProposalDropped, match="^a configuration change is still pending$"):
        a.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))
    c.stabilize()
    assert a.log.applied == first
    assert a.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e")) == first + 1


def test_adding_a_voter_that_is_already_one_is_refused_naming_it() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    with pytest.raises(ProposalDropped, match="^b is already a voter$"):
        c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, "b"))


def test_a_snapshot_chunk_of_an_unknown_snapshot_is_rejected_so_the_leader_starts_over() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    b = c.core("b")
    meta = SnapshotMeta(b.log.last_index() + 5, b.term, ConfState(("a", "b", "c")))
    b.step(Message(MessageType.SNAP, to="b", frm="a", term=b.term, snapshot=meta, data=b"x",
                   offset=10))  # a later chunk, its start lost
    sent = [m for m in b.ready().messages if m.type == MessageType.SNAP_RESP]
    assert [(m.to, m.reject) for m in sent] == [("a", True)]


def test_a_follower_that_holds_the_snapshots_entry_acknowledges_only_what_it_committed() -> None:
    """A snapshot whose last entry the follower already holds only moves its commit index:
    it acknowledges that index, not its entries after it, which the leader may not have."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    b = c.core("b")
    committed, term = b.log.committed, b.term
    b.log.append([Entry(term, committed + i) for i in range(1, 5)])  # received, not committed
    meta = SnapshotMeta(committed + 2, term, ConfState(("a", "b", "c")))
    b.step(Message(MessageType.SNAP, to="b", frm="a", term=term, snapshot=meta, data=b"s",
                   done=True))
    acks = [m for m in b.ready().messages if m.type == MessageType.APP_RESP]
    assert [(m.frm, m.to, m.index, m.reject) for m in acks] == [("b", "a", committed + 2, False)]
    assert b.log.committed == committed + 2 and b.log.last_index() == committed + 4


def test_a_leader_sends_heartbeats_every_heartbeat_tick_ticks() -> None:
    c = Cluster(("a", "b", "c"), heartbeat_tick=3, election_tick=30)
    c.elect("a")
    a = c.core("a")
    beat = a.cfg.heartbeat_tick
    rounds = []
    for t in range(1, 3 * beat + 1):
        before = len(c.delivered)
        c.tick(nodes=["a"])
        if any(m.type == MessageType.HEARTBEAT for m in c.delivered[before:]):
            rounds.append(t)
    assert rounds == [beat, 2 * beat, 3 * beat]


def test_a_proposal_during_a_leadership_transfer_is_dropped_saying_why() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    a.transfer_leadership("c")  # TimeoutNow not delivered: the transfer is in progress
    with pytest.raises(ProposalDropped, match="^leadership transfer in progress$"):
        a.propose(b"x")


def test_an_idle_cluster_has_no_ready() -> None:
    """Once every message is delivered and every Ready handled, no node has work: a driver
    waiting on `has_ready()` sleeps instead of spinning."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.propose("a", b"x")
    c.stabilize()
    assert [nid for nid in "abc" if c.core(nid).has_ready()] == []


def test_a_follower_forwards_a_read_index_sent_to_it_to_the_leader() -> None:
    """A peer that took this follower for the leader asks it for a read index: the follower
    forwards the request to the leader, which answers the peer."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    b = c.core("b")
    b.step(Message(MessageType.READ_INDEX, to="b", frm="c", term=b.term, context=b"ctx-2"))
    c.stabilize()
    answers = [m for m in c.delivered if m.type == MessageType.READ_INDEX_RESP]
    assert [(m.frm, m.to, m.context) for m in answers] == [("a", "c", b"ctx-2")]


def test_a_follower_answers_an_append_below_its_commit_with_its_commit_index() -> None:
    """An append that starts below what the follower already committed (a late or
    duplicated message) is answered at once with the follower's commit index, so the
    leader moves the follower's progress past everything it has committed."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.propose("a", b"x")
    c.propose("a", b"y")
    b = c.core("b")
    committed = b.log.committed
    assert committed >= 3
    b.step(Message(MT.APP, to="b", frm="a", term=b.term, index=1, log_term=b.log.term(1), commit=1))
    answers = [m for m in b.ready().messages if m.type == MT.APP_RESP]
    assert [(m.to, m.index, m.reject) for m in answers] == [("a", committed, False)]


def test_a_restarted_core_campaigns_only_once_its_committed_conf_changes_are_applied() -> None:
    """A core whose log holds committed entries past its applied index (a restart: every
    entry since the snapshot) does not campaign while one of them is a conf change, and
    does when none is; the check reads entry types (`has_conf_change`), not the entries."""
    import random
    from collections.abc import Callable

    from doq.raft import EntryType, HardState, MemoryStorage, RaftConfig, RaftCore, Snapshot

    class NoEntryReads(MemoryStorage):
        forbid = False

        def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
            assert not self.forbid, "the campaign's check read the entries"
            return super().entries(lo, hi, max_bytes)

    for conf_at in (None, 2, 4):
        st = NoEntryReads(("a",))
        st.apply_snapshot(Snapshot(SnapshotMeta(1, 1, ConfState(("a",)))))
        st.append([Entry(1, i, EntryType.CONF_CHANGE if i == conf_at else EntryType.NORMAL,
                         codec.encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, "b")) if i == conf_at else b"x")
                   for i in range(2, 5)])
        st.set_hard_state(HardState(1, "a", 4))
        core = RaftCore(RaftConfig(id="a"), st, random.Random(1))
        check = core._has_unapplied_conf_change  # noqa: SLF001

        def guarded(st: NoEntryReads = st, check: Callable[[], bool] = check) -> bool:
            st.forbid = True
            try:
                return check()
            finally:
                st.forbid = False

        core._has_unapplied_conf_change = guarded  # type: ignore[method-assign]  # noqa: SLF001
        core.campaign()
        assert (core.role == Role.LEADER) is (conf_at is None), conf_at


def test_a_core_started_at_the_applied_index_hands_out_only_the_entries_after_it() -> None:
    """`RaftConfig.applied` (etcd's Config.Applied): a restarted core whose application
    holds the entries up to `applied` hands out the committed entries after it, each once,
    and none before; without it, every committed entry after the snapshot again. An applied
    index beyond the commit index is refused (the application cannot hold what is not
    committed)."""
    import random

    from doq.raft import EntryType, HardState, InvariantError, MemoryStorage, RaftConfig, RaftCore

    def restarted(applied: int) -> RaftCore:
        st = MemoryStorage(("a",))
        st.append([Entry(1, i, EntryType.NORMAL, b"x%d" % i) for i in range(2, 11)])
        st.set_hard_state(HardState(1, "a", 8))
        return RaftCore(RaftConfig(id="a", applied=applied), st, random.Random(1))

    def handed_out(core: RaftCore) -> list[int]:
        out: list[int] = []
        while core.has_ready():
            rd = core.ready()
            out += [e.index for e in rd.committed_entries]
            core.advance(rd)
        return out

    assert handed_out(restarted(5)) == [6, 7, 8]
    assert handed_out(restarted(8)) == []
    assert handed_out(restarted(0)) == [2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(InvariantError):
        restarted(9)
    with pytest.raises(ValueError):
        RaftConfig(id="a", applied=-1)


def test_conf_state_changed_replays_to_the_same_membership() -> None:
    """`ConfState.changed`, the fold a restart uses for the conf changes up to its applied
    index: the changes already in a snapshot's conf state, applied again in order, give the
    same membership (a restart folds from the log's first entry, which may be before it)."""
    import itertools

    ops = [ConfChange(t, n) for t in ConfChangeType for n in ("b", "c")]
    for seq in itertools.product(ops, repeat=3):
        cs = ConfState(("a",))
        for cc in seq:
            cs = cs.changed(cc)
        again = cs
        for cc in seq:
            again = again.changed(cc)
        assert again == cs, seq
