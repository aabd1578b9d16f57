"""The Raft log in segment files: `doq.raft.storage.RaftLogStorage` over a
`doq.storage.segment_log.SegmentLog` (the entries) and LMDB's raft_meta (the rest).

Where things live:
- the entries: `<lmdb dir>/wal/` (`SegmentLog`: appended, then made durable with ONE
  `fdatasync` per batch by `sync`; no LMDB transaction involved);
- raft_meta (LMDB, the keys of `doq.node.raft_log`): hard state, snapshot meta,
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
moved to the segment log at open (written and synced, then deleted from LMDB in one
durable commit; a crash between repeats the move).

Reads: a cache of the most recent entries (as `LmdbLogStorage`), older ones from the
segment files. The core must not read this storage while a write method runs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import lmdb

from doq.node.cluster import MemberAddrs
from doq.node.raft_log import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_ENTRIES,
    FIRST_KEY,
    HS_KEY,
    MAX_PEER_IDS,
    MEMBERS_KEY,
    PEER_IDS_KEY,
    SNAP_DATA_KEY,
    SNAP_KEY,
    decode_members,
    encode_members,
)
from doq.raft import codec
from doq.raft.storage import limit_size
from doq.raft.types import (
    CompactedError,
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

_U64 = struct.Struct(">Q")
_ENT = struct.Struct(">QB")
_FIRST = struct.Struct(">QQ")
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
        self._meta = open_db(env, b"raft_meta")
        self.hard_state = HardState()
        self._snap_meta = SnapshotMeta()
        self._outgoing: Snapshot | None = None
        self.compaction_hold: int | None = None
        self.snapshot_wanted = False
        self._dummy = (0, 0)
        self._durable_first = 0  # the compaction point as last committed durably
        self._reset_to: int | None = None  # `apply_snapshot` waits for its commit
        self.members: dict[str, MemberAddrs] = {}
        self.peer_cluster_ids: tuple[str, ...] = ()
        self._cache: list[Entry] = []
        self._cache_first = 1
        self._cache_size = 0
        self.migrated_entries = 0  # entries moved from LMDB's raft_log at this open
        self._seg: SegmentLog | None = None
        self._closed_last = 0
        self._load()

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
            raw = txn.get(HS_KEY, db=self._meta)
            self.hard_state = codec.decode_hard_state(bytes(raw)) if raw is not None else HardState()
            raw = txn.get(SNAP_KEY, db=self._meta)
            self._snap_meta = codec.decode_snapshot(bytes(raw)).meta if raw is not None else SnapshotMeta()
            raw = txn.get(FIRST_KEY, db=self._meta)
            self._dummy = _FIRST.unpack(raw) if raw else (self._snap_meta.index, self._snap_meta.term)
            raw = txn.get(MEMBERS_KEY, db=self._meta)
            self.members = decode_members(bytes(raw)) if raw is not None else {}
            raw = txn.get(PEER_IDS_KEY, db=self._meta)
            self.peer_cluster_ids = tuple(str(i) for i in json.loads(bytes(raw))) if raw is not None else ()
            old_entries = txn.cursor(db=self._log).first()
        self._durable_first = self._dummy[0]
        self._seg = SegmentLog(wal_dir(self.env), start_index=self._dummy[0] + 1,
                               segment_bytes=self.segment_bytes)
        if old_entries:
            self._migrate()
        self._reconcile()
        self._fill_cache()

    def _migrate(self) -> None:
        """Move an older doq's entries from LMDB's raft_log to the segment log."""
        seg = self.seg
        seg.reset(self._dummy[0] + 1)
        n = 0
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=self._log)
            batch: list[Record] = []
            for k, v in cur:
                i = _U64.unpack(k)[0]
                if i <= self._dummy[0]:
                    continue  # at or below the compaction point: never read again
                term, t = _ENT.unpack_from(v)
                batch.append((i, term, t, bytes(v[_ENT.size :])))
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
        empty_store = self._snap_meta.index == 0 and self.hard_state == HardState() and d == 0
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
        """The newest entries within the cache's bounds, read from the last one back."""
        last = self.last_index()
        lo = max(self._dummy[0] + 1, last - self.cache_entries + 1)
        newest: list[Entry] = []
        size = 0
        hi = last + 1
        while hi > lo:
            step_lo = max(lo, hi - 256)
            chunk = [_entry(r) for r in self.seg.read(step_lo, hi)]
            done = False
            for e in reversed(chunk):
                if newest and size + len(e.data) > self.cache_bytes:
                    done = True
                    break
                newest.append(e)
                size += len(e.data)
            if done:
                break
            hi = step_lo
        newest.reverse()
        self._cache = newest
        self._cache_first = newest[0].index if newest else last + 1
        self._cache_size = size

    # -- read side (RaftLogStorage) -------------------------------------------------------
    def is_empty(self) -> bool:
        """Nothing was ever persisted (a new node: bootstrap or join)."""
        return self._snap_meta.index == 0 and self.last_index() == 0 and self.hard_state == HardState()

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self.hard_state, self._snap_meta.conf_state

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
        """As `LmdbLogStorage.snapshot`."""
        out = self._outgoing
        if out is not None and out.meta.index >= self._dummy[0]:
            return out
        self._outgoing = None
        self.snapshot_wanted = True
        raise SnapshotTemporarilyUnavailable("snapshot data is being produced")

    def hold_compaction(self, index: int) -> None:
        self.compaction_hold = index

    def offer_snapshot(self, snap: Snapshot) -> None:
        if snap.meta.index < self._dummy[0]:
            return
        self._outgoing = snap
        self.compaction_hold = snap.meta.index
        self.snapshot_wanted = False

    def release_snapshot(self) -> None:
        self._outgoing = None
        self.compaction_hold = None

    def snapshot_meta(self) -> SnapshotMeta:
        return self._snap_meta

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
        txn.put(HS_KEY, codec.encode_hard_state(hs), db=self._meta)
        self.hard_state = hs

    def set_members(self, txn: lmdb.Transaction, members: dict[str, MemberAddrs]) -> None:
        txn.put(MEMBERS_KEY, encode_members(members), db=self._meta)
        self.members = dict(members)

    def add_peer_cluster_id(self, txn: lmdb.Transaction, cluster_id: str) -> None:
        if not cluster_id or cluster_id in self.peer_cluster_ids:
            return
        ids = (*self.peer_cluster_ids, cluster_id)[-MAX_PEER_IDS:]
        txn.put(PEER_IDS_KEY, json.dumps(list(ids)).encode(), db=self._meta)
        self.peer_cluster_ids = ids

    def _put_snapshot(self, txn: lmdb.Transaction, meta: SnapshotMeta) -> None:
        txn.put(SNAP_KEY, codec.encode_snapshot(Snapshot(meta, b"")), db=self._meta)
        txn.delete(SNAP_DATA_KEY, db=self._meta)
        self._snap_meta = meta

    def _set_dummy(self, txn: lmdb.Transaction, index: int, term: int) -> None:
        txn.put(FIRST_KEY, _FIRST.pack(index, term), db=self._meta)
        self._dummy = (index, term)

    def apply_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        """Replace the whole log by `snap`: its meta now; the segment log is emptied by
        `after_commit(durable=True)` once this transaction is durable (until then reads
        see an empty log after the snapshot and `append` refuses)."""
        if snap.meta.index < self._snap_meta.index:
            return
        self._put_snapshot(txn, snap.meta)
        self.release_snapshot()
        self._set_dummy(txn, snap.meta.index, snap.meta.term)
        self._reset_to = snap.meta.index + 1
        self._cache = []
        self._cache_size = 0
        self._cache_first = snap.meta.index + 1

    def create_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        if snap.meta.index <= self._snap_meta.index:
            return
        if snap.meta.index > self.last_index():
            raise UnavailableError(f"snapshot {snap.meta.index} beyond last {self.last_index()}")
        self._put_snapshot(txn, snap.meta)

    def compact(self, txn: lmdb.Transaction, index: int, max_entries: int | None = None) -> int:
        """Move the compaction point to `index` (covered by the snapshot; at most
        `max_entries` past the current one, never past `compaction_hold`); returns by how
        many entries. The segment files go with a later durable commit (`after_commit`)."""
        hold = self.compaction_hold
        if hold is not None:
            index = min(index, hold)
        if index <= self._dummy[0]:
            return 0
        if index > self._snap_meta.index:
            raise ValueError(f"compact {index} beyond snapshot {self._snap_meta.index}")
        if max_entries is not None:
            if max_entries <= 0:
                return 0
            index = min(index, self._dummy[0] + max_entries)
        term = self.term(index)
        count = index - self._dummy[0]
        self._set_dummy(txn, index, term)
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

