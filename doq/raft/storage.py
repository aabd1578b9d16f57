"""The storage interface the core reads from, and an in-memory implementation.

The core only *reads* storage; the driver writes it while handling a Ready (append
entries, set hard state, apply a snapshot) and when the application compacts the log
(``create_snapshot`` + ``compact``). An LMDB-backed storage implements the same
:class:`RaftLogStorage` protocol.
"""

from __future__ import annotations

from typing import Protocol

from doq.raft.types import (
    CompactedError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)


class RaftLogStorage(Protocol):
    """Read side of durable Raft state, as the core sees it.

    Indexes: the log holds entries ``first_index() .. last_index()``; the entry at
    ``first_index() - 1`` is covered by ``snapshot()`` and only its term is known.
    """

    def initial_state(self) -> tuple[HardState, ConfState]:
        """Persisted hard state, and the conf state of the latest snapshot."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries in ``[lo, hi)``; at least one if the range is non-empty, then stops
        before exceeding ``max_bytes``. Raises CompactedError if ``lo < first_index()``."""
        ...

    def has_conf_change(self, lo: int, hi: int) -> bool:
        """Whether an entry in ``[lo, hi)`` is a configuration change (what a campaign
        checks), as ``entries(lo, hi, ...)`` would tell, without the entries' data.
        Raises CompactedError if ``lo < first_index()``."""
        ...

    def term(self, index: int) -> int:
        """Term of the entry at ``index`` (``first_index()-1`` allowed). Raises
        CompactedError below that and UnavailableError beyond ``last_index()``."""
        ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def snapshot(self) -> Snapshot:
        """The most recent snapshot (possibly empty at index 0), whose index is at least
        ``first_index() - 1`` (so the entries after it are still here). A storage that
        produces snapshot data on demand (the node's: the state is durable on its own)
        may raise ``SnapshotTemporarilyUnavailable`` until the data is ready; only a
        leader sending a snapshot asks for it."""
        ...


def limit_size(entries: list[Entry], max_bytes: int) -> list[Entry]:
    """The longest prefix within ``max_bytes``, but never fewer than one entry."""
    if not entries:
        return entries
    total = entries[0].size()
    n = 1
    while n < len(entries):
        total += entries[n].size()
        if total > max_bytes:
            break
        n += 1
    return entries[:n]


class MemoryStorage:
    """In-memory :class:`RaftLogStorage` (tests, simulator). Mutators mirror what a
    durable storage must offer the driver.

    ``self._ents[0]`` is a dummy entry holding the snapshot's index and term.
    """

    def __init__(self, voters: tuple[str, ...] = ()) -> None:
        """An empty storage. With ``voters``, bootstraps a new cluster: a snapshot at
        index 1, term 1 whose conf state holds ``voters`` (every initial member must be
        bootstrapped identically; nodes joining later start empty and receive a
        snapshot from the leader)."""
        self.hard_state = HardState()
        self._snapshot = Snapshot()
        self._ents: list[Entry] = [Entry(0, 0)]
        if voters:
            meta = SnapshotMeta(1, 1, ConfState(tuple(sorted(voters)), ()))
            self.apply_snapshot(Snapshot(meta, b""))
            self.hard_state = HardState(1, "", 1)

    # -- read side -----------------------------------------------------------------
    def initial_state(self) -> tuple[HardState, ConfState]:
        return self.hard_state, self._snapshot.meta.conf_state

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def term(self, index: int) -> int:
        offset = self._ents[0].index
        if index < offset:
            raise CompactedError(f"index {index} compacted (snapshot at {offset})")
        if index - offset >= len(self._ents):
            raise UnavailableError(f"index {index} beyond last {self.last_index()}")
        return self._ents[index - offset].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(f"index {lo} compacted (snapshot at {offset})")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} beyond last {self.last_index()}")
        return limit_size(self._ents[lo - offset : hi - offset], max_bytes)

    def has_conf_change(self, lo: int, hi: int) -> bool:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(f"index {lo} compacted (snapshot at {offset})")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} beyond last {self.last_index()}")
        return any(e.type == EntryType.CONF_CHANGE for e in self._ents[lo - offset : hi - offset])

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- write side (driver) -------------------------------------------------------
    def set_hard_state(self, hs: HardState) -> None:
        self.hard_state = hs

    def append(self, entries: list[Entry]) -> None:
        """Append, truncating any conflicting suffix; entries already compacted are skipped."""
        if not entries:
            return
        first = self.first_index()
        if entries[-1].index < first:
            return
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        offset = entries[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise UnavailableError(
                f"gap: appending {entries[0].index} after last {self.last_index()}"
            )
        del self._ents[offset:]
        self._ents.extend(entries)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log by ``snap`` (a follower installing a leader's snapshot)."""
        if snap.meta.index < self._snapshot.meta.index:
            return
        self._snapshot = snap
        self._ents = [Entry(snap.meta.term, snap.meta.index)]

    def create_snapshot(self, snap: Snapshot) -> None:
        """Record the application's snapshot of this node's own log (from
        ``RaftCore.make_snapshot``); the log is kept until ``compact``."""
        if snap.meta.index <= self._snapshot.meta.index:
            return
        if snap.meta.index > self.last_index():
            raise UnavailableError(f"snapshot {snap.meta.index} beyond last {self.last_index()}")
        self._snapshot = snap

    def compact(self, index: int) -> None:
        """Discard entries up to ``index`` (must be covered by a snapshot)."""
        offset = self._ents[0].index
        if index <= offset:
            return
        if index > self._snapshot.meta.index:
            raise ValueError(f"compact {index} beyond snapshot {self._snapshot.meta.index}")
        i = index - offset
        self._ents = [Entry(self._ents[i].term, index)] + self._ents[i + 1 :]
