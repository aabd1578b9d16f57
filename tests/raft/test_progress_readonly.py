"""Units of the leader's bookkeeping: a follower's Progress and the pending ReadIndex requests."""

from __future__ import annotations

from doq.raft import MessageType
from doq.raft.progress import Progress, ProgressState, has_quorum
from doq.raft.readonly import ReadOnly
from tools.sim.harness import Cluster


def test_a_failed_snapshot_probes_again_from_match_plus_one_even_from_nothing() -> None:
    pr = Progress(next_index=5, max_inflight=4, is_learner=False)
    assert pr.match == 0
    pr.become_snapshot(10)
    pr.snapshot_failed()
    assert (pr.state, pr.pending_snapshot, pr.next) == (ProgressState.PROBE, 0, 1)


def test_advance_pops_every_read_up_to_the_acknowledged_one_and_keeps_the_later_ones() -> None:
    ro = ReadOnly()
    for i, ctx in enumerate((b"r1", b"r2", b"r3")):
        assert ro.add_request(10 + i, ctx, "b")
    assert not ro.add_request(99, b"r2", "c")  # a context is pending once
    assert [(s.index, s.context) for s in ro.advance(b"r2")] == [(10, b"r1"), (11, b"r2")]
    assert len(ro) == 1 and ro.last_pending_context() == b"r3"
    assert ro.advance(b"r2") == []
    assert [s.context for s in ro.advance(b"r3")] == [b"r3"] and len(ro) == 0


def test_the_leader_answers_a_followers_read_index_as_itself() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.core("b").read_index(b"ctx-1")
    c.stabilize()
    answers = [m for m in c.delivered if m.type == MessageType.READ_INDEX_RESP]
    assert [(m.frm, m.to, m.context) for m in answers] == [("a", "b", b"ctx-1")]


def test_probing_after_a_snapshot_starts_past_the_snapshot_or_the_match() -> None:
    pr = Progress(next_index=5, max_inflight=4, is_learner=False)
    pr.match = 3
    pr.become_snapshot(10)
    pr.become_probe()  # the snapshot (10) is on its way: probe after it
    assert (pr.state, pr.next) == (ProgressState.PROBE, 11)
    pr.match = 12
    pr.become_snapshot(10)
    pr.become_probe()  # already matched beyond the snapshot
    assert pr.next == 13
    pr.become_replicate()
    pr.next = 20
    pr.become_probe()  # from replicating: right after the match
    assert (pr.state, pr.next) == (ProgressState.PROBE, 13)


def test_a_rejection_moves_next_back_to_the_hint_but_never_below_the_match() -> None:
    pr = Progress(next_index=8, max_inflight=4, is_learner=False)
    pr.match, pr.probe_sent = 2, True
    assert not pr.maybe_decr_to(5, 3)  # stale: the probe in flight was for 7
    assert (pr.next, pr.probe_sent) == (8, True)
    assert pr.maybe_decr_to(7, 3)  # the follower's log ends at 3: try 4
    assert (pr.next, pr.probe_sent) == (4, False)
    pr.next, pr.match = 8, 5
    assert pr.maybe_decr_to(7, 1)  # a hint below the match: after the match
    assert pr.next == 6


def test_a_rejection_at_or_below_the_match_of_a_replicating_follower_is_stale() -> None:
    pr = Progress(next_index=1, max_inflight=4, is_learner=False)
    pr.match = 5
    pr.become_replicate()
    pr.next = 9
    assert not pr.maybe_decr_to(5, 0)
    assert pr.next == 9
    assert pr.maybe_decr_to(6, 0)
    assert pr.next == 6


def test_a_quorum_is_a_strict_majority_of_the_voters() -> None:
    four, five = ("a", "b", "c", "d"), ("a", "b", "c", "d", "e")
    assert not has_quorum(four, {"a", "b"}) and has_quorum(four, {"a", "b", "c"})
    assert not has_quorum(five, {"a", "b"}) and has_quorum(five, {"a", "b", "c"})
    assert not has_quorum(five, {"a", "b", "x", "y"})  # only voters count


def test_no_pending_read_has_the_empty_context() -> None:
    ro = ReadOnly()
    assert ro.last_pending_context() == b""
    ro.add_request(1, b"r1", "b")
    assert ro.last_pending_context() == b"r1"


def test_a_snapshot_not_acknowledged_within_an_election_timeout_is_given_up() -> None:
    """A leader waits one election timeout (election_tick ticks) for a follower to report
    a snapshot, then probes it again; not a tick earlier."""
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    a = c.core("a")
    pr = a.prs["b"]
    pr.become_snapshot(a.log.last_index())
    for _ in range(a.cfg.election_tick - 1):
        a.tick()
        assert pr.state == ProgressState.SNAPSHOT
    a.tick()
    assert pr.state == ProgressState.PROBE
