"""Unit tests of the building blocks: storage, log, progress, quorum, config."""

from __future__ import annotations

import random

import pytest

from doq.raft import (
    CompactedError,
    ConfState,
    Entry,
    MemoryStorage,
    RaftConfig,
    RaftCore,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)
from doq.raft.log import RaftLog
from doq.raft.progress import Inflights, Progress, ProgressState, quorum_index, vote_result
from tools.sim.harness import Cluster


def ents(*terms: int, start: int = 2) -> list[Entry]:
    return [Entry(t, start + i, data=b"%d" % i) for i, t in enumerate(terms)]


def test_memory_storage_append_truncates_conflicts_and_compacts() -> None:
    st = MemoryStorage(voters=("a",))
    st.append(ents(1, 1, 2))
    assert (st.first_index(), st.last_index()) == (2, 4)
    st.append([Entry(3, 3)])  # conflicts at 3: drops 3 and 4
    assert st.last_index() == 3 and st.term(3) == 3
    with pytest.raises(UnavailableError):
        st.term(4)
    st.create_snapshot(Snapshot(SnapshotMeta(2, 1, ConfState(("a",))), b"s"))
    st.compact(2)
    assert st.first_index() == 3 and st.term(2) == 1
    with pytest.raises(CompactedError):
        st.entries(2, 3, 100)
    with pytest.raises(ValueError):
        st.compact(3)  # beyond the snapshot


def test_entries_respect_max_bytes_but_return_at_least_one() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i, data=b"x" * 100) for i in range(2, 12)])
    assert len(st.entries(2, 12, 1)) == 1
    assert len(st.entries(2, 12, 3 * 124)) == 3


def test_log_find_conflict_by_term_skips_whole_terms() -> None:
    st = MemoryStorage(voters=("a",))
    st.append(ents(1, 1, 3, 3, 3, 5, 5))  # indexes 2..8
    log = RaftLog(st, 1 << 20)
    assert log.find_conflict_by_term(8, 4) == (6, 3)
    assert log.find_conflict_by_term(8, 5) == (8, 5)
    assert log.find_conflict_by_term(8, 0) == (0, 0)


def test_log_unstable_entries_become_stable_only_if_unchanged() -> None:
    st = MemoryStorage(voters=("a",))
    log = RaftLog(st, 1 << 20)
    log.append(ents(2, 2))
    log.stable_to(3, 9)  # wrong term: meanwhile replaced, keep unstable
    assert len(log.unstable.entries) == 2
    st.append(ents(2, 2))
    log.stable_to(3, 2)
    assert log.unstable.entries == [] and log.last_index() == 3


def test_quorum_and_votes() -> None:
    assert quorum_index([5, 4, 3, 2, 1]) == 3
    assert quorum_index([7, 1, 7, 1]) == 1
    voters = ("a", "b", "c")
    assert vote_result(voters, {"a": True}) is None
    assert vote_result(voters, {"a": True, "b": True}) is True
    assert vote_result(voters, {"a": True, "b": False, "c": False}) is False
    # four voters need three: two refusals lose the election before the last answer
    assert vote_result(("a", "b", "c", "d"), {"a": True, "b": False, "c": False}) is False


def test_progress_flow_control() -> None:
    pr = Progress(10, max_inflight=2, is_learner=False)
    assert pr.state == ProgressState.PROBE and not pr.is_paused()
    pr.probe_sent = True
    assert pr.is_paused()
    assert pr.maybe_update(9) and pr.match == 9 and not pr.probe_sent
    pr.become_replicate()
    pr.inflights.add(10)
    pr.inflights.add(11)
    assert pr.is_paused()
    pr.inflights.free_le(10)
    assert not pr.is_paused()
    assert not pr.maybe_decr_to(8, 0)  # stale rejection
    assert pr.maybe_decr_to(12, 0) and pr.next == 10


def test_inflights_free_first_one() -> None:
    inf = Inflights(2)
    inf.add(3)
    inf.add(4)
    assert inf.full()
    inf.free_first_one()
    assert len(inf) == 1


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        RaftConfig(id="")
    with pytest.raises(ValueError):
        RaftConfig(id="a", election_tick=1, heartbeat_tick=1)
    with pytest.raises(ValueError):
        RaftConfig(id="a", bugs=frozenset({"nope"}))
    for field in ("max_inflight_msgs", "max_entries_per_msg"):  # a leader must send something
        for bad in (0, -1):
            with pytest.raises(ValueError, match="must be positive"):
                RaftConfig(id="a", **{field: bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^snapshot_chunk_bytes must be positive$"):
        RaftConfig(id="a", snapshot_chunk_bytes=0)
    assert RaftConfig(id="a", snapshot_chunk_bytes=1).snapshot_chunk_bytes == 1  # one byte a chunk


def test_election_timeout_comes_from_the_injected_rng() -> None:
    def timeouts(seed: int) -> list[int]:
        core = RaftCore(RaftConfig(id="a"), MemoryStorage(voters=("a", "b", "c")),
                        random.Random(seed))
        out = []
        for _ in range(5):
            core._reset(core.term)
            out.append(core.randomized_election_timeout)
        return out

    assert timeouts(1) == timeouts(1)
    assert all(10 <= t < 20 for t in timeouts(2))
    assert len({tuple(timeouts(s)) for s in range(5)}) > 1


def test_ready_twice_without_advance_is_refused() -> None:
    core = RaftCore(RaftConfig(id="a"), MemoryStorage(voters=("a",)), random.Random(0))
    core.campaign()
    core.ready()
    with pytest.raises(Exception, match="advance"):
        core.ready()


def test_single_node_cluster_commits_alone() -> None:
    c = Cluster(("a",))
    c.elect("a")
    idx = c.propose("a", b"solo")
    assert c.core("a").log.committed == idx == c.nodes["a"].sm.index
    c.core("a").read_index(b"r")
    c.stabilize()
    assert [rs.index for _, rs in c.checker.read_log] == [idx]


def test_unpersisted_entries_are_lost_in_a_crash() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.core("a").propose(b"never persisted")
    c.crash("a")  # before its Ready ran
    c.restart("a")
    assert c.log_data("a") == [] and c.core("a").log.last_index() == 2


def test_learner_is_not_counted_for_commit() -> None:
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    c.add_learner("a", "d")
    c.tick(2)
    c.partition(["a", "d"], ["b", "c"])
    idx = c.core("a").propose(b"x")
    c.stabilize()
    assert c.core("a").prs["d"].match >= idx  # the learner has it...
    assert c.core("a").log.committed < idx  # ...but it does not count
    assert c.checker.violations == []
