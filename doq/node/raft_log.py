"""The Raft log on LMDB: `doq.raft.storage.RaftLogStorage` over the node's one environment.

THE PREVIOUS LAYOUT: a node now keeps its entries in segment files
(`doq.node.wal_log.WalLogStorage`, which moves an older data dir's raft_log entries out at
open) and uses this module's raft_meta keys and codecs; `LmdbLogStorage` stays to read
and write the older layout (the migration's tests build one with it).

Databases (reserved in `doq.storage.env.DB_NAMES`):
- raft_log:  u64 BE index -> u64 BE term + u8 entry type + data
- raft_meta: b"hs"        -> `codec.encode_hard_state`
             b"snap"      -> `codec.encode_snapshot` of the latest snapshot's meta (data b""):
                             the node's own (a point at or below its applied index, recorded
                             every `snapshot_every` entries: the log is compacted up to
                             `keep_entries` behind it) or the last one it installed
             b"first"     -> u64 BE index + u64 BE term of the entry before the first one
                             (the compaction point; its term answers `term(first_index()-1)`)
             b"members"   -> the member addresses (JSON, see `encode_members`)
             b"peer_ids"  -> cluster ids this node also answers to at its peer door
                             besides its state's (JSON list: the cluster it was told to
                             join; ids its state had before an online restore replaced them)
             (b"snap_data": a snapshot's data, written by older versions; never read, and
             deleted with the next snapshot meta)

No snapshot data is stored: the state machine is durable in the same environment (and
the same transactions) as the log, so a snapshot needs only its meta; its data is
produced on demand from one read transaction when a follower needs it, and offered here
in memory (`offer_snapshot`) for the core to send (`snapshot()` raises
`SnapshotTemporarilyUnavailable` and sets `snapshot_wanted` until then). From the moment
its production starts (`hold_compaction`) until the driver drops it (`release_snapshot`)
the log is not compacted past its index: a follower installing it needs the entries after.

Write methods take the caller's write transaction (the driver persists a whole Ready, and
applies its committed entries, in ONE txn committed with fsync) and update the in-memory
view at once. Contract: the core must not read this storage while a write method or the
txn runs (the driver touches the core only between Readies), and if the txn is aborted
or fails to commit the in-memory view must be reloaded (`reload`) before the next use.

An in-memory cache holds the most recent entries (contiguous up to `last_index()`), so the
core's `term()`/`entries()` for replication rarely touch LMDB.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import lmdb

from doq.node.cluster import MemberAddrs
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
from doq.storage.env import open_db

_U64 = struct.Struct(">Q")
_ENT = struct.Struct(">QB")
_FIRST = struct.Struct(">QQ")
HS_KEY = b"hs"
SNAP_KEY = b"snap"
SNAP_DATA_KEY = b"snap_data"
FIRST_KEY = b"first"
MEMBERS_KEY = b"members"
PEER_IDS_KEY = b"peer_ids"
MAX_PEER_IDS = 8  # the oldest are forgotten (each online restore adds one)
DEFAULT_CACHE_ENTRIES = 4096
# and at most this many bytes of entry data (the newest entry is always kept): entries of
# a fill carry thousands of messages, and 4096 of them held whole cost ~100 B of memory
# per queued message of a 1M backlog; older entries are read from LMDB
DEFAULT_CACHE_BYTES = 32 << 20


def _addrs_list(a: MemberAddrs) -> list[str]:
    """[raft, grpc, http] and the store id when there is one (older versions read the
    first three and ignore the rest)."""
    return [a.raft_addr, a.grpc_addr, a.http_addr, *([a.store_id] if a.store_id else [])]


def _addrs_of(a: Any) -> MemberAddrs:
    return MemberAddrs(str(a[0]), str(a[1]), str(a[2]), str(a[3]) if len(a) > 3 else "")


def encode_members(members: dict[str, MemberAddrs]) -> bytes:
    """Deterministic bytes of a member address map (sorted JSON)."""
    return json.dumps(
        {nid: _addrs_list(a) for nid, a in sorted(members.items())},
        separators=(",", ":"),
    ).encode()


def decode_members(raw: bytes) -> dict[str, MemberAddrs]:
    """Inverse of `encode_members`; raises ValueError on malformed bytes."""
    try:
        obj = json.loads(raw)
        return {str(nid): _addrs_of(a) for nid, a in obj.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"malformed member addresses: {e}") from e


def encode_addrs(addrs: MemberAddrs) -> bytes:
    """A conf change's context: the addresses (and store id) of the member it adds."""
    return json.dumps(_addrs_list(addrs)).encode()


