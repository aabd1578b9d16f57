"""The Raft log in segment files: `doq.raft.storage.RaftLogStorage` over a
`doq.storage.segment_log.SegmentLog` (the entries) and LMDB's raft_meta (the rest).

Where things live:
- the entries: `<lmdb dir>/wal/` (`SegmentLog`: appended, then made durable with ONE
  `fdatasync` per batch by `sync`; no LMDB transaction involved);
- raft_meta (LMDB, `doq.node.raft_meta`): hard state, snapshot meta,
  compaction point (`first`), members, peer ids: small, written in the driver's write
  transaction (synced when the core says `must_sync` for a term or vote: the caller's
  business, as before).

Write protocol (the driver's, on its writer thread):
1. a snapshot to install: its state and meta (`apply_snapshot`) in an LMDB transaction
   committed durably, THEN `after_commit(durable=True)`, which replaces the segment log by
   an empty one starting after the snapshot; a crash between the two is repaired at open
   (`_reconcile`: the segment log does not hold the compaction point with its term);
2. `append` the Ready's entries and `sync` (one fdatasync): from then on they may be
   acknowledged;
3. the hard state, the apply, own snapshot meta, compaction point, in an LMDB transaction
   (durable or not, see the driver), then `after_commit(durable)`.

Compaction: `compact` moves the compaction point (in raft_meta); whole segments below it
are deleted only after a commit that made that point durable (`after_commit(durable=True)`),
so the log always holds the entries after the durable compaction point, which is never
past the durable snapshot's index (the node's own snapshot meta is recorded in a durable
commit, at an index its state had applied in that commit).

Migration: a data dir of an older doq has its entries in LMDB's raft_log table: they are
moved to the segment log at open (`doq.node.raft_log`: written and synced, then deleted
from LMDB in one durable commit; a crash between repeats the move).

No snapshot data is stored: the state machine is durable in the same environment as
raft_meta, so a snapshot needs only its meta; its data is produced on demand from one read
transaction when a follower needs it, and offered here in memory (`offer_snapshot`) for
the core to send (`snapshot()` raises `SnapshotTemporarilyUnavailable` and sets
`snapshot_wanted` until then). From the moment its production starts (`hold_compaction`)
until the driver drops it (`release_snapshot`) the log is not compacted past its index: a
follower installing it needs the entries after.

Reads: a cache of the entries appended since the open (at most `cache_entries` and
`cache_bytes` of data: entries of a fill carry thousands of messages), older ones from
the segment files. An open reads no entry. The core must not read this storage while a
write method runs; after a failed write the in-memory view must be reloaded (`reload`).
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from doq.node.cluster import MemberAddrs
from doq.node.raft_log import has_old_entries, old_entries
from doq.node.raft_meta import RaftMeta
from doq.raft import codec
from doq.raft.storage import limit_size
from doq.raft.types import (
    CompactedError,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
    SnapshotTemporarilyUnavailable,
    UnavailableError,
)
from doq.storage.env import open_db, sync_meta
from doq.storage.segment_log import DEFAULT_SEGMENT_BYTES, Record, SegmentLog

DEFAULT_CACHE_ENTRIES = 4096
DEFAULT_CACHE_BYTES = 32 << 20  # of entry data (the newest entry is always kept)
WAL_DIR = "wal"
_MIGRATE_BATCH = 4096  # entries read from LMDB per step of a migration


def wal_dir(env: lmdb.Environment) -> Path:
    """Where the segment files of `env`'s node live (inside the LMDB directory)."""
    return Path(env.path()) / WAL_DIR


def _entry(r: Record) -> Entry:
    return Entry(r[1], r[0], EntryType(r[2]), r[3])


def _record(e: Entry) -> Record:
    return (e.index, e.term, int(e.type), e.data)


