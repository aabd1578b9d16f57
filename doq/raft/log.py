"""The Raft log as the core sees it: stable entries (in storage) + unstable ones.

Like etcd's ``raftLog``/``unstable``: new entries (and a snapshot received from the
leader) live in :class:`Unstable` until the driver reports them persisted through
``RaftCore.advance``.
"""

from __future__ import annotations

from doq.raft.storage import RaftLogStorage, limit_size
from doq.raft.types import (
    CompactedError,
    Entry,
    EntryType,
    InvariantError,
    Snapshot,
    UnavailableError,
)


class Unstable:
    """Entries not yet persisted, starting at ``offset``; maybe a snapshot before them."""

    __slots__ = ("snapshot", "entries", "offset")

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset

    def maybe_first_index(self) -> int | None:
        return self.snapshot.meta.index + 1 if self.snapshot else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        return self.snapshot.meta.index if self.snapshot else None

    def maybe_term(self, i: int) -> int | None:
        if i < self.offset:
            if self.snapshot and self.snapshot.meta.index == i:
                return self.snapshot.meta.term
            return None
        last = self.maybe_last_index()
        if last is None or i > last:
            return None
        return self.entries[i - self.offset].term

    def stable_to(self, index: int, term: int) -> None:
        t = self.maybe_term(index)
        if t is None or t != term or index < self.offset:
            return  # entries were replaced meanwhile; they will be handed out again
        del self.entries[: index + 1 - self.offset]
        self.offset = index + 1

    def stable_snap_to(self, index: int) -> None:
        if self.snapshot and self.snapshot.meta.index == index:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.meta.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry]) -> None:
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            self.offset = after
            self.entries = list(ents)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(ents)


class RaftLog:
    """Log view with ``committed`` and ``applied`` cursors.

    Invariant: ``applied <= committed <= last_index()``.
    """

    def __init__(self, storage: RaftLogStorage, max_committed_bytes: int) -> None:
        self.storage = storage
        self.unstable = Unstable(storage.last_index() + 1)
        first = storage.first_index()
        self.committed = first - 1
        self.applied = first - 1
        self.max_committed_bytes = max_committed_bytes

    # -- indexes and terms ---------------------------------------------------------
    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, i: int) -> int:
        """Term at ``i``; 0 if out of range (compacted or beyond the end)."""
        t = self.unstable.maybe_term(i)
        if t is not None:
            return t
        if i < self.first_index() - 1 or i > self.last_index():
            return 0
        try:
            return self.storage.term(i)
        except (CompactedError, UnavailableError):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, i: int, term: int) -> bool:
        if i < self.first_index() - 1 or i > self.last_index():
            return False
        return self.term(i) == term

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """Is a candidate log ending at (last_index, term) at least as up to date as ours?"""
        lt = self.last_term()
        return term > lt or (term == lt and last_index >= self.last_index())

    # -- appending -----------------------------------------------------------------
    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        if ents[0].index - 1 < self.committed:
            raise InvariantError(f"append at {ents[0].index} below commit {self.committed}")
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    def find_conflict(self, ents: tuple[Entry, ...] | list[Entry]) -> int:
        """Index of the first entry whose term differs from ours (or which is new); 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest ``i <= index`` whose term is ``<= term``, with that term (conflict hint)."""
        while index > 0:
            t = self.term(index)  # 0 once compacted, which ends the walk
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def maybe_append(
        self,
        prev_index: int,
        prev_term: int,
        committed: int,
        ents: tuple[Entry, ...],
        skip_prev_check: bool = False,
    ) -> int | None:
        """Follower append: None if our log does not contain (prev_index, prev_term),
        else the last index of the leader's entries, after truncating any conflict."""
        if skip_prev_check:  # the deliberate bug: only require prev_index to exist
            if prev_index > self.last_index():
                return None
        elif not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(ents)
        ci = self.find_conflict(ents)
        if ci:
            if ci <= self.committed:
                raise InvariantError(f"conflict at {ci} <= committed {self.committed}")
            self.append(list(ents[ci - prev_index - 1 :]))
        self.commit_to(min(committed, last_new))
        return last_new

    # -- cursors -------------------------------------------------------------------
    def commit_to(self, i: int) -> None:
        if i > self.committed:
            if i > self.last_index():
                raise InvariantError(f"commit {i} beyond last {self.last_index()}")
            self.committed = i

    def maybe_commit(self, max_index: int, term: int, any_term: bool = False) -> bool:
        """Leader commit: only an entry of the current ``term`` (unless ``any_term``,
        the deliberate commit-old-term bug) may be committed by counting replicas."""
        if max_index > self.committed and (any_term or self.term(max_index) == term):
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if i > self.committed or i < self.applied:
            raise InvariantError(f"applied {i} not in [{self.applied}, {self.committed}]")
        self.applied = i

    def stable_to(self, i: int, t: int) -> None:
        self.unstable.stable_to(i, t)

    def stable_snap_to(self, i: int) -> None:
        self.unstable.stable_snap_to(i)

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.meta.index
        self.unstable.restore(snap)

    # -- reading -------------------------------------------------------------------
    def has_conf_change(self, lo: int, hi: int) -> bool:
        """Whether an entry in ``[lo, hi)`` is a configuration change (as ``slice`` would
        tell), without reading the stored entries' data. Raises CompactedError if ``lo``
        is compacted."""
        if lo >= hi:
            return False
        if lo < self.first_index():
            raise CompactedError(f"index {lo} compacted")
        if hi > self.last_index() + 1:
            raise InvariantError(f"range [{lo},{hi}) beyond last {self.last_index()}")
        uoff = self.unstable.offset
        if lo < uoff and self.storage.has_conf_change(lo, min(hi, uoff)):
            return True
        return hi > uoff and any(e.type == EntryType.CONF_CHANGE
                                 for e in self.unstable.entries[max(lo, uoff) - uoff : hi - uoff])

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries in ``[lo, hi)`` limited by size. Raises CompactedError if ``lo`` is
        compacted."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise CompactedError(f"index {lo} compacted")
        if hi > self.last_index() + 1:
            raise InvariantError(f"slice [{lo},{hi}) beyond last {self.last_index()}")
        ents: list[Entry] = []
        uoff = self.unstable.offset
        if lo < uoff:
            ents = self.storage.entries(lo, min(hi, uoff), max_bytes)
            if len(ents) < min(hi, uoff) - lo:
                return ents  # hit the size limit inside storage
        if hi > uoff:
            u = self.unstable.entries[max(lo, uoff) - uoff : hi - uoff]
            ents = u if not ents else ents + u
        return limit_size(ents, max_bytes)

    def entries_from(self, lo: int, max_bytes: int, max_count: int) -> list[Entry]:
        hi = min(self.last_index() + 1, lo + max_count)
        return self.slice(lo, hi, max_bytes)

    def unstable_entries(self) -> list[Entry]:
        return list(self.unstable.entries)

    def has_next_committed(self) -> bool:
        return self.committed > max(self.applied, self.first_index() - 1) and not (
            self.unstable.snapshot
        )

    def next_committed(self) -> list[Entry]:
        if not self.has_next_committed():
            return []
        lo = max(self.applied + 1, self.first_index())
        return self.slice(lo, self.committed + 1, self.max_committed_bytes)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()