def decode_addrs(raw: bytes) -> MemberAddrs | None:
    """Inverse of `encode_addrs`; None for an empty or malformed context."""
    try:
        return _addrs_of(json.loads(raw))
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def _entry_value(e: Entry) -> bytes:
    return _ENT.pack(e.term, int(e.type)) + e.data


def _entry(index: int, v: Any) -> Entry:
    term, t = _ENT.unpack_from(v)
    return Entry(term, index, EntryType(t), bytes(v[_ENT.size :]))


class LmdbLogStorage:
    """Durable Raft log, hard state, snapshot and member addresses. See the module docstring."""

    def __init__(self, env: lmdb.Environment, *, cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.env = env
        self.cache_entries = max(1, cache_entries)
        self.cache_bytes = cache_bytes
        self._log = open_db(env, b"raft_log")
        self._meta = open_db(env, b"raft_meta")
        self.hard_state = HardState()
        self._snap_meta = SnapshotMeta()
        self._outgoing: Snapshot | None = None  # offered snapshot data (memory only)
        self.compaction_hold: int | None = None  # `compact` keeps the entries after it
        self.snapshot_wanted = False  # the core asked for snapshot data not offered yet
        self._dummy = (0, 0)  # (index, term) of first_index() - 1
        self._last = 0
        self.members: dict[str, MemberAddrs] = {}
        self.peer_cluster_ids: tuple[str, ...] = ()
        self._cache: list[Entry] = []
        self._cache_first = 1
        self._cache_size = 0  # bytes of entry data in _cache
        self._load()

    def reload(self) -> None:
        """Reload the in-memory view from LMDB (after an aborted or failed write txn)."""
        self._load()

    def _load(self) -> None:
        with self.env.begin() as txn:
            raw = txn.get(HS_KEY, db=self._meta)
            if raw is not None:
                self.hard_state = codec.decode_hard_state(bytes(raw))
            raw = txn.get(SNAP_KEY, db=self._meta)
            if raw is not None:
                self._snap_meta = codec.decode_snapshot(bytes(raw)).meta
            raw = txn.get(FIRST_KEY, db=self._meta)
            self._dummy = _FIRST.unpack(raw) if raw else (self._snap_meta.index, self._snap_meta.term)
            raw = txn.get(MEMBERS_KEY, db=self._meta)
            if raw is not None:
                self.members = decode_members(bytes(raw))
            raw = txn.get(PEER_IDS_KEY, db=self._meta)
            if raw is not None:
                self.peer_cluster_ids = tuple(str(i) for i in json.loads(bytes(raw)))
            cur = txn.cursor(db=self._log)
            self._last = _U64.unpack(cur.key())[0] if cur.last() else self._dummy[0]
            lo = max(self._dummy[0] + 1, self._last - self.cache_entries + 1)
            # the newest entries within the cache's bounds, read from the last one back: a
            # log of large entries (a fill) is not read whole to keep its last 32 MiB
            newest: list[Entry] = []
            size = 0
            if lo <= self._last and cur.last():
                for k, v in cur.iterprev():
                    i = _U64.unpack(k)[0]
                    if i < lo:
                        break
                    e = _entry(i, v)
                    if newest and size + len(e.data) > self.cache_bytes:
                        break
                    newest.append(e)
                    size += len(e.data)
            newest.reverse()
            self._cache = newest
            self._cache_first = newest[0].index if newest else lo
            self._cache_size = size

    # -- read side (RaftLogStorage) -------------------------------------------------------
    def is_empty(self) -> bool:
        """Nothing was ever persisted (a new node: bootstrap or join)."""
        return self._snap_meta.index == 0 and self._last == 0 and self.hard_state == HardState()

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self.hard_state, self._snap_meta.conf_state

    def first_index(self) -> int:
        return self._dummy[0] + 1

    def last_index(self) -> int:
        return self._last

    def term(self, index: int) -> int:
        if index < self._dummy[0]:
            raise CompactedError(f"index {index} compacted (snapshot at {self._dummy[0]})")
        if index > self._last:
            raise UnavailableError(f"index {index} beyond last {self._last}")
        if index == self._dummy[0]:
            return self._dummy[1]
        if index >= self._cache_first and self._cache:
            return self._cache[index - self._cache_first].term
        with self.env.begin() as txn:
            v = txn.get(_U64.pack(index), db=self._log)
        assert v is not None, f"raft log entry {index} missing"
        return int(_ENT.unpack_from(v)[0])

    def has_conf_change(self, lo: int, hi: int) -> bool:
        """See `RaftLogStorage.has_conf_change`: the cached entries' types, then each stored
        entry's type byte read in place (a read-only view of the map: no entry's data is
        copied, and only its first page is touched)."""
        if lo <= self._dummy[0]:
            raise CompactedError(f"index {lo} compacted (snapshot at {self._dummy[0]})")
        if hi > self._last + 1:
            raise UnavailableError(f"index {hi - 1} beyond last {self._last}")
        if lo >= hi:
            return False
        if self._cache and hi > self._cache_first:
            f = self._cache_first
            if any(e.type == EntryType.CONF_CHANGE for e in self._cache[max(lo, f) - f : hi - f]):
                return True
            hi = min(hi, f)
            if lo >= hi:
                return False
        conf = int(EntryType.CONF_CHANGE)
        type_at = _ENT.size - 1
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=self._log)
            if not cur.set_key(_U64.pack(lo)):
                raise AssertionError(f"raft log entry {lo} missing")
            for k, v in cur.iternext():
                if _U64.unpack(k)[0] >= hi:
                    break
                if v[type_at] == conf:
                    return True
        return False

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo <= self._dummy[0]:
            raise CompactedError(f"index {lo} compacted (snapshot at {self._dummy[0]})")
        if hi > self._last + 1:
            raise UnavailableError(f"index {hi - 1} beyond last {self._last}")
        if lo >= hi:
            return []
        if self._cache and lo >= self._cache_first:
            f = self._cache_first
            return limit_size(self._cache[lo - f : hi - f], max_bytes)
        out: list[Entry] = []
        size = 0
        with self.env.begin() as txn:
            cur = txn.cursor(db=self._log)
            if not cur.set_key(_U64.pack(lo)):
                raise AssertionError(f"raft log entry {lo} missing")
            for k, v in cur.iternext():
                i = _U64.unpack(k)[0]
                if i >= hi:
                    break
                e = _entry(i, v)
                size += e.size()
                if out and size > max_bytes:
                    break
                out.append(e)
        return out

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
        at `snap.meta.index`. Ignored if the log no longer holds that index (a snapshot
        installed meanwhile)."""
        if snap.meta.index < self._dummy[0]:
            return
        self._outgoing = snap
        self.compaction_hold = snap.meta.index
        self.snapshot_wanted = False

    def release_snapshot(self) -> None:
        """Drop the offered snapshot data (or the hold of data no longer being produced):
        compaction may pass its index again."""
        self._outgoing = None
        self.compaction_hold = None

    def snapshot_meta(self) -> SnapshotMeta:
        """The latest snapshot's meta: the node's own compaction record or the last one
        it installed."""
        return self._snap_meta

    # -- write side (driver, inside its write txn) ---------------------------------------
    def set_hard_state(self, txn: lmdb.Transaction, hs: HardState) -> None:
        txn.put(HS_KEY, codec.encode_hard_state(hs), db=self._meta)
        self.hard_state = hs

    def set_members(self, txn: lmdb.Transaction, members: dict[str, MemberAddrs]) -> None:
        txn.put(MEMBERS_KEY, encode_members(members), db=self._meta)
        self.members = dict(members)

    def add_peer_cluster_id(self, txn: lmdb.Transaction, cluster_id: str) -> None:
        """Answer to `cluster_id` at the peer door too (kept across restarts; the newest
        `MAX_PEER_IDS`). Not `is_empty()`-visible: a joiner records it before any Raft state."""
        if not cluster_id or cluster_id in self.peer_cluster_ids:
            return
        ids = (*self.peer_cluster_ids, cluster_id)[-MAX_PEER_IDS:]
        txn.put(PEER_IDS_KEY, json.dumps(list(ids)).encode(), db=self._meta)
        self.peer_cluster_ids = ids

    def append(self, txn: lmdb.Transaction, entries: list[Entry]) -> None:
        """Append, truncating any conflicting suffix; entries already compacted are skipped."""
        if not entries:
            return
        first = self.first_index()
        if entries[-1].index < first:
            return
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        start = entries[0].index
        if start > self._last + 1:
            raise UnavailableError(f"gap: appending {start} after last {self._last}")
        if start <= self._last:  # conflicting suffix
            self._delete_range(txn, start, self._last)
        put = txn.put
        db = self._log
        for e in entries:  # every key left is below `start`: append mode is valid
            put(_U64.pack(e.index), _entry_value(e), db=db, append=True)
        self._last = entries[-1].index
        # cache: contiguous up to _last
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

    def _trim_cache(self) -> None:
        """Drop the oldest cached entries beyond `cache_entries` or `cache_bytes` (the
        newest one stays)."""
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

    def _delete_range(self, txn: lmdb.Transaction, lo: int, hi: int) -> None:
        """Delete entries lo..hi (inclusive)."""
        cur = txn.cursor(db=self._log)
        if not cur.set_range(_U64.pack(lo)):
            return
        end = _U64.pack(hi)
        while bytes(cur.key()) <= end:
            if not cur.delete():
                break

    def _put_snapshot(self, txn: lmdb.Transaction, meta: SnapshotMeta) -> None:
        txn.put(SNAP_KEY, codec.encode_snapshot(Snapshot(meta, b"")), db=self._meta)
        txn.delete(SNAP_DATA_KEY, db=self._meta)  # an older version's data, if any
        self._snap_meta = meta

    def _set_dummy(self, txn: lmdb.Transaction, index: int, term: int) -> None:
        txn.put(FIRST_KEY, _FIRST.pack(index, term), db=self._meta)
        self._dummy = (index, term)

    def apply_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        """Replace the whole log by `snap` (a follower installing a leader's snapshot, or
        the bootstrap snapshot of a new cluster)."""
        if snap.meta.index < self._snap_meta.index:
            return
        self._put_snapshot(txn, snap.meta)  # the data is the state's, installed by the caller
        txn.drop(self._log, delete=False)
        self.release_snapshot()  # data of the replaced log: of no use
        self._set_dummy(txn, snap.meta.index, snap.meta.term)
        self._last = snap.meta.index
        self._cache = []
        self._cache_size = 0
        self._cache_first = snap.meta.index + 1

    def create_snapshot(self, txn: lmdb.Transaction, snap: Snapshot) -> None:
        """Record this node's own snapshot meta (from `RaftCore.make_snapshot`; its data is
        not stored: see the module docstring); the log is kept until `compact`."""
        if snap.meta.index <= self._snap_meta.index:
            return
        if snap.meta.index > self._last:
            raise UnavailableError(f"snapshot {snap.meta.index} beyond last {self._last}")
        self._put_snapshot(txn, snap.meta)

    def compact(self, txn: lmdb.Transaction, index: int, max_entries: int | None = None) -> int:
        """Discard entries up to `index` (must be covered by the snapshot), at most
        `max_entries` of them (the oldest) in this txn, none after `compaction_hold`;
        returns how many were discarded. The compaction point then moves to the last one
        discarded."""
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
        v = txn.get(_U64.pack(index), db=self._log)
        assert v is not None, f"raft log entry {index} missing"
        term = int(_ENT.unpack_from(v)[0])
        count = index - self._dummy[0]
        self._delete_range(txn, self._dummy[0] + 1, index)
        self._set_dummy(txn, index, term)
        if self._cache and index >= self._cache_first:
            drop = min(len(self._cache), index - self._cache_first + 1)
            self._cache_size -= sum(len(e.data) for e in self._cache[:drop])
            del self._cache[:drop]
            self._cache_first += drop
        return count