class WalLogStorage:
    """Durable Raft log (segment files), hard state, snapshot meta and member addresses
    (raft_meta). See the module docstring."""

    def __init__(self, env: lmdb.Environment, *, cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.env = env
        self.cache_entries = max(1, cache_entries)
        self.cache_bytes = cache_bytes
        self.segment_bytes = segment_bytes
        self._log = open_db(env, b"raft_log")  # an older doq's entries (moved at open)
        self._meta_db = open_db(env, b"raft_meta")
        self.meta = RaftMeta(self._meta_db)
        self._outgoing: Snapshot | None = None  # offered snapshot data (memory only)
        self.compaction_hold: int | None = None  # `compact` keeps the entries after it
        self.snapshot_wanted = False  # the core asked for snapshot data not offered yet
        self._durable_first = 0  # the compaction point as last committed durably
        self._reset_to: int | None = None  # `apply_snapshot` waits for its commit
        self._cache: list[Entry] = []
        self._cache_first = 1
        self._cache_size = 0
        self.migrated_entries = 0  # entries moved from LMDB's raft_log at this open
        self._seg: SegmentLog | None = None
        self._closed_last = 0
        self._start_conf: ConfState | None = None  # `start_at`
        self._load()

    @property
    def hard_state(self) -> HardState:
        return self.meta.hard_state

    @property
    def members(self) -> dict[str, MemberAddrs]:
        return self.meta.members

    @property
    def peer_cluster_ids(self) -> tuple[str, ...]:
        return self.meta.peer_cluster_ids

    @property
    def _dummy(self) -> tuple[int, int]:
        return self.meta.first

    @property
    def seg(self) -> SegmentLog:
        assert self._seg is not None
        return self._seg

    def reload(self) -> None:
        """Reload the in-memory view from LMDB and the segment files (after a failed write)."""
        self._load()

    def close(self) -> None:
        """Close the segment files (a stopped node); `last_index` still answers."""
        if self._seg is not None:
            self._closed_last = self.last_index()
            self._seg.close()
            self._seg = None

    def _load(self) -> None:
        self.close()
        self._reset_to = None
        with self.env.begin() as txn:
            self.meta = RaftMeta.read(txn, self._meta_db)
            old = has_old_entries(txn, self._log)
        self._durable_first = self._dummy[0]
        self._seg = SegmentLog(wal_dir(self.env), start_index=self._dummy[0] + 1,
                               segment_bytes=self.segment_bytes)
        if old:
            self._migrate()
        self._reconcile()
        self._fill_cache()

    def _migrate(self) -> None:
        """Move an older doq's entries from LMDB's raft_log to the segment log."""
        seg = self.seg
        seg.reset(self._dummy[0] + 1)
        n = 0
        with self.env.begin(buffers=True) as txn:
            batch: list[Record] = []
            for r in old_entries(txn, self._log, self._dummy[0]):
                batch.append(r)
                if len(batch) >= _MIGRATE_BATCH:
                    seg.append(batch)
                    n += len(batch)
                    batch = []
            if batch:
                seg.append(batch)
                n += len(batch)
        seg.sync()
        with self.env.begin(write=True) as txn:
            txn.drop(self._log, delete=False)
        sync_meta(self.env)
        self.migrated_entries = n

    def _reconcile(self) -> None:
        """The segment log must hold the compaction point (with its term) or start right
        after it; otherwise a snapshot's install committed without its log reset (a crash
        between the two), or the LMDB store was replaced: the log restarts after the
        compaction point. A log with a gap after the compaction point is damage."""
        seg = self.seg
        d, dterm = self._dummy
        empty_store = self.meta.never_written()
        if empty_store and seg.last_index() >= seg.first_index():
            seg.reset(1)  # segment files without the store they belonged to
            return
        if seg.first_index() > d + 1:
            raise RuntimeError(f"the Raft log in {seg.path} starts at {seg.first_index()}, "
                               f"after the compaction point {d}: entries are missing")
        if seg.last_index() < d:
            seg.reset(d + 1)
        elif seg.first_index() <= d and seg.read(d, d + 1)[0][1] != dterm:
            seg.reset(d + 1)

    def _fill_cache(self) -> None:
        """An empty cache after the log's last entry: it holds what is appended from now on
        (an open reads no entry; older ones are read from the segments when asked for)."""
        self._cache = []
        self._cache_first = self.last_index() + 1
        self._cache_size = 0

    # -- read side (RaftLogStorage) -------------------------------------------------------
    def is_empty(self) -> bool:
        """Nothing was ever persisted (a new node: bootstrap or join)."""
        return self.meta.snap_meta.index == 0 and self.last_index() == 0 and self.hard_state == HardState()

    def initial_state(self) -> tuple[HardState, ConfState]:
        """The hard state, and the membership as of `start_at`'s index (else the snapshot's)."""
        return self.hard_state, self._start_conf or self.meta.snap_meta.conf_state

    def start_at(self, applied: int) -> list[ConfChange]:
        """A restart whose state holds the entries up to `applied` (the core starts there:
        `RaftConfig.applied`): `initial_state()` gives from now on the membership as of
        `applied`, the snapshot's with the log's conf changes up to it applied in order
        (from the first entry the log holds: those already in the snapshot's give the same
        membership again, as their re-apply did). Only conf-change entries are read (found
        by their kind byte). Returns those changes, in log order."""
        changes = [codec.decode_conf_change(e.data) for e in self.conf_changes(self.first_index(), applied + 1)]
        conf = self.meta.snap_meta.conf_state
        for cc in changes:
            conf = conf.changed(cc)
        self._start_conf = conf
        return changes

    def conf_changes(self, lo: int, hi: int) -> list[Entry]:
        """The conf-change entries among `[lo, hi)` (clipped to the log), found by their kind
        byte: no other entry's data is read."""
        lo = max(lo, self.first_index())
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        out: list[Entry] = []
        cached = max(lo, self._cache_first) if self._cache else hi
        conf = int(EntryType.CONF_CHANGE)
        for i, kind in enumerate(self.seg.kinds(lo, min(hi, cached)), lo):
            if kind == conf:
                out.extend(_entry(r) for r in self.seg.read(i, i + 1))
        f = self._cache_first
        out.extend(e for e in self._cache[cached - f : hi - f] if e.type == EntryType.CONF_CHANGE)
        return out

    def first_index(self) -> int:
        return self._dummy[0] + 1

    def last_index(self) -> int:
        if self._reset_to is not None:
            return self._reset_to - 1
        if self._seg is None:
            return self._closed_last
        return max(self._dummy[0], self._seg.last_index())

    def _check(self, lo: int, hi: int) -> None:
        if lo <= self._dummy[0]:
            raise CompactedError(f"index {lo} compacted (snapshot at {self._dummy[0]})")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} beyond last {self.last_index()}")

    def term(self, index: int) -> int:
        if index < self._dummy[0]:
            raise CompactedError(f"index {index} compacted (snapshot at {self._dummy[0]})")
        if index > self.last_index():
            raise UnavailableError(f"index {index} beyond last {self.last_index()}")
        if index == self._dummy[0]:
            return self._dummy[1]
        if self._cache and index >= self._cache_first:
            return self._cache[index - self._cache_first].term
        got = self.seg.read(index, index + 1)
        assert got, f"raft log entry {index} missing"
        return got[0][1]

    def has_conf_change(self, lo: int, hi: int) -> bool:
        self._check(lo, hi)
        if lo >= hi:
            return False
        if self._cache and hi > self._cache_first:
            f = self._cache_first
            if any(e.type == EntryType.CONF_CHANGE for e in self._cache[max(lo, f) - f : hi - f]):
                return True
            hi = min(hi, f)
            if lo >= hi:
                return False
        return int(EntryType.CONF_CHANGE) in self.seg.kinds(lo, hi)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        self._check(lo, hi)
        if lo >= hi:
            return []
        if self._cache and lo >= self._cache_first:
            f = self._cache_first
            return limit_size(self._cache[lo - f : hi - f], max_bytes)
        return limit_size([_entry(r) for r in self.seg.read(lo, hi, max_bytes)], max_bytes)

    def snapshot(self) -> Snapshot:
        """The snapshot offered by `offer_snapshot` while the log still holds the entries
        after it; otherwise raises `SnapshotTemporarilyUnavailable` and sets
        `snapshot_wanted` (the driver then produces one)."""
        out = self._outgoing
        if out is not None and out.meta.index >= self._dummy[0]:
            return out
        self._outgoing = None
        self.snapshot_wanted = True
        raise SnapshotTemporarilyUnavailable("snapshot data is being produced")

    def hold_compaction(self, index: int) -> None:
        """Snapshot data at `index` (at or after the compaction point) is being produced:
        `compact` discards no entry after `index` until `release_snapshot`."""
        self.compaction_hold = index

    def offer_snapshot(self, snap: Snapshot) -> None:
        """The driver's snapshot data for the core to send (kept in memory, never written,
        the log held at its index until `release_snapshot`); it must be of the node's state
        at `snap.meta.index`. Ignored if the log no longer holds that index."""
        if snap.meta.index < self._dummy[0]:
            return
        self._outgoing = snap
        self.compaction_hold = snap.meta.index
        self.snapshot_wanted = False

    def release_snapshot(self) -> None:
        """Drop the offered snapshot data (or the hold): compaction may pass its index again."""
        self._outgoing = None
        self.compaction_hold = None

    def snapshot_meta(self) -> SnapshotMeta:
        """The latest snapshot's meta: the node's own compaction record or the last one it
        installed."""
        return self.meta.snap_meta

    def log_bytes(self) -> int:
        """Bytes the segment files hold in records (what compaction frees)."""
        return self.seg.used_bytes()

    # -- write side: the segment log (no transaction) -------------------------------------
    def append(self, entries: list[Entry]) -> None:
        """Append to the segment log (not durable until `sync`), truncating any
        conflicting suffix; entries already compacted are skipped."""
        if not entries:
            return
        if self._reset_to is not None:
            raise RuntimeError("a snapshot's install must be committed (after_commit) before appending")
        first = self.first_index()
        if entries[-1].index < first:
            return
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        start = entries[0].index
        last = self.last_index()
        if start > last + 1:
            raise UnavailableError(f"gap: appending {start} after last {last}")
        self.seg.append([_record(e) for e in entries])
        if self._cache and self._cache_first <= start <= self._cache_first + len(self._cache):
            cut = start - self._cache_first
            self._cache_size -= sum(len(e.data) for e in self._cache[cut:])
            del self._cache[cut:]
            self._cache.extend(entries)
        else:
            self._cache = list(entries)
            self._cache_first = start
            self._cache_size = 0
        self._cache_size += sum(len(e.data) for e in entries)
        self._trim_cache()

    def sync(self) -> None:
        """Make every appended entry durable (one fdatasync)."""
        self.seg.sync()

    def _trim_cache(self) -> None:
        cache = self._cache
        drop = max(0, len(cache) - self.cache_entries)
        size = self._cache_size - sum(len(e.data) for e in cache[:drop])
        while size > self.cache_bytes and drop < len(cache) - 1:
            size -= len(cache[drop].data)
            drop += 1
        if drop:
            del cache[:drop]
            self._cache_first += drop
            self._cache_size = size

    # -- write side: raft_meta (inside the caller's LMDB write transaction) ----------------
    def set_hard_state(self, txn: lmdb.Transaction, hs: HardState) -> None:
        self.meta.set_hard_state(txn, hs)

    def set_members(self, txn: lmdb.Transaction, members: dict[str, MemberAddrs]) -> None:
        self.meta.set_members(txn, members)

    def add_peer_cluster_id(self, txn: lmdb.Transaction, cluster_id: str) -> None:
        """Answer to `cluster_id` at the peer door too (`RaftMeta.add_peer_cluster_id`). Not
        `is_empty()`-visible: a joiner records it before any Raft state."""
        self.meta.add_peer_cluster_id(txn, cluster_id)

    def apply_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        """Replace the whole log by `snap`: its meta now; the segment log is emptied by
        `after_commit(durable=True)` once this transaction is durable (until then reads
        see an empty log after the snapshot and `append` refuses)."""
        if snap.meta.index < self.meta.snap_meta.index:
            return
        self.meta.set_snapshot(txn, snap.meta)
        self.release_snapshot()
        self.meta.set_first(txn, snap.meta.index, snap.meta.term)
        self._reset_to = snap.meta.index + 1
        self._start_conf = None
        self._cache = []
        self._cache_size = 0
        self._cache_first = snap.meta.index + 1

    def create_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        """Record this node's own snapshot meta (from `RaftCore.make_snapshot`; its data is
        not stored); the log is kept until `compact`."""
        if snap.meta.index <= self.meta.snap_meta.index:
            return
        if snap.meta.index > self.last_index():
            raise UnavailableError(f"snapshot {snap.meta.index} beyond last {self.last_index()}")
        self.meta.set_snapshot(txn, snap.meta)

    def compact(self, txn: lmdb.Transaction, index: int, max_entries: int | None = None) -> int:
        """Move the compaction point to `index` (covered by the snapshot; at most
        `max_entries` past the current one, never past `compaction_hold`); returns by how
        many entries. The segment files go with a later durable commit (`after_commit`)."""
        hold = self.compaction_hold
        if hold is not None:
            index = min(index, hold)
        if index <= self._dummy[0]:
            return 0
        if index > self.meta.snap_meta.index:
            raise ValueError(f"compact {index} beyond snapshot {self.meta.snap_meta.index}")
        if max_entries is not None:
            if max_entries <= 0:
                return 0
            index = min(index, self._dummy[0] + max_entries)
        term = self.term(index)
        count = index - self._dummy[0]
        self.meta.set_first(txn, index, term)
        if self._cache and index >= self._cache_first:
            drop = min(len(self._cache), index - self._cache_first + 1)
            self._cache_size -= sum(len(e.data) for e in self._cache[:drop])
            del self._cache[:drop]
            self._cache_first += drop
        return count

    def droppable(self) -> bool:
        """Would a durable commit now let `after_commit` delete a segment file?"""
        return self.seg.droppable_before(self._dummy[0] + 1) > 0

    def after_commit(self, durable: bool) -> None:
        """The caller's LMDB transaction committed (`durable`: its meta page synced too).
        After a durable commit: a snapshot's install empties the segment log, and segments
        wholly at or below the compaction point are deleted."""
        if not durable:
            return
        if self._reset_to is not None:
            self.seg.reset(self._reset_to)
            self._reset_to = None
        self._durable_first = self._dummy[0]
        self.seg.drop_before(self._durable_first + 1)

