"""`StateStore`: the queue state machine over LMDB (durable records + in-memory indexes).

Databases (reserved in `doq.storage.env.DB_NAMES`):
- state_meta: the machine meta record (b"G") and store keys (b"\\x00applied", b"\\x00horizon")
- state_queues / state_messages / state_dedup: the records of `doq.queues.keys`
- state_versions: (u64 BE version + key) -> b"" for every live record
- state_tombstones: (u64 BE version + key) -> b"" for every deletion

Every stored record value is `u64 BE version + payload`, the version being the log index
whose entry wrote it. So `iter_changes(since)` yields every record and tombstone with
version >= since, in version order: full + incremental backups restore the exact state.
Tombstones older than `tombstone_retention` log indexes are pruned (deterministically,
at indexes that are multiples of PRUNE_EVERY); a `since` below the horizon is refused.

Threading: `apply_entries`, `install_snapshot`, `restore_records` and `rebuild` run on one
writer thread. Reads (`get_message`, `get_queue`, `list_queues`, `iter_changes`, dumps) may
run on other threads: they use LMDB read transactions or atomic snapshots of the
in-memory counters (possibly a batch stale).

Failure contract: the in-memory indexes change while `apply_entries` runs, before the
caller commits. If `apply_entries` raises, or the caller aborts / fails to commit the
transaction, memory and disk disagree: the caller must treat it as fatal and call
`rebuild()` (or restart the process) before applying anything else.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import lmdb

from doq.errors import InvalidArgument, MessageNotFound
from doq.queues import keys as K
from doq.queues import records as R
from doq.queues.codec import decode_batch
from doq.queues.commands import CommandBatch
from doq.queues.machine import QueueMachine
from doq.queues.model import MessageView, QueueInfo
from doq.storage.env import open_db

_V = struct.Struct(">Q")
APPLIED_KEY = b"\x00applied"
HORIZON_KEY = b"\x00horizon"
PRUNE_EVERY = 1024
DEFAULT_TOMBSTONE_RETENTION = 1_000_000
DUMP_MAGIC = b"DOQSTATE1"
_DUMP_REC = struct.Struct(">BII")
# dump order: (dump tag, db name); the versions index is derived, so not dumped
_DUMPED = ((1, b"state_meta"), (2, b"state_queues"), (3, b"state_messages"),
           (4, b"state_dedup"), (5, b"state_tombstones"))


class _TxnSink:
    """The machine's `Store`, bound to the caller's write txn and the entry's version."""

    __slots__ = ("txn", "ver", "dbs", "versions", "tombs")

    def __init__(self, dbs: dict[int, Any], versions: Any, tombs: Any) -> None:
        self.txn: Any = None  # lmdb.Transaction (stubs type values as bytes | memoryview)
        self.ver = _V.pack(0)
        self.dbs = dbs
        self.versions = versions
        self.tombs = tombs

    def get(self, key: bytes) -> bytes | None:
        assert self.txn is not None
        v = self.txn.get(key, db=self.dbs[key[0]])
        return None if v is None else v[8:]

    def put(self, key: bytes, value: bytes) -> None:
        txn = self.txn
        assert txn is not None
        ver = self.ver
        old = txn.replace(key, ver + value, db=self.dbs[key[0]])
        if old is not None:
            ov = old[:8]
            if ov == ver:
                return
            txn.delete(ov + key, db=self.versions)
        txn.put(ver + key, b"", db=self.versions)

    def delete(self, key: bytes) -> None:
        txn = self.txn
        assert txn is not None
        old = txn.pop(key, db=self.dbs[key[0]])
        if old is None:
            return
        txn.delete(old[:8] + key, db=self.versions)
        txn.put(self.ver + key, b"", db=self.tombs)


