"""Edges of the log's unstable part, the in-memory storage and the errors' messages."""

from __future__ import annotations

import pytest

from doq.raft import (
    CompactedError,
    ConfState,
    Entry,
    InvariantError,
    MemoryStorage,
    NotLeader,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)
from doq.raft.log import RaftLog, Unstable


def snap(index: int, term: int = 1, data: bytes = b"") -> Snapshot:
    return Snapshot(SnapshotMeta(index, term, ConfState(("a",))), data)


def test_a_snapshot_stays_unstable_until_that_very_index_is_reported_stable() -> None:
    u = Unstable(offset=1)
    u.stable_snap_to(5)  # nothing unstable: nothing happens
    assert u.snapshot is None
    u.restore(snap(10))
    u.stable_snap_to(9)
    assert u.snapshot == snap(10)
    u.stable_snap_to(10)
    assert u.snapshot is None


def test_a_second_snapshot_at_the_same_index_is_ignored() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    st.create_snapshot(snap(5, data=b"first"))
    st.create_snapshot(snap(5, data=b"second"))
    assert st.snapshot().data == b"first"
    st.create_snapshot(snap(6, data=b"later"))
    assert st.snapshot().data == b"later"


def test_not_leader_says_who_the_leader_is() -> None:
    assert str(NotLeader("node-2")) == "not leader (leader hint: node-2)"
    assert NotLeader(None).leader_hint is None


def test_storage_refusals_say_which_indexes() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    with pytest.raises(UnavailableError, match="^snapshot 9 beyond last 7$"):
        st.create_snapshot(snap(9))
    st.create_snapshot(snap(4))
    with pytest.raises(ValueError, match="^compact 5 beyond snapshot 4$"):
        st.compact(5)


def test_reading_compacted_entries_says_where_the_log_starts() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    st.create_snapshot(snap(4))
    st.compact(4)
    with pytest.raises(CompactedError, match=r"^index 3 compacted \(snapshot at 4\)$"):
        st.entries(3, 6, 1 << 20)


def test_reading_beyond_the_last_entry_says_which_index() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    assert [e.index for e in st.entries(6, 8, 1 << 20)] == [6, 7]
    with pytest.raises(UnavailableError, match="^index 8 beyond last 7$"):
        st.entries(3, 9, 1 << 20)


def test_entries_leave_the_unstable_part_once_stable_with_their_term() -> None:
    u = Unstable(offset=5)
    u.truncate_and_append([Entry(1, 5), Entry(1, 6), Entry(2, 7), Entry(2, 8)])
    u.stable_to(6, 2)  # another term at 6: replaced meanwhile, nothing leaves
    assert (u.offset, [e.index for e in u.entries]) == (5, [5, 6, 7, 8])
    u.stable_to(5, 1)
    assert (u.offset, [e.index for e in u.entries]) == (6, [6, 7, 8])
    u.stable_to(7, 2)
    assert (u.offset, [e.index for e in u.entries]) == (8, [8])


def test_applied_moves_within_applied_and_committed_only() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    log = RaftLog(st, 1 << 20)
    log.committed = 5
    assert log.applied == 1
    log.applied_to(0)  # nothing applied yet: no change
    log.applied_to(3)
    log.applied_to(3)  # again: allowed
    assert log.applied == 3
    with pytest.raises(InvariantError, match=r"^applied 2 not in \[3, 5\]$"):
        log.applied_to(2)
    with pytest.raises(InvariantError, match=r"^applied 6 not in \[3, 5\]$"):
        log.applied_to(6)
    assert log.applied == 3


def test_a_slice_of_nothing_is_empty_and_out_of_range_slices_say_why() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    st.create_snapshot(snap(4))
    st.compact(4)
    log = RaftLog(st, 1 << 20)
    assert log.slice(3, 3, 1 << 20) == [] and log.slice(6, 6, 1 << 20) == []
    assert [e.index for e in log.slice(5, 8, 1 << 20)] == [5, 6, 7]
    with pytest.raises(CompactedError, match="^index 3 compacted$"):
        log.slice(3, 6, 1 << 20)
    with pytest.raises(InvariantError, match=r"^slice \[5,9\) beyond last 7$"):
        log.slice(5, 9, 1 << 20)


def test_a_leader_commits_by_counting_replicas_only_an_entry_of_its_term() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, 2), Entry(1, 3), Entry(2, 4)])
    log = RaftLog(st, 1 << 20)
    assert not log.maybe_commit(3, 2)  # term 1 entry, leader of term 2
    assert log.committed == 1
    assert log.maybe_commit(4, 2) and log.committed == 4


def test_a_log_holds_no_entry_outside_its_range_whatever_the_term_asked() -> None:
    """The paper's check of a MsgApp's (prevLogIndex, prevLogTerm): the log contains an
    entry there with that term. Outside the range the log holds (compacted below its
    snapshot, or beyond its end) there is no entry, even for the term 0 that out-of-range
    reads return."""
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    st.create_snapshot(snap(4))
    st.compact(4)
    log = RaftLog(st, 1 << 20)
    assert log.match_term(4, 1) and log.match_term(7, 1)  # the snapshot's index, the last
    for index in (2, 3, 8, 9):  # compacted below the snapshot; beyond the last entry
        assert not log.match_term(index, 0)
        assert not log.match_term(index, 1)
    assert log.maybe_append(8, 0, 0, (Entry(2, 9),)) is None  # a follower refuses it
    assert log.last_index() == 7


def test_an_append_never_overwrites_a_committed_entry() -> None:
    """A committed entry is never replaced (the paper's Leader Completeness): an append
    that starts at or below the commit index is an invariant error naming both indexes,
    and the log is unchanged."""
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    log = RaftLog(st, 1 << 20)
    log.committed = 5
    for index in (5, 3):
        with pytest.raises(InvariantError, match=f"^append at {index} below commit 5$"):
            log.append([Entry(2, index)])
    assert [(e.term, e.index) for e in log.slice(2, 8, 1 << 20)] == [(1, i) for i in range(2, 8)]
    assert log.append([Entry(2, 6)]) == 6  # above the commit: replaces the uncommitted tail
    assert log.term(6) == 2 and log.last_index() == 6


def test_a_read_across_stable_and_unstable_entries_returns_each_once_in_order() -> None:
    """A leader sends a follower entries it has persisted and entries it has not yet
    persisted in one message: the read spans the storage and the unstable part."""
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 6)])
    log = RaftLog(st, 1 << 20)
    log.append([Entry(2, 6), Entry(2, 7), Entry(2, 8)])  # not yet stable
    assert [e.index for e in log.slice(3, 9, 1 << 20)] == [3, 4, 5, 6, 7, 8]
    assert [e.index for e in log.entries_from(5, 1 << 20, 100)] == [5, 6, 7, 8]
    assert [e.index for e in log.slice(2, 7, 1 << 20)] == [2, 3, 4, 5, 6]


def test_a_commit_beyond_the_last_entry_is_an_invariant_error_naming_both() -> None:
    st = MemoryStorage(voters=("a",))
    st.append([Entry(1, i) for i in range(2, 8)])
    log = RaftLog(st, 1 << 20)
    with pytest.raises(InvariantError, match="^commit 8 beyond last 7$"):
        log.commit_to(8)
    assert log.committed == 1


def test_an_append_reaching_into_the_compacted_part_keeps_only_the_entries_after_it() -> None:
    """A follower may be sent entries it already compacted into a snapshot (the leader's
    view of it was stale): they are skipped and the rest is appended in place."""
    s = MemoryStorage(voters=("a",))
    s.append([Entry(1, 2), Entry(1, 3), Entry(1, 4)])
    s.create_snapshot(snap(3))
    s.compact(3)
    s.append([Entry(1, 2), Entry(1, 3), Entry(1, 4), Entry(2, 5), Entry(2, 6)])
    assert (s.first_index(), s.last_index()) == (4, 6)
    assert s.entries(4, 7, 1 << 20) == [Entry(1, 4), Entry(2, 5), Entry(2, 6)]


def test_a_log_restored_from_a_snapshot_starts_right_after_it_before_it_is_stored() -> None:
    """Between a follower's receiving a snapshot and its Ready storing it, the log already
    is the snapshot: its first entry would be the one after, its last is the snapshot's."""
    log = RaftLog(MemoryStorage(voters=("a",)), 1 << 20)
    log.restore(snap(10, term=3))
    assert (log.first_index(), log.last_index(), log.last_term()) == (11, 10, 3)