class StateStore:
    """The node's replicated queue state. See the module docstring for the contracts."""

    def __init__(self, env: lmdb.Environment, *,
                 tombstone_retention: int = DEFAULT_TOMBSTONE_RETENTION) -> None:
        self.env = env
        self.tombstone_retention = tombstone_retention
        self._db = {n: open_db(env, n) for _, n in _DUMPED}
        self._db[b"state_versions"] = open_db(env, b"state_versions")
        self._meta = self._db[b"state_meta"]
        self._versions = self._db[b"state_versions"]
        self._tombs = self._db[b"state_tombstones"]
        self._kind_db = {
            K.META[0]: self._meta, K.QUEUE: self._db[b"state_queues"],
            K.MESSAGE: self._db[b"state_messages"], K.DEDUP: self._db[b"state_dedup"],
        }
        self._sink = _TxnSink(self._kind_db, self._versions, self._tombs)
        self.machine = QueueMachine(self._sink)
        self.applied_index = 0
        self._broken = False
        self.rebuild()

    # -- rebuild -------------------------------------------------------------------------
    def rebuild(self, txn: lmdb.Transaction | None = None) -> None:
        """Reload applied_index and the in-memory indexes from LMDB (or from `txn`)."""
        if txn is None:
            with self.env.begin() as rtxn:
                self._load(rtxn)
        else:
            self._load(txn)
        self._broken = False

    def _load(self, txn: lmdb.Transaction) -> None:
        raw = txn.get(APPLIED_KEY, db=self._meta)
        self.applied_index = _V.unpack(raw)[0] if raw else 0
        self.machine.load(self._records(txn))

    def _records(self, txn: Any) -> Iterator[tuple[bytes, bytes]]:
        for name in (b"state_meta", b"state_queues", b"state_messages", b"state_dedup"):
            for k, v in txn.cursor(db=self._db[name]).iternext():
                if k[:1] != b"\x00":
                    yield k, v[8:]

    # -- apply ---------------------------------------------------------------------------
    def apply_entries(
        self, txn: lmdb.Transaction, entries: Sequence[tuple[int, bytes | CommandBatch]]
    ) -> list[list[object]]:
        """Apply committed log entries inside the caller's write txn (the caller commits).

        An entry's data is the encoded `CommandBatch`, or the batch object itself when the
        caller holds it already (the single-node log: nothing to decode).

        Entries at or below `applied_index` are skipped (their result is []); an empty
        entry (a Raft no-op) only advances `applied_index`. Returns one result list per
        entry (one result per command of its batch). Raises ValueError on a corrupt entry.
        """
        if self._broken:
            raise RuntimeError("state store out of sync with LMDB: call rebuild()")
        sink = self._sink
        sink.txn = txn
        out: list[list[object]] = []
        applied = self.applied_index
        self._broken = True
        try:
            for index, data in entries:
                if index <= applied:
                    out.append([])
                    continue
                sink.ver = _V.pack(index)
                if type(data) is CommandBatch:
                    out.append(self.machine.apply(index, data))
                else:
                    out.append(self.machine.apply(index, decode_batch(data)) if data else [])  # type: ignore[arg-type]
                if index % PRUNE_EVERY == 0:
                    self._prune(txn, index)
                applied = index
            if applied != self.applied_index:
                txn.put(APPLIED_KEY, _V.pack(applied), db=self._meta)
                self.applied_index = applied
        finally:
            sink.txn = None
        self._broken = False
        return out

    def _prune(self, txn: Any, index: int) -> None:
        cutoff = index - self.tombstone_retention
        if cutoff <= self.horizon(txn):
            return
        ck = _V.pack(cutoff)
        cur = txn.cursor(db=self._tombs)
        if cur.first():
            while cur.key()[:8] < ck:
                if not cur.delete():
                    break
        txn.put(HORIZON_KEY, ck, db=self._meta)

    def horizon(self, txn: lmdb.Transaction | None = None) -> int:
        """Lowest `since` for which `iter_changes` is exact (tombstones below are pruned)."""
        if txn is None:
            with self.env.begin() as t:
                return self.horizon(t)
        raw = txn.get(HORIZON_KEY, db=self._meta)
        return _V.unpack(raw)[0] if raw else 0

    # -- node helpers ----------------------------------------------------------------------
    def next_due_ms(self) -> int | None:
        return self.machine.next_due_ms()

    def has_deliverable(self, queue: str) -> bool:
        return self.machine.has_deliverable(queue)

    # -- reads -----------------------------------------------------------------------------
    def get_message(self, queue: str, id_: int) -> MessageView:
        """Raises QueueNotFound / MessageNotFound."""
        self.machine.queue_info(queue)
        if type(id_) is not int or not 0 < id_ < 2**64:
            raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
        with self.env.begin() as txn:
            v = txn.get(K.message_key(queue, id_), db=self._kind_db[K.MESSAGE])
        if v is None:
            raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
        return R.message_view(queue, id_, v[8:], self.machine.now_ms)

    def get_queue(self, name: str) -> QueueInfo:
        return self.machine.queue_info(name)

    def list_queues(self) -> list[QueueInfo]:
        return self.machine.queue_infos()

    # -- backup ----------------------------------------------------------------------------
    def iter_changes(self, since: int) -> Iterator[tuple[bytes, bytes | None, int]]:
        """Every record (key, payload, version) and tombstone (key, None, version) with
        version >= since, in (version, key) order, a tombstone before a record of the same
        key and version. Consume on one thread (it holds a read txn).
        Raises InvalidArgument(reason="SINCE_TOO_OLD") if 0 < since < horizon."""
        _, it = self.changes(since)
        return it

    def changes(self, since: int) -> tuple[int, Iterator[tuple[bytes, bytes | None, int]]]:
        """(applied index of the snapshot read, iterator as `iter_changes`)."""
        txn = self.env.begin()
        try:
            if since < 0:
                raise InvalidArgument("since must be >= 0", reason="INVALID_SINCE")
            h = self.horizon(txn)
            if 0 < since < h:
                raise InvalidArgument(
                    f"since={since} is older than the tombstone horizon {h}; take a full backup",
                    reason="SINCE_TOO_OLD")
            raw = txn.get(APPLIED_KEY, db=self._meta)
            last = _V.unpack(raw)[0] if raw else 0
        except BaseException:
            txn.abort()
            raise
        return last, self._iter_changes(txn, since)

    def _iter_changes(self, txn: Any, since: int) -> Iterator[tuple[bytes, bytes | None, int]]:
        try:
            start = _V.pack(since)
            vs = self._walk(txn, self._versions, start)
            ts = self._walk(txn, self._tombs, start)
            v = next(vs, None)
            t = next(ts, None)
            kind_db = self._kind_db
            while v is not None or t is not None:
                if t is not None and (v is None or t <= v):
                    yield t[8:], None, _V.unpack_from(t)[0]
                    t = next(ts, None)
                else:
                    assert v is not None
                    key = v[8:]
                    rec = txn.get(key, db=kind_db[key[0]])
                    assert rec is not None
                    yield key, rec[8:], _V.unpack_from(v)[0]
                    v = next(vs, None)
        finally:
            txn.abort()

    @staticmethod
    def _walk(txn: Any, db: Any, start: bytes) -> Iterator[bytes]:
        cur = txn.cursor(db=db)
        if cur.set_range(start):
            yield from cur.iternext(keys=True, values=False)

    def restore_records(self, txn: lmdb.Transaction,
                        records: Iterable[tuple[bytes, bytes | None, int]]) -> int:
        """Write backup records (payload None = tombstone) with their versions into `txn`,
        in the order given (version order). Every tombstone is kept, even for a key this
        store never had. Returns the count. The caller commits and then calls `rebuild()`
        (apply_entries refuses to run until then); applied_index is not changed (see
        `set_applied_index`)."""
        sink = _TxnSink(self._kind_db, self._versions, self._tombs)
        sink.txn = txn
        n = 0
        for key, value, version in records:
            if not key or key[0] not in self._kind_db or (key[0] == K.META[0] and key != K.META_KEY):
                raise InvalidArgument(f"unknown record key {key!r}", reason="INVALID_RECORD")
            sink.ver = _V.pack(version)
            if value is None:
                sink.delete(key)
                # keep every tombstone of the backup, even for keys this store never had,
                # so the restored state is identical to the source's
                txn.put(sink.ver + key, b"", db=self._tombs)
            else:
                sink.put(key, value)
            n += 1
        self._broken = True
        return n

    def set_applied_index(self, txn: lmdb.Transaction, index: int) -> None:
        """Record `index` as applied (offline restore: the node's next log index follows it).
        If the caller aborts `txn`, it must call `rebuild()`."""
        if type(index) is not int or index < 0:
            raise InvalidArgument("applied index must be >= 0", reason="INVALID_INDEX")
        txn.put(APPLIED_KEY, _V.pack(index), db=self._meta)
        self.applied_index = index

    # -- snapshots -------------------------------------------------------------------------
    def iter_dump(self) -> Iterator[bytes]:
        """Deterministic chunks of the whole replicated state (see dump_state_bytes)."""
        with self.env.begin() as txn:
            yield DUMP_MAGIC
            for tag, name in _DUMPED:
                pack = _DUMP_REC.pack
                for k, v in txn.cursor(db=self._db[name]).iternext():
                    yield pack(tag, len(k), len(v)) + k + v

    def dump_state_bytes(self) -> bytes:
        """Byte-identical on replicas that applied the same log (also a Raft snapshot)."""
        return b"".join(self.iter_dump())

    def snapshot_digest(self) -> str:
        h = hashlib.sha256()
        for chunk in self.iter_dump():
            h.update(chunk)
        return h.hexdigest()

    def install_snapshot(self, txn: lmdb.Transaction, data: bytes) -> None:
        """Replace the whole state with a `dump_state_bytes()` image inside `txn` and
        rebuild memory from it. If the caller then aborts, it must call `rebuild()`."""
        if not data.startswith(DUMP_MAGIC):
            raise ValueError("not a doq state dump")
        self._broken = True
        for db in self._db.values():
            txn.drop(db, delete=False)
        dbs = {tag: self._db[name] for tag, name in _DUMPED}
        pos, end = len(DUMP_MAGIC), len(data)
        while pos < end:
            tag, kl, vl = _DUMP_REC.unpack_from(data, pos)
            pos += _DUMP_REC.size
            k = data[pos : pos + kl]
            v = data[pos + kl : pos + kl + vl]
            pos += kl + vl
            if tag not in dbs or len(k) != kl or len(v) != vl:
                raise ValueError("corrupt state dump")
            txn.put(k, v, db=dbs[tag])
            if tag != 5 and k[:1] != b"\x00":
                txn.put(v[:8] + k, b"", db=self._versions)
        self.rebuild(txn)
