"""`StateStore`: the queue state machine over LMDB (durable records + in-memory indexes).

Databases (reserved in `doq.storage.env.DB_NAMES`):
- state_meta: the machine meta record (b"G") and store keys (b"\\x00applied",
  b"\\x00horizon", b"\\x00cluster", b"\\x00voffset", the staging of an online restore:
  b"\\x00rstage", b"\\x00rchunk" + u32 BE seq, and the client keys:
  `doq.queues.apikeys.STORE_PREFIX` + key id, and the join tokens:
  `doq.queues.join_tokens.STORE_PREFIX` + token id)
- state_queues / state_messages / state_dedup: the records of `doq.queues.keys`
- state_versions: (u64 BE version + key) -> b"" for every live record but a leased
  message (its version is its state_leases entry's: changes merge that table in), the
  body's entry of every stored message body (also while the message is leased or gone:
  removed with the body), and for a while entries of records rewritten or deleted since
  (stale entries: readers skip an entry whose record is at another version)
- state_stale: (u64 BE version + stale versions entry) -> b"": the stale entries, deleted
  in bulk, in key order (`_TxnSink`, `StateStore._sweep`); not replicated state
- state_gone: (u64 BE version + message key) -> b"": a message deleted (acked, dead-
  lettered, purged) at that version whose body is still in state_messages. A delete
  appends here instead of removing the body (one page per message, the messages being
  deleted in delivery order, not in key order); the bodies are removed in bulk, in key
  order (`StateStore._sweep`). Every reader leaves these bodies out; the writer keeps
  the set in memory (`_TxnSink.gone`), rebuilt on load
- state_leases: message key -> u64 BE version + the lease fields of its record
  (`R.LEASE_AT`..`R.LEASE_END`): a message's record is its body in state_messages with
  these fields, at this version (`_TxnSink`); an old data dir has none (the lease fields
  in the bodies) and loads as it is; a data dir of before issue 20's drain change has a
  versions entry per lease entry (unversioned as its lease goes: `_TxnSink.legacy`)
- state_tombstones: (u64 BE version + key) -> b"" for every deletion

Every stored record value is `u64 BE version + payload`, the version being the log index
whose entry wrote it plus the replicated *version offset* (0 unless an online restore
through the log brought versions ahead of the log: see "Restore through the log"). So
`iter_changes(since)` yields every record and tombstone with version >= since, in version
order: full + incremental backups restore the exact state. Tombstones older than
`tombstone_retention` versions are pruned (deterministically, at versions that are
multiples of PRUNE_EVERY); a `since` below the horizon is refused. Backups and the digest
speak versions (`applied_index + version_offset`), the Raft driver log indexes
(`applied_index`).

Restore through the log (a Raft cluster; `apply_entries` handles an entry whose batch is
one `RestoreChunk` / `RestoreCommit` / `RestoreAbort` itself, never the machine):
- a chunk of restore R is staged in state_meta (replicated state: a Raft snapshot carries
  every store key, so a follower that installs one mid-restore stages the same); a chunk
  of another restore first discards the staging it finds (an abandoned restore); a chunk
  out of order breaks the staging (its commit fails);
- the commit of R, if R's staging holds exactly its chunks and records and the state is
  empty, writes the staged records (with their versions) in a nested transaction, sets the
  version offset so that later versions exceed the restored chain's `to_version`, adopts
  the chain's cluster id (if it records one), and rebuilds memory from it; otherwise (or
  if the records do not form a valid state) it changes nothing. Either way it discards
  the staging and returns the outcome (a `RestoreOutcome` or the `DoqError`) as its
  result: identical on every replica.

Client keys (`CreateKey`/`RevokeKey`, applied by the machine's `KeyTable`) are store keys,
not records: replicated through the log and Raft snapshots, kept across restarts, but
never in a backup, the digest or a restore (a restore leaves the target's keys as they
are). Join tokens (`CreateJoinToken`/`UseJoinToken`, the machine's `JoinTokens`) are kept
the same way. A batch of key commands only is applied by the store to the table (replicated time
stays; no record changes); key commands batched with others go through the machine.
`keys()` and `join_tokens()` are the tables as committed, for any thread.

The cluster id (b"\\x00cluster", `cluster_id`) names the history this state belongs to: set
once when a node bootstraps a cluster (`ensure_cluster_id`), adopted from the backup by a
restore, carried to other members by Raft snapshots. It is not a record: backups carry it
in their header, and the state digest does not cover it.

Threading: `write`, `apply_entries`, `install_snapshot`, `replace_records`, `restore`,
`open_read` and `rebuild` run on
one writer thread. Reads may run on any thread and see a consistent, committed state:
`get_queue`, `list_queues`, `deliverable`, `has_deliverable` and `next_due_ms` read an
immutable `StateView` the writer publishes after each committed transaction (rebuilt for
the queues the transaction touched only); `get_message`, `iter_changes`/`changes` and the
dumps read one LMDB read transaction each.

Failure contract: write through `with store.write() as txn:`. The in-memory indexes change
while `apply_entries` runs, before the commit; if the block or the commit raises, `write`
aborts the transaction and `rebuild()`s memory from LMDB, so the store is as before the
block and the next write may proceed. Only if that rebuild fails too does `write` raise
`StoreBroken`: then nothing may be applied until a successful `rebuild()` (or a restart).
A caller managing its own transaction must do the same (abort, `rebuild()`), and its
commits reach readers only with the next `write()` or `rebuild()`: prefer `write()`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import hashlib
import heapq
import itertools
import logging
import marshal
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import lmdb

from doq.errors import (
    DoqError,
    FailedPrecondition,
    InvalidArgument,
    MessageNotFound,
    QueueNotFound,
    Unavailable,
)
from doq.queues import join_tokens as JT
from doq.queues import keys as K
from doq.queues import records as R
from doq.queues.apikeys import STORE_PREFIX as KEY_PREFIX
from doq.queues.apikeys import KeyRecord, decode_record, encode_record
from doq.queues.codec import decode_batch
from doq.queues.commands import (
    CommandBatch,
    CreateJoinToken,
    CreateKey,
    RestoreAbort,
    RestoreChunk,
    RestoreCommand,
    RestoreCommit,
    RevokeKey,
    UseJoinToken,
)
from doq.queues.machine import QueueMachine, Segment, UpperLoadError
from doq.queues.model import GroupStats, MessageState, MessageView, QueueInfo
from doq.queues.redrive import RedriveTask
from doq.storage.chunks import decode_chunk
from doq.storage.digest import digest_of_stored
from doq.storage.env import open_db, sync_meta
from doq.storage.mapped import prefetch_file, release_mapped_pages

_V = struct.Struct(">Q")
APPLIED_KEY = b"\x00applied"
HORIZON_KEY = b"\x00horizon"
VOFFSET_KEY = b"\x00voffset"  # version = log index + this (set by a restore's commit)
STAGE_KEY = b"\x00rstage"  # the staged restore: _STAGE + restore id
STAGE_CHUNK = b"\x00rchunk"  # + u32 BE seq -> a staged chunk's payload
_STAGE = struct.Struct(">IB")  # chunks staged (the next seq), broken flag
_SEQ = struct.Struct(">I")
_RESTORE_TYPES = frozenset((RestoreChunk, RestoreCommit, RestoreAbort))
_KEY_TYPES = frozenset((CreateKey, RevokeKey, CreateJoinToken, UseJoinToken))
MAX_RESTORE_VERSION = 2**63  # a restore's to_version is below it: later versions stay < 2**64
# the longest record key: LMDB's key limit (511 B, a constant of the library) less the u64
# version prefix of the versions and tombstones indexes (the machine's keys stay far below)
MAX_RECORD_KEY_BYTES = 511 - _V.size
CLUSTER_KEY = b"\x00cluster"
MAX_CLUSTER_ID_BYTES = 128
PRUNE_EVERY = 1024
# stale versions entries are collected once there are MIN_COLLECT of them and at least
# 1/COLLECT_FRACTION of the index (each collection rewrites most pages of the index: the
# larger the fraction, the fewer page writes per entry, the larger the index meanwhile)
MIN_COLLECT = 1 << 16
COLLECT_FRACTION = 8
# the bodies of deleted messages are removed once MIN_COMPACT of them wait, and at least
# 1/COMPACT_FRACTION of the bodies kept (each compaction rewrites most pages of the bodies;
# a quarter: at most a third more bodies than live ones, and their keys in `_TxnSink.gone`)
MIN_COMPACT = 1 << 16
COMPACT_FRACTION = 4
SWEEP_CHUNK = 1 << 14  # versions entries a commit removes at most, of a collection
SWEEP_GATHER = 1 << 14  # notes a commit reads (and sorts) at most, of a collection
SWEEP_VISIT = 1 << 15  # bodies a commit walks over (or notes it drops) at most, of a compaction
DEFAULT_TOMBSTONE_RETENTION = 1_000_000
# a start (`StateStore(parallel_load_min=N)`) with at least N message records loads the
# upper part of them in a second process (`doq.storage.load_worker`) while it loads the rest
PARALLEL_LOAD_MIN = 500_000
# a worker that shows no progress (a byte on its standard error per chunk run: it writes
# one when it starts and every `load_worker.PROGRESS_CHUNKS` chunks) for this long is killed
LOAD_WORKER_STALL_S = 30.0
# probes of a queue's ids (`split_key`) to tell its records' density
SPLIT_PROBES = 16
LOAD_WORKER_MAGIC = b"DOQLOAD2"
# the share (numerator, denominator) of the message records the start loads itself: half.
# The worker first starts an interpreter and imports (~0.4 s CPU) and distributes its part's
# ready pairs into ranges; the start distributes its own and does the server's later
# imports (`meanwhile`, ~1 s) before it waits: ~0.5-1 s more CPU on the start's side
# (before those two: 55 %, with which the start waited ~0.13 s; docs/benchmarks.md, boot14)
SPLIT_AT = (1, 2)
# message records read because their delay ended (`QueueMachine.take_due_reads`) after which
# a commit lets go of the data file's pages this process mapped (`release_mapped_pages`)
RELEASE_AFTER_DUE_READS = 16384
DUMP_MAGIC = b"DOQSTATE1"
_DUMP_REC = struct.Struct(">BII")
# dump order: (dump tag, db name); the versions index is derived, so not dumped
_DUMPED = ((1, b"state_meta"), (2, b"state_queues"), (3, b"state_messages"),
           (4, b"state_dedup"), (5, b"state_tombstones"))
Record = tuple[bytes, bytes | None, int]  # (key, payload or None for a tombstone, version)
log = logging.getLogger("doq.storage")


class StoreBroken(RuntimeError):
    """A failed write could not be rolled back in memory: the store refuses writes until a
    successful `rebuild()` (restart the process)."""


@dataclass(frozen=True, slots=True)
class RestoreOutcome:
    """The result of an applied `RestoreCommit`: what it wrote, and the state's version
    right after it (>= the chain's to_version)."""

    records: int
    tombstones: int
    last_version: int  # greatest record version restored
    to_version: int


class StateRead(NamedTuple):
    """One read transaction's view for a Raft snapshot (see `StateStore.open_read`)."""

    applied_index: int
    version: int  # applied_index + version offset
    store_keys: dict[bytes, bytes]  # replicated store keys (all but the applied index)
    records: Iterator[tuple[bytes, bytes | None, int]]  # every record and tombstone (since 0)


class _Tally:
    """Counts the records a restore writes."""

    def __init__(self) -> None:
        self.records = self.tombstones = self.last_version = 0

    def count(self, records: Iterable[Record]) -> Iterator[Record]:
        for rec in records:
            self.records += 1
            self.tombstones += rec[1] is None
            self.last_version = max(self.last_version, rec[2])
            yield rec


class _Stage(NamedTuple):
    restore_id: bytes
    next_seq: int
    broken: bool


class QueueView(NamedTuple):
    info: QueueInfo
    deliverable: int  # messages a dequeue could take now (an upper bound for fair queues)


@dataclass(frozen=True, slots=True)
class StateView:
    """What readers see: one committed state, never mutated once published."""

    applied_index: int = 0
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    next_due_ms: int | None = None
    redrives: Mapping[str, RedriveTask] = field(default_factory=dict)  # by dead-letter queue


_NONE_GONE: frozenset[bytes] = frozenset()
_LS, _LE = R.LEASE_AT + 8, R.LEASE_END + 8  # the lease fields in a stored value (after its version)
_MSG = K.MESSAGE


def _compose(body: bytes, lease: bytes | None) -> bytes:
    """The stored value (version + record) of a message: its body in state_messages with
    the lease fields and version of its state_leases entry, if it has one."""
    if lease is None:
        return body
    return lease[:8] + body[8:_LS] + lease[8:] + body[_LE:]


def machine_records(txn: Any, dbs: Mapping[bytes, Any], *, dedups: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """(key, record) of every record `QueueMachine.load` takes but the messages: the meta
    record, queues, group and redrive records, and (`dedups`) the dedup records."""
    names = (b"state_meta", b"state_queues", b"state_dedup") if dedups else (b"state_meta", b"state_queues")
    for name in names:
        for k, v in txn.cursor(db=dbs[name]).iternext():
            if name != b"state_meta" or k[:1] != b"\x00":
                yield k, v[8:]


def message_overrides(txn: Any, bodies: Any, leases: Any, gone: Iterable[bytes],
                      start: bytes = b"") -> dict[bytes, bytes | None]:
    """The messages whose record is not their body in state_messages, from key `start` on:
    None for those noted gone, the body composed with its lease entry for the leased."""
    overrides: dict[bytes, bytes | None] = dict.fromkeys(k for k in gone if k >= start)
    cur = txn.cursor(db=leases)
    if cur.set_range(start):
        for k, lease in cur.iternext():
            body = txn.get(k, db=bodies)
            if body is not None and k not in overrides:
                overrides[k] = _compose(body, lease)
    return overrides


def split_key(txn: Any, bodies: Any) -> bytes | None:
    """`split_point`'s key."""
    point = split_point(txn, bodies)
    return None if point is None else point[0]


def split_point(txn: Any, bodies: Any) -> tuple[bytes, int] | None:
    """A message key splitting state_messages into a lower part for the start and an upper
    part for the load worker, near `SPLIT_AT` of the records, and about how many records
    the queue holding it has (both processes distribute their part of its ready pairs into
    ranges for that many: `QueueMachine.load`'s `split_records`). LMDB has no rank: each
    queue's records are estimated from its first and last ids (two seeks) and, for a queue
    spanning more than 1/64 of all the ids, their density from `SPLIT_PROBES` seeks at
    even steps (the mean distance from a probed id to the next record's: ids are global,
    so a queue holding an old and a new message spans many ids and few records). None:
    one record or none."""
    cur = txn.cursor(db=bodies)
    spans: list[tuple[bytes, int, int]] = []  # (queue's key prefix, first id, last id)
    at = cur.first()
    while at:
        first = cur.key()
        prefix = first[:-8]
        if len(first) < 9:
            return None
        if cur.set_range(prefix + b"\xff" * 8 + b"\x00"):
            cur.prev()
        else:
            cur.last()
        last = cur.key()
        spans.append((prefix, int.from_bytes(first[-8:], "big"), int.from_bytes(last[-8:], "big")))
        at = cur.next()
    all_ids = sum(b - a + 1 for _, a, b in spans)
    counts = [_records_in(cur, prefix, a, b) if (b - a + 1) * 64 > all_ids else b - a + 1
              for prefix, a, b in spans]
    total = sum(counts)
    if total < 2:
        return None
    left = min(total - 1, max(1, total * SPLIT_AT[0] // SPLIT_AT[1]))
    for (prefix, a, b), n in zip(spans, counts, strict=True):
        if left < n:  # the ids taken as evenly spread over the queue's span
            return prefix + (a + left * (b - a + 1) // n).to_bytes(8, "big"), n
        left -= n
    return None


def _records_in(cur: Any, prefix: bytes, first: int, last: int) -> int:
    """About how many records queue `prefix` holds between its `first` and `last` ids (both
    records): the span over (1 + the mean gap from `SPLIT_PROBES` ids at even steps to the
    next record's id, a geometric gap's mean for ids kept at random), at least 2."""
    span = last - first + 1
    gaps = 0
    for i in range(SPLIT_PROBES):
        probe = first + span * i // SPLIT_PROBES
        if cur.set_range(prefix + probe.to_bytes(8, "big")) and cur.key()[:-8] == prefix:
            gaps += int.from_bytes(cur.key()[-8:], "big") - probe
    return max(2, min(span, round(span / (1 + gaps / SPLIT_PROBES))))


def cpus_allowed(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may use: its affinity, lowered by a cgroup (v2) CPU quota
    (`cpu_max`: "QUOTA PERIOD" or "max PERIOD", a container's limit) when there is one."""
    affinity = getattr(os, "sched_getaffinity", None)
    n = len(affinity(0)) if affinity is not None else 1
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


class _LoadWorker:
    """A `doq.storage.load_worker` process loading the message records from `split` on
    (`QueueMachine.load`'s `upper`). A subprocess, never a fork: an LMDB environment may
    not be used across a fork."""

    module = "doq.storage.load_worker"  # what runs (`python -m`; tests run others)

    def __init__(self, env_path: str, split: bytes, txn_id: int, split_records: int) -> None:
        self.split = split
        self.txn_id = txn_id
        self.split_records = split_records
        import doq  # the worker imports the same doq as this process
        root = os.path.dirname(os.path.dirname(os.path.abspath(doq.__file__)))
        env = dict(os.environ)
        if root not in _site_dirs():  # a checkout: ahead of anything installed (not ahead of the stdlib otherwise)
            env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # its answer and errors go to unlinked files, read once it exited: no pipe to drain
        # meanwhile, and one read of the answer (not a heap of small reads kept by the
        # allocator after the load); its progress is the size of its standard error's file
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 - closed by `close`
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 - closed by `close`
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", self.module, env_path, split.hex(), str(txn_id), str(split_records)],
                stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err, env=env)
        except BaseException:
            self.out.close()
            self.err.close()
            raise

    def segments(self) -> list[Segment]:
        """The worker's segments, once it is done: raises `RuntimeError` if it failed,
        answered something else, or showed no progress for `LOAD_WORKER_STALL_S` (a
        worker slower than the start is waited for while it progresses)."""
        seen, since = -1, time.monotonic()
        while True:
            try:
                status = self.proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                size = os.fstat(self.err.fileno()).st_size
                if size != seen:
                    seen, since = size, time.monotonic()
                elif time.monotonic() - since > LOAD_WORKER_STALL_S:
                    raise RuntimeError(f"no progress in {LOAD_WORKER_STALL_S:.0f} s") from None
        if status != 0:
            self.err.seek(0)
            tail = self.err.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"exit status {status}: {tail[0][-500:]}")
        self.out.seek(0)
        out = self.out.read()
        try:
            magic, txn_id, segs = marshal.loads(out)
        except (ValueError, EOFError, TypeError) as e:
            raise RuntimeError(f"unreadable answer ({e})") from None
        finally:
            del out
        if magic != LOAD_WORKER_MAGIC or txn_id != self.txn_id or not isinstance(segs, list):
            raise RuntimeError("an answer of another kind or of another transaction")
        return segs

    def close(self) -> None:
        """Kill the worker if it still runs, reap it, and drop its files."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.out.close()
        self.err.close()


def _site_dirs() -> set[str]:
    """The directories this interpreter finds installed packages in (a worker started with
    `-P` has them on its path without being told)."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs.update(getattr(site, "getsitepackages", list)())
    return {os.path.abspath(d) for d in dirs}


def _scattered(keys: list[bytes]) -> bool:
    """Message keys (of one queue) spread over more than 4 ids per key: removing or
    rewriting them in place would write about a page each."""
    if len(keys) < 2:
        return False
    lo, hi = min(keys), max(keys)  # a queue's keys sort by id (its prefix, then u64 BE)
    if len(lo) != len(hi) or lo[:-8] != hi[:-8]:
        return True  # keys of several queues
    return _V.unpack_from(hi, len(hi) - 8)[0] - _V.unpack_from(lo, len(lo) - 8)[0] > 4 * len(keys)


def _adjacent(entries: list[bytes]) -> bool:
    """Versions entries (version + key) that are (nearly) adjacent in the index, so that
    deleting them in place writes few pages: at least 8 per version, and all of one
    version (a batch's writes, e.g. the deliveries an ack ends) or, of messages, not
    scattered by id (a version's message entries follow their ids: entries of several
    versions picked across the id range, e.g. a fair queue's round-robin over groups
    filled as blocks, would each write a page)."""
    versions = {e[:8] for e in entries}
    if len(entries) < 8 * len(versions):
        return False
    return len(versions) == 1 or entries[0][8] != _MSG or not _scattered([e[8:] for e in entries])


class _TxnSink:
    """The machine's `Store`, bound to the caller's write txn and the entry's version.

    Messages are stored by id but delivered in priority (or round-robin) order: a
    delivery, an ack or a rewrite of a versions entry done in place would write about one
    page per message. So, for a call whose message keys are scattered (`_scattered`; a
    call over adjacent ids, e.g. a queue delivered in id order, writes in place):

    - Leases: a message record rewritten in its lease fields only (`R.lease_only`: a
      delivery, a touch, a return without new priority or delay) keeps its body in
      state_messages and gets (or replaces) an entry in state_leases: message key ->
      version + the lease fields. The record is the body with those fields, at that
      version (`_compose`). A lease entry has no versions entry: readers of changes
      merge the lease table in (`StateStore._indexed`). Any other write of a message
      record writes the body and drops its lease entry. The lease table holds few
      entries (messages in flight), so it has few pages.
    - Deletes: the body stays, and the key is noted in state_gone (version + key: an
      append) and in `gone`; readers leave it out. `StateStore._sweep` removes the noted
      bodies in key order, in chunks, each with its versions entry.
    - Versions: a body's versions entry stays while the body does (leased or gone, its
      record is at another version or none: readers skip it), so a delivery and an ack
      touch no versions entry at all. Another versions entry that stops being live (a
      body rewritten or removed in place, a record of another kind) is noted in
      state_stale (this version + the entry: an append) unless the entries of the call
      are adjacent in the index (`_adjacent`) or of this very version (the same key may
      be written again in this version); `StateStore._sweep` deletes the noted entries
      in key order, in chunks. Readers of the index skip an entry whose record is
      absent or at another version.

    Every read of a message composes it, so the records, their versions, backups,
    digests and dumps are what they would be with every write in place. `lazy=False`
    (a restore's sink) writes everything in place: records may then come in any order."""

    __slots__ = ("txn", "ver", "dbs", "versions", "tombs", "stale", "leases", "gone_db", "n_stale", "gone",
                 "leased", "legacy", "lazy")

    def __init__(self, dbs: dict[int, Any], versions: Any, tombs: Any, stale: Any, leases: Any,
                 gone_db: Any, *, lazy: bool = True) -> None:
        self.txn: Any = None  # lmdb.Transaction (stubs type values as bytes | memoryview)
        self.ver = _V.pack(0)
        self.dbs = dbs
        self.versions = versions
        self.tombs = tombs
        self.stale = stale
        self.leases = leases
        self.gone_db = gone_db
        self.lazy = lazy
        self.n_stale = 0  # entries noted in state_stale (an upper bound after an abort)
        self.gone: set[bytes] = set()  # message keys noted in state_gone (see StateStore)
        self.leased: set[bytes] = set()  # message keys with a state_leases entry (writer's copy)
        # those of `leased` whose entry may have a versions entry (written before this load:
        # an earlier layout indexed leases; unversioned when the lease goes or is replaced)
        self.legacy: set[bytes] = set()

    def _unversion(self, entries: list[bytes]) -> None:
        """Versions entries (version + key) no longer live: see the class docstring."""
        if not entries:
            return
        txn, ver = self.txn, self.ver
        if not self.lazy or _adjacent(entries):
            _walk(txn.cursor(db=self.versions), sorted(entries), pop=True)
            return
        now = [e for e in entries if e[:8] == ver]
        if now:
            drop = txn.delete
            for e in now:
                drop(e, db=self.versions)
            if len(now) == len(entries):
                return
            entries = [e for e in entries if e[:8] != ver]
        txn.cursor(db=self.stale).putmulti([(ver + e, b"") for e in entries])
        self.n_stale += len(entries)

    def _stored(self, key: bytes) -> bytes | None:
        """The stored value (version + record) of `key`, or None."""
        v = self.txn.get(key, db=self.dbs[key[0]])
        if v is None or key[0] != _MSG:
            return v  # type: ignore[no-any-return]
        if key in self.gone:
            return None
        return _compose(v, self.txn.get(key, db=self.leases)) if key in self.leased else v  # type: ignore[no-any-return]

    def get(self, key: bytes) -> bytes | None:
        assert self.txn is not None
        v = self._stored(key)
        return None if v is None else v[8:]

    def put(self, key: bytes, value: bytes) -> None:
        txn = self.txn
        assert txn is not None
        ver = self.ver
        if key[0] == _MSG:
            self._put_message(key, value)
            return
        old = txn.replace(key, ver + value, db=self.dbs[key[0]])
        if old is not None:
            ov = old[:8]
            if ov == ver:
                return
            self._unversion([ov + key])
        txn.put(ver + key, b"", db=self.versions)

    def _put_message(self, key: bytes, value: bytes) -> None:
        """`put` of a message record: its lease fields only (an existing record, lazy) in
        state_leases, the body's versions entry kept; else its body, the body's and the
        lease's old versions entries unversioned (see the class docstring)."""
        txn, ver, leases = self.txn, self.ver, self.leases
        body = txn.get(key, db=self.dbs[_MSG])
        lease = txn.get(key, db=leases) if body is not None and key in self.leased else None
        was_gone = body is not None and key in self.gone
        stale: list[bytes] = []
        if lease is not None and key in self.legacy:
            self.legacy.discard(key)
            stale.append(lease[:8] + key)
        if body is not None and not was_gone and self.lazy and R.lease_only(_compose(body, lease)[8:], value):
            txn.put(key, ver + value[R.LEASE_AT : R.LEASE_END], db=leases)
            self.leased.add(key)
            self._unversion(stale)
            return  # a lease has no versions entry (`StateStore._indexed` reads the lease table)
        txn.put(key, ver + value, db=self.dbs[_MSG])
        if body is not None and body[:8] != ver:
            stale.append(body[:8] + key)
        if lease is not None:
            txn.delete(key, db=leases)
            self.leased.discard(key)
        if was_gone:  # a deleted message written again (only a restore can)
            self.gone.discard(key)
            cur = txn.cursor(db=self.gone_db)
            for g in list(cur.iternext(values=False)):
                if g[8:] == key:
                    txn.delete(g, db=self.gone_db)
        self._unversion(stale)
        txn.put(ver + key, b"", db=self.versions)

    def insert(self, key: bytes, value: bytes) -> None:
        """`put` of a key that does not exist (no old value to read, no old version)."""
        txn = self.txn
        assert txn is not None
        ver = self.ver
        txn.put(key, ver + value, db=self.dbs[key[0]])
        txn.put(ver + key, b"", db=self.versions)

    def insert_many(self, keys: list[bytes], head: bytes, tails: list[bytes]) -> None:
        """`insert` of `keys[i]` = `head + tails[i]`, one C call per database."""
        txn = self.txn
        assert txn is not None
        if not keys:
            return
        ver = self.ver
        prefix = ver + head
        txn.cursor(db=self.dbs[keys[0][0]]).putmulti(zip(keys, [prefix + t for t in tails], strict=True))
        txn.cursor(db=self.versions).putmulti([(ver + k, b"") for k in keys])

    def _remove(self, keys: list[bytes]) -> list[bytes | None]:
        """Delete `keys` (one kind; distinct or not); their stored values before (None if
        absent). Messages: composed with their lease entries (removed), and, scattered
        ones, noted gone instead of removed, the body's versions entry left for the
        compaction (see the class docstring)."""
        txn = self.txn
        kind = keys[0][0]
        if kind != _MSG:
            olds = _walk(txn.cursor(db=self.dbs[kind]), keys, pop=True)
            gone = [(k, o) for k, o in zip(keys, olds, strict=True) if o is not None]
            self._unversion([o[:8] + k for k, o in gone])
        else:
            olds, gone = self._remove_messages(keys)
        if gone:
            ver = self.ver
            txn.cursor(db=self.tombs).putmulti([(ver + k, b"") for k, _ in gone])
        return olds

    def _remove_messages(self, keys: list[bytes]) -> tuple[list[bytes | None], list[tuple[bytes, bytes]]]:
        """`_remove` of message keys: (the stored values before, the (key, value) of
        those that existed)."""
        txn = self.txn
        note = self.lazy and _scattered(keys)
        bodies = _walk(txn.cursor(db=self.dbs[_MSG]), keys, pop=not note)
        pop, leases, noted, leased, legacy, ver = txn.pop, self.leases, self.gone, self.leased, self.legacy, self.ver
        out: list[bytes | None] = []
        fresh = []
        stale = []
        for k, o in zip(keys, bodies, strict=True):
            if o is None:
                out.append(None)
                continue
            if k in noted:
                if not note:  # its body removed now, not by the compaction
                    stale.append(o[:8] + k)
                out.append(None)
                continue
            if note:
                noted.add(k)
                fresh.append((ver + k, b""))
            else:
                stale.append(o[:8] + k)
            if k in leased:
                leased.discard(k)
                lease = pop(k, db=leases)
                if k in legacy:
                    legacy.discard(k)
                    stale.append(lease[:8] + k)
                o = _compose(o, lease)
            out.append(o)
        if fresh:
            txn.cursor(db=self.gone_db).putmulti(fresh)
        self._unversion(stale)
        return out, [(k, o) for k, o in zip(keys, out, strict=True) if o is not None]

    def delete(self, key: bytes) -> None:
        assert self.txn is not None
        self._remove([key])

    def delete_many(self, keys: list[bytes]) -> None:
        """`delete` of each key (keys of one kind), the tombstones in one C call. Scattered
        messages with a lease entry (an ack of deliveries) are noted gone without reading
        their bodies: the entry holds their version."""
        assert self.txn is not None
        if not keys:
            return
        if self.leased and keys[0][0] == _MSG and self.lazy and _scattered(keys):
            keys = self._note_leased_gone(keys)
            if not keys:
                return
        self._remove(keys)

    def _note_leased_gone(self, keys: list[bytes]) -> list[bytes]:
        """Delete the messages of `keys` that have a lease entry (scattered: noted gone,
        see the class docstring), reading only that entry; the other keys, to delete."""
        txn, leased, noted, ver = self.txn, self.leased, self.gone, self.ver
        done = sorted(leased.intersection(keys).difference(noted))  # set operations in C
        if not done:
            return keys
        leased.difference_update(done)
        noted.update(done)
        legacy = self.legacy
        if legacy and not legacy.isdisjoint(done):  # their versions entries go too
            olds = _walk(txn.cursor(db=self.leases), done, pop=True)
            self._unversion([o[:8] + k for k, o in zip(done, olds, strict=True) if k in legacy])  # type: ignore[index]
            legacy.difference_update(done)
        else:
            _drop_keys(txn.cursor(db=self.leases), done)
        notes = list(zip(map(ver.__add__, done), itertools.repeat(b"")))  # a gone note and a tombstone: the same (version + key)
        txn.cursor(db=self.gone_db).putmulti(notes)
        txn.cursor(db=self.tombs).putmulti(notes)
        return [] if len(done) == len(keys) else [k for k in keys if k not in noted]

    def rewrite_many(self, keys: list[bytes], edit: Callable[[list[bytes]], list[bytes]], *,
                     lease_only: bool = False) -> None:
        """`put` of `edit(old records)` over existing keys of one kind: the records read
        through a cursor; the bodies (or, lease fields only of scattered messages, the
        lease entries) and the new version entries written by one C call per database.
        `lease_only`: every edit changes lease fields only (not compared again)."""
        txn = self.txn
        assert txn is not None
        if not keys:
            return
        kind = keys[0][0]
        db = self.dbs[kind]
        scattered = kind == _MSG and self.lazy and _scattered(keys)
        bodies: list[bytes]
        if scattered:  # a seek per key anyway: `txn.get` per key, driven by `map` (less CPU than `getmulti`)
            bodies = list(map(txn.get, keys, itertools.repeat(None), itertools.repeat(db)))  # type: ignore[arg-type]
            if None in bodies:
                raise KeyError("rewrite_many of a record that does not exist")
        else:
            bodies = _walk(txn.cursor(db=db), keys, pop=False)  # type: ignore[assignment]
        leased = self.leased
        olds = bodies
        held: dict[bytes, bytes] = {}  # the lease entries of the keys that have one
        if kind == _MSG and leased and not leased.isdisjoint(keys):
            get, leases = txn.get, self.leases
            held = {k: get(k, db=leases) for k in keys if k in leased}
            olds = [_compose(o, held[k]) if k in held else o for k, o in zip(keys, bodies, strict=True)]
        news = edit([o[8:] for o in olds])
        ver = self.ver
        at, end = R.LEASE_AT, R.LEASE_END
        stale: list[bytes]
        legacy = self.legacy
        stale = []
        if held and legacy and not legacy.isdisjoint(held):  # replaced or dropped leases of before
            stale = [v[:8] + k for k, v in held.items() if k in legacy]
            legacy.difference_update(held)
        if scattered and lease_only:
            # lease entries only: no versions entry (the bodies' stay, unversioned with the body)
            txn.cursor(db=self.leases).putmulti([(k, ver + n[at:end]) for k, n in zip(keys, news, strict=True)])
            leased.update(keys)
            self._unversion(stale)
            return
        if scattered:
            is_lease = R.lease_only
            leases = self.leases
            bodies_out = []
            lease_items = []
            for k, b, o, n in zip(keys, bodies, olds, news, strict=True):
                if is_lease(o[8:], n):
                    lease_items.append((k, ver + n[at:end]))
                    leased.add(k)
                else:
                    bodies_out.append((k, ver + n))
                    if b[:8] != ver:
                        stale.append(b[:8] + k)
                    if k in held:
                        txn.delete(k, db=leases)
                        leased.discard(k)
            if lease_items:
                txn.cursor(db=leases).putmulti(lease_items)
            if bodies_out:
                txn.cursor(db=db).putmulti(bodies_out)
                keys = [k for k, _ in bodies_out]
            else:
                keys = []
        else:
            txn.cursor(db=db).putmulti(zip(keys, [ver + v for v in news], strict=True))
            stale += [b[:8] + k for k, b in zip(keys, bodies, strict=True) if b[:8] != ver]
            if held:
                drop, leases = txn.delete, self.leases
                for k in held:
                    drop(k, db=leases)
                    leased.discard(k)
        self._unversion(stale)
        if keys:
            txn.cursor(db=self.versions).putmulti([(ver + k, b"") for k in keys])

    def pop_many(self, keys: list[bytes]) -> list[bytes | None]:
        """`delete` of each key (one kind) through cursors; the tombstones written by one C call."""
        assert self.txn is not None
        if not keys:
            return []
        return [None if o is None else o[8:] for o in self._remove(keys)]


def _walk(cur: Any, keys: list[bytes], *, pop: bool) -> list[bytes | None]:
    """The values of `keys` (None where absent), in order, read (and deleted if `pop`)
    through the cursor `cur`: a key right after the previous one needs no search from
    the root (ascending, adjacent keys are the fast case; any order is correct)."""
    if pop:
        # one C call per key, driven by `map` (no bytecode per key): `Cursor.pop` seeks
        # from where the cursor is (LMDB looks in the current page first), copies the
        # value and deletes the record; ~25 % less CPU than a Python loop of key(),
        # set_key(), value(), delete() for every 4th key of a table (a compaction)
        return list(map(cur.pop, keys))
    key, value, set_key, step = cur.key, cur.value, cur.set_key, cur.next
    out: list[bytes | None] = []
    ap = out.append
    for k in keys:
        if key() != k and not set_key(k):
            ap(None)
            continue
        ap(value())
        step()
    return out


def _drop_keys(cur: Any, keys: list[bytes]) -> None:
    """Delete `keys` (ascending; absent ones skipped) through the cursor `cur`: `_walk`
    with `pop`, without reading the values."""
    deque(map(cur.pop, keys), 0)


class _Compaction:
    """The removal under way of the bodies noted gone (`_TxnSink.gone`): a walk over
    state_messages in key order, from `at` (the next key to visit) to `end` (the last key
    when it started), `SWEEP_VISIT` keys per commit, deleting each body whose key is in
    the set (noted before the walk began or since), and its versions entry (the body's
    version + key: kept while the body was). No sort: the table's own order is the
    order of removal. Every key noted before version `upto` is at or before `end`, so once
    the walk is past `end` all of them are removed, and their notes (the first of
    state_gone) are dropped, `SWEEP_VISIT` per commit too (`drop_notes`)."""

    __slots__ = ("at", "end", "upto", "walked")

    def __init__(self, end: bytes, upto: bytes) -> None:
        self.at = b""
        self.end = end
        self.upto = upto
        self.walked = False  # past `end`: dropping the notes

    def step(self, cur: Any, gone: set[bytes]) -> tuple[int, bool, list[bytes]]:
        """Visit up to `SWEEP_VISIT` keys through the cursor `cur` (of state_messages),
        deleting those in `gone` (and dropping them from it): (keys visited, walk done,
        the versions entries of the bodies deleted, ascending by key). The keys are read
        by one C iterator and told apart by a set filter, so the Python work is per body
        deleted, not per key visited."""
        if not cur.set_range(self.at):
            return 0, True, []
        keys = list(itertools.islice(cur.iternext(values=False), SWEEP_VISIT))
        cut = bisect.bisect_right(keys, self.end)
        done = cut < len(keys) or len(keys) < SWEEP_VISIT
        if not done:
            self.at = keys[-1] + b"\x00"  # the next key after the last visited
        hit = list(filter(gone.__contains__, keys[:cut] if cut < len(keys) else keys))
        if not hit:
            return cut, done, []
        gone.difference_update(hit)
        bodies = _walk(cur, hit, pop=True)
        return cut, done, [b[:8] + k for k, b in zip(hit, bodies, strict=True) if b is not None]

    def drop_notes(self, cur: Any, gone: set[bytes]) -> tuple[int, bool]:
        """Delete up to `SWEEP_VISIT` of the notes before `upto` through `cur` (of
        state_gone), their keys dropped from `gone` (their bodies are removed; a key
        noted by a data dir's notes whose body a compaction cut by a restart removed is
        forgotten so too): (notes dropped, all dropped)."""
        if not cur.first():
            return 0, True
        notes = list(itertools.islice(cur.iternext(values=False), SWEEP_VISIT))
        cut = bisect.bisect_left(notes, self.upto)
        gone.difference_update([k[8:] for k in notes[:cut]])
        if cut and cur.first():
            deque(itertools.starmap(cur.delete, itertools.repeat((), cut)), 0)  # the first `cut`, in C calls
        return cut, cut < len(notes) or len(notes) < SWEEP_VISIT


def _drop_first_notes(cur: Any, upto: bytes) -> tuple[int, bool]:
    """Delete up to `SWEEP_CHUNK` of the notes before version `upto` (the first keys)
    through `cur`: (notes dropped, all dropped)."""
    if not cur.first():
        return 0, True
    key, delete = cur.key, cur.delete
    dropped = 0
    while dropped < SWEEP_CHUNK:
        k = key()
        if not k or k >= upto:
            return dropped, True
        delete()
        dropped += 1
    k = key()
    return dropped, not k or k >= upto


class _Collection:
    """The removal under way of the versions entries noted stale before version `upto`
    (in state_stale: note version + entry). Two phases, each bounded per commit:
    gathering reads the next `SWEEP_GATHER` notes (from `at`) and sorts them into a run;
    then the runs are merged lazily (`heapq.merge`), `SWEEP_CHUNK` entries per commit
    taken in key order; then the notes before `upto` (the first of state_stale) are
    dropped, `SWEEP_CHUNK` per commit. No commit sorts all the notes at once."""

    __slots__ = ("at", "upto", "runs", "merged", "head", "taken")

    def __init__(self, upto: bytes) -> None:
        self.at = b""
        self.upto = upto
        self.runs: list[list[bytes]] = []
        self.merged: Iterator[bytes] | None = None  # set once every run is gathered
        self.head: list[bytes] = []  # the merge's next entry, read ahead by `take`
        self.taken = False  # every entry taken: dropping the notes (`_drop_first_notes`)

    def gather(self, cur: Any) -> int:
        """Read the next notes (before `upto`) through `cur` (of state_stale) into a
        sorted run; the count read. The last read starts the merge."""
        notes = list(itertools.islice(cur.iternext(values=False), SWEEP_GATHER)) if cur.set_range(self.at) else []
        cut = bisect.bisect_left(notes, self.upto)
        if cut:
            self.runs.append(sorted([bytes(k[8:]) for k in notes[:cut]]))
        if cut < SWEEP_GATHER:
            self.merged = heapq.merge(*self.runs)
            self.runs = []
        else:
            self.at = notes[-1] + b"\x00"  # the next key after the last read
        return cut

    def take(self) -> tuple[list[bytes], bool]:
        """The next (at most) `SWEEP_CHUNK` entries, ascending, and whether they are the
        last (the merge looks one entry ahead, kept for the next take)."""
        assert self.merged is not None
        chunk = self.head + list(itertools.islice(self.merged, SWEEP_CHUNK + 1 - len(self.head)))
        if len(chunk) <= SWEEP_CHUNK:
            return chunk, True
        self.head = [chunk.pop()]
        return chunk, False


class StateStore:
    """The node's replicated queue state. See the module docstring for the contracts."""

    def __init__(self, env: lmdb.Environment, *,
                 tombstone_retention: int = DEFAULT_TOMBSTONE_RETENTION,
                 parallel_load_min: int | None = None, meanwhile: Callable[[], None] | None = None) -> None:
        """`parallel_load_min`: this first load (a start: nothing else writes the
        environment meanwhile) loads the upper part of the message records in a second
        process when there are at least that many and this process may run on more than
        one CPU (`_load_machine`); None: on this one only. Later rebuilds (a failed write's,
        a restore's, a snapshot's) load on this process only. `meanwhile`: called once
        when such a load has read its own part, before it waits for the second process:
        the caller's work that needs no state (a server's later imports) done while the
        other CPU still loads; an exception it raises is logged and dropped."""
        self.env = env
        self._parallel_load_min = parallel_load_min
        self._meanwhile = meanwhile
        self.tombstone_retention = tombstone_retention
        self._db = {n: open_db(env, n) for _, n in _DUMPED}
        self._db[b"state_versions"] = open_db(env, b"state_versions")
        self._db[b"state_stale"] = open_db(env, b"state_stale")
        self._stale = self._db[b"state_stale"]
        self._db[b"state_leases"] = open_db(env, b"state_leases")
        self._leases = self._db[b"state_leases"]
        self._db[b"state_gone"] = open_db(env, b"state_gone")
        self._gone = self._db[b"state_gone"]
        self._meta = self._db[b"state_meta"]
        self._versions = self._db[b"state_versions"]
        self._tombs = self._db[b"state_tombstones"]
        self._kind_db = {
            K.META[0]: self._meta, K.QUEUE: self._db[b"state_queues"],
            K.MESSAGE: self._db[b"state_messages"], K.DEDUP: self._db[b"state_dedup"],
            K.JOIN_TOKEN: self._db[b"state_queues"],  # an older version's (doq.queues.keys): loaded, ignored
            K.REDRIVE: self._db[b"state_queues"],  # redrive tasks (doq.queues.redrive)
            K.GROUP: self._db[b"state_queues"],  # fair-queue group policies (doq.queues.group_policy)
        }
        self._sink = _TxnSink(self._kind_db, self._versions, self._tombs, self._stale, self._leases, self._gone)
        self._compacting: _Compaction | None = None  # the removals under way (`_sweep`)
        self._collecting: _Collection | None = None
        self.sweep_keys = 0  # keys the last `_sweep` visited, read or took (bounded per commit)
        self.machine = QueueMachine(self._sink)
        self.applied_index = 0
        self.version_offset = 0
        self.cluster_id = ""  # "" in a state from before cluster ids (or a joiner not yet caught up)
        self._broken = False
        self._reload_view = True  # the next publish rebuilds the view of every queue
        self._due_reads = 0  # records read by ended delays since the last release of mapped pages
        self._keys_changed = True  # the next publish publishes the key table
        self.view = StateView()
        # direct readers of LMDB and the applies answered before their commit
        # (`publish_applied`, `wait_committed`)
        self._commit_cond = threading.Condition()
        self._committed_index = 0  # the applied index LMDB holds (as of the last commit or load)
        self._answered_index = 0  # the highest applied index published before its commit
        self._writer_ident: int | None = None  # the thread of the last `write()`
        self.readers_waiting = 0  # direct readers waiting in `wait_committed` (tests watch it)
        # the write transaction held open across writes (`write(hold=...)`), and who is
        # asked to commit it when a direct reader waits for it from another thread
        self._held: lmdb.Transaction | None = None
        self.commit_wanted: Callable[[], None] | None = None
        # the owner's hooks, on the writer thread: a held write committed by
        # `commit_held` (not by a `write()`), and a failed commit or write that lost the
        # changes of a held write (memory rebuilt from LMDB: `on_lost`)
        self.on_held_committed: Callable[[float], None] | None = None  # (the commit's seconds)
        self.on_lost: Callable[[], None] | None = None
        self._failed_commits = 0  # of held writes, under `_commit_cond` (`wait_committed`)
        self._parallel = parallel_load_min is not None  # the first load only
        try:
            self.rebuild()
        finally:
            self._parallel = False

    @property
    def broken(self) -> bool:
        """A failed write could not be undone in memory (`StoreBroken`): nothing may be
        applied until a successful `rebuild()` or a restart."""
        return self._broken

    # -- writes ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def write(self, *, durable: bool = True,
              hold: Callable[[], bool] | None = None) -> Iterator[lmdb.Transaction]:
        """One write transaction: the block's changes commit when it ends, durable (both
        syncs: `sync_meta`) unless `durable=False` (data pages synced, the meta page
        written but not synced until the next commit's sync: an OS crash while it is the
        last commit may undo it, never leave the store half-written; for a write whose
        changes can be derived again, e.g. applying entries already durable in the Raft
        log), and readers then see them (a new `view`). If the block or the commit raises,
        the transaction is aborted and memory rebuilt from LMDB: nothing changed, the error
        propagates, and the store takes the next write. Raises `StoreBroken` if even that
        rebuild fails.

        `hold` (asked when the block ended, for a write with `durable=False` only): True
        leaves the transaction open, **held**: its changes are in memory and published to
        readers (the view at the new `applied_index`; the direct readers of LMDB wait for
        the commit, `wait_committed`), and the next `write()` continues it; the first one
        that does not hold commits them all, or `commit_held()` does. Only for changes that
        can be derived again: a failure of the block or of the commit of a continued
        transaction loses every change since the last commit (memory rebuilt from LMDB,
        `applied_index` back to the committed one), and the caller must apply them again
        (entries durable in the Raft log). Every write on one thread (the writer's)."""
        self._writer_ident = threading.get_ident()
        txn, self._held = self._held, None
        continued = txn is not None
        if txn is None:
            txn = self.env.begin(write=True)
        try:
            yield txn
            kept = False
            if not durable and hold is not None and hold():
                with self._commit_cond:  # a direct reader waiting (`wait_committed`): commit
                    kept = not self.readers_waiting
                    if kept:
                        self._held = txn
                        self._answered_index = max(self._answered_index, self.applied_index)
            if not kept:
                self._commit(txn)
                self._mark_committed()
        except BaseException:
            self._held = None
            txn.abort()
            try:
                # the readers' view stays: what it shows was answered, and the caller
                # applies it again (`write`'s contract) before the next view is published
                self.rebuild(publish=False)
            except Exception as e:
                self._broken = True
                raise StoreBroken(f"state store out of sync with LMDB after a failed write: {e}") from e
            if continued:
                self._lost()
            raise
        if durable:
            try:
                sync_meta(self.env)
            except Exception as e:  # committed, maybe not durable: nothing may answer it
                self._broken = True
                raise StoreBroken(f"committed, but its sync failed: {e}") from e
        try:
            self._publish()
        except Exception as e:
            self._broken = True
            raise StoreBroken(f"committed, but the readers' view could not be refreshed: {e}") from e
        self._due_reads += self.machine.take_due_reads()
        if self._due_reads >= RELEASE_AFTER_DUE_READS:
            # messages whose delay ended were read one by one, at random places of the file
            # (the first tick after a long stop: every message due meanwhile, ~200k after 2 h
            # of a 5M timestamp backlog, mapped ~1.3 GB of it): let go of those pages
            self._due_reads = 0
            release_mapped_pages(self._data_file())

    @property
    def held(self) -> bool:
        """Is a write transaction held open (`write(hold=...)`), its changes not committed?"""
        return self._held is not None

    @property
    def committed_index(self) -> int:
        """The applied index LMDB holds (as of the last commit or load)."""
        return self._committed_index

    def commit_held(self) -> bool:
        """Commit the held transaction, if any (writer thread); False if none; then
        `on_held_committed(seconds the commit took)`. As `write()` on failure: aborted, memory rebuilt from LMDB
        (every change since the last commit lost, to be applied again by the caller; the
        readers' view stays), `on_lost` called here, on the writer thread, before anything
        else runs there, the direct readers waiting for it woken (`wait_committed` raises
        `Unavailable`), the error raised."""
        txn, self._held = self._held, None
        if txn is None:
            return False
        t0 = time.perf_counter()
        try:
            self._commit(txn)
            self._mark_committed()
        except BaseException:
            txn.abort()
            try:
                self.rebuild(publish=False)  # the view stays, as in `write`
            except Exception as e:
                self._broken = True
                raise StoreBroken(f"state store out of sync with LMDB after a failed commit: {e}") from e
            self._lost()
            raise
        if self.on_held_committed is not None:
            self.on_held_committed(time.perf_counter() - t0)
        return True

    def _commit(self, txn: lmdb.Transaction) -> None:
        """Commit a write transaction (the one place `write` and `commit_held` do: tests
        plant a failed commit here)."""
        txn.commit()

    def _lost(self) -> None:
        """Writer thread: a failure (of its commit, or of the block of a write continuing
        it) lost the changes of a held write (memory rebuilt from LMDB, behind the
        published view): the direct readers waiting for them are woken to answer
        `Unavailable` (`wait_committed`) rather than wait out their timeout for a retry that
        needs this thread, and the owner is told (`on_lost`)."""
        with self._commit_cond:
            self._failed_commits += 1
            self._commit_cond.notify_all()
        if self.on_lost is not None:
            self.on_lost()

    @property
    def behind(self) -> bool:
        """Is memory behind the published view or an answer given before its commit
        (`publish_applied`): a failed write or commit rolled it back to LMDB, and the lost
        applies are not applied again yet? The readers of memory then
        answer `Unavailable` (`check_current`) rather than what was already superseded."""
        return self.applied_index < max(self.view.applied_index, self._answered_index)

    def check_current(self) -> None:
        """Raise `Unavailable` (retryable, APPLY_NOT_COMMITTED) while `behind`."""
        if self.behind:
            raise Unavailable("the state is being applied again after a failed commit; retry",
                              reason="APPLY_NOT_COMMITTED")

    def abort_held(self) -> None:
        """Drop the held transaction, if any, and rebuild memory from LMDB (writer thread;
        a node that failed and stops: its changes are applied again from the log at the
        next start). The readers' view stays (it shows what was answered)."""
        txn, self._held = self._held, None
        if txn is not None:
            txn.abort()
            self.rebuild(publish=False)

    def publish_applied(self) -> None:
        """Publish the view of what the open write has applied, before it commits (writer
        thread): for a Raft leader answering entries already durable on a quorum before its
        own commit. If that commit fails, memory is rebuilt and the next write applies the
        same entries again. The view's `applied_index` stays the committed one until the
        commit (what is durable here: reads that wait for an index wait for the commit)."""
        self._answered_index = max(self._answered_index, self.applied_index)
        self._publish(self.view.applied_index)

    def _mark_committed(self) -> None:
        """LMDB now holds `applied_index` (a commit, or a load from LMDB): wake the direct
        readers waiting for it (`wait_committed`)."""
        with self._commit_cond:
            self._committed_index = self.applied_index
            self._commit_cond.notify_all()

    def wait_committed(self, timeout_s: float = 10.0) -> None:
        """Return once LMDB holds every apply published before its commit
        (`publish_applied`: a Raft node answers entries durable in its log before the
        apply's LMDB commit), so a direct reader of LMDB (`get_message`, `peek`,
        `state_digest`, `iter_changes` and the backups, `is_empty`, `iter_dump`) sees at
        least what any answer told. Costs nothing when nothing waits for a commit. A held
        write (`write(hold=...)`) is committed: on the writer thread here and now, from
        another thread by its owner (`commit_wanted`; no write holds while a reader
        waits). On the writer thread with nothing held (its own commit would be waited
        for), after a failed commit there, or after `timeout_s` (a commit that failed and
        is being retried, e.g. a full disk), or at once when a held write's commit fails
        meanwhile (`commit_held`): raises `Unavailable` (retryable), never returns early."""
        target = self._answered_index
        if self._committed_index >= target:
            return
        if threading.get_ident() == self._writer_ident:
            if self._held is not None:  # held (`write(hold=...)`): committed here and now
                try:
                    self.commit_held()  # on failure its owner was told (`on_lost`)
                except Exception as e:
                    raise Unavailable(f"the state's last apply could not be committed: {e}",
                                      reason="APPLY_NOT_COMMITTED") from e
                if self._committed_index >= target:
                    return
            raise Unavailable("the state's last apply is not committed yet (a write failed and is "
                              "retried)", reason="APPLY_NOT_COMMITTED")
        with self._commit_cond:
            self.readers_waiting += 1  # from now on no write holds (`write`)
            ask = self._held is not None
            failures = self._failed_commits
        try:
            if ask and self.commit_wanted is not None:
                self.commit_wanted()  # the writer commits what it holds
            with self._commit_cond:
                if not self._commit_cond.wait_for(
                        lambda: self._committed_index >= target or self._failed_commits != failures, timeout_s):
                    raise Unavailable("the state's last apply is not committed yet (a write failed and "
                                      "is retried)", reason="APPLY_NOT_COMMITTED")
                if self._committed_index < target:
                    raise Unavailable("the state's last apply could not be committed (it is applied "
                                      "again and retried)", reason="APPLY_NOT_COMMITTED")
        finally:
            with self._commit_cond:
                self.readers_waiting -= 1

    def _publish(self, applied_index: int | None = None) -> None:
        """Publish the view of the committed state (writer thread, after a commit)."""
        m = self.machine
        changed = m.take_changed()
        if self._reload_view:
            queues: Mapping[str, QueueView] = {n: self._queue_view(n) for n in m.queues}
            self._reload_view = False
        elif changed:
            fresh = dict(self.view.queues)
            for name in changed:
                if name in m.queues:
                    fresh[name] = self._queue_view(name)
                else:
                    fresh.pop(name, None)
            queues = fresh
        else:
            queues = self.view.queues
        self.view = StateView(self.applied_index if applied_index is None else applied_index,
                              queues, m.next_due_ms(), m.redrive.tasks)
        if self._keys_changed:
            m.keys.publish()
            m.join_tokens.publish()
            self._keys_changed = False

    def keys(self) -> dict[str, KeyRecord]:
        """The client keys by id as last committed (an immutable snapshot; any thread)."""
        return self.machine.keys.snapshot()

    def join_tokens(self) -> dict[bytes, JT.TokenRecord]:
        """The join tokens by id as last committed (an immutable snapshot; any thread)."""
        return self.machine.join_tokens.snapshot()

    def _queue_view(self, name: str) -> QueueView:
        return QueueView(self.machine.queue_info(name), self.machine.deliverable(name))

    def _data_file(self) -> str:
        return os.path.join(self.env.path(), "data.mdb")

    # -- rebuild -------------------------------------------------------------------------
    def rebuild(self, txn: lmdb.Transaction | None = None, *, publish: bool = True) -> None:
        """Reload applied_index and the in-memory indexes from LMDB and publish the view
        (`publish=False`: the view published before stays, the next write publishes one
        rebuilt whole), or, inside `write()`, from its `txn` (published when that commits).
        Outside a write, the data file's used part is read into the page cache in file order
        while the load runs (`prefetch_file`), and the pages the load mapped are let go of
        afterwards (`doq.storage.mapped`: they stay in the page cache, no longer in this
        process's RSS)."""
        if txn is None:
            data_file = self._data_file()
            # the load reads every page in use: read from disk in file order meanwhile, not
            # one fault at a time in key order (`doq.storage.mapped`)
            prefetch = prefetch_file(data_file, (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"])
            try:
                with self.env.begin() as rtxn:
                    self._load(rtxn)
            finally:
                if prefetch is not None:  # done long since, unless most of the file is free pages
                    prefetch.stop()
            self._mark_committed()
            if publish:
                self._publish()
            # the load read every record: its pages need not stay charged to this process
            release_mapped_pages(data_file)
        else:
            self._load(txn)
        self._broken = False

    def _load(self, txn: lmdb.Transaction) -> None:
        """`_load_all` with the cyclic GC paused: the load makes millions of short-lived
        objects (records, chunks) and no cycles, and the collections they would trigger
        walk every object the process holds."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._load_all(txn)
        finally:
            if was_enabled:
                gc.enable()

    def _load_all(self, txn: lmdb.Transaction) -> None:
        self._broken = True
        self._reload_view = True
        self._keys_changed = True
        raw = txn.get(APPLIED_KEY, db=self._meta)
        self.applied_index = _V.unpack(raw)[0] if raw else 0
        raw = txn.get(VOFFSET_KEY, db=self._meta)
        self.version_offset = _V.unpack(raw)[0] if raw else 0
        raw = txn.get(CLUSTER_KEY, db=self._meta)
        self.cluster_id = bytes(raw).decode() if raw else ""
        self._sink.n_stale = txn.stat(self._stale)["entries"]
        self._sink.gone = {bytes(g[8:]) for g in txn.cursor(db=self._gone).iternext(values=False)}
        self._sink.leased = {bytes(k) for k in txn.cursor(db=self._leases).iternext(values=False)}
        self._sink.legacy = set(self._sink.leased)
        self._compacting = self._collecting = None
        self._load_machine(txn)
        self.machine.keys.load(list(self._key_records(txn)))
        self.machine.join_tokens.load(self._token_records(txn))

    def _load_machine(self, txn: Any) -> None:
        """`machine.load` of every record: the messages straight from their cursor (the
        version prefix skipped in place), composed with their lease entries and the gone
        ones left out through a small map of exceptions.

        A start's load (`parallel_load_min`) of many messages on a process that may use
        more than one CPU: a worker process (`doq.storage.load_worker`, started first)
        reads the records from a key near the middle (`split_key`) in its own read
        transaction, the same snapshot (its id checked: nothing writes during a start),
        while this one reads those before it; its columns are then joined after them
        (`QueueMachine.load`'s `upper`): the same state as one reading all. If the worker
        fails (exits, answers garbage or late), the load is done again here alone (logged);
        the worker is killed and reaped on every path."""
        worker = self._start_worker(txn) if self._parallel else None
        if worker is not None:
            try:
                self._load_messages(txn, worker)
                log.info("message records loaded on two processes (the second from key %s)", worker.split.hex())
                return
            except UpperLoadError as e:  # the worker's part failed (this process's own errors go up)
                log.warning("the load on two processes failed (%s): loading on one CPU", e.__cause__ or e)
            finally:
                worker.close()
                # a worker killed in its read transaction leaves its reader slot behind, which
                # would keep every page freed from then on from being reused
                self.env.reader_check()
        self._load_messages(txn, None)

    def _load_messages(self, txn: Any, worker: _LoadWorker | None) -> None:
        bodies = self._db[b"state_messages"]
        overrides = message_overrides(txn, bodies, self._leases, self._sink.gone) if (
            self._sink.gone or self._sink.leased) else {}
        msgs = txn.cursor(db=bodies).iternext()
        self.machine.load(machine_records(txn, self._db), msgs, 8, overrides or None, ordered=True,  # key order
                          stop=None if worker is None else worker.split,
                          upper=None if worker is None else functools.partial(self._upper, worker),
                          split_records=None if worker is None else worker.split_records)

    def _upper(self, worker: _LoadWorker) -> list[Segment]:
        """The worker's segments, once `meanwhile` has run (here: after the start's own
        part, with the other CPU still loading)."""
        if self._meanwhile is not None:
            try:
                self._meanwhile()
            except Exception as e:  # noqa: BLE001 - the caller's work, not the load's: it meets its error again later
                log.warning("the work beside the load failed: %s", e)
        return worker.segments()

    def _start_worker(self, txn: Any) -> _LoadWorker | None:
        """The worker of a start's load (see `_load_machine`), or None: too few messages,
        one CPU, nowhere to split, or it could not be started (logged)."""
        bodies = self._db[b"state_messages"]
        floor = self._parallel_load_min
        if floor is None or txn.stat(bodies)["entries"] < max(floor, 2) or cpus_allowed() < 2:
            return None
        point = split_point(txn, bodies)
        if point is None:
            return None
        try:
            return _LoadWorker(self.env.path(), point[0], txn.id(), point[1])
        except Exception as e:  # noqa: BLE001 - no interpreter to run, no temporary file, ...: load alone
            log.warning("the load's second process did not start (%s): loading on one CPU", e)
            return None

    def _key_records(self, txn: Any) -> Iterator[KeyRecord]:
        cur = txn.cursor(db=self._meta)
        if cur.set_range(KEY_PREFIX):
            for k, v in cur.iternext():
                if not k.startswith(KEY_PREFIX):
                    break
                yield decode_record(bytes(k[len(KEY_PREFIX):]).decode(), bytes(v))

    def _token_records(self, txn: Any) -> dict[bytes, JT.TokenRecord]:
        out = {}
        cur = txn.cursor(db=self._meta)
        if cur.set_range(JT.STORE_PREFIX):
            for k, v in cur.iternext():
                if not k.startswith(JT.STORE_PREFIX):
                    break
                out[bytes(k[len(JT.STORE_PREFIX):])] = JT.decode_record(bytes(v))
        return out

    def _flush_tokens(self, txn: Any) -> None:
        """Write the join tokens' changes into the meta database (inside the apply txn)."""
        for token_id, rec in self.machine.join_tokens.take_dirty().items():
            if rec is None:
                txn.delete(JT.STORE_PREFIX + token_id, db=self._meta)
            else:
                txn.put(JT.STORE_PREFIX + token_id, JT.encode_record(rec), db=self._meta)
        self._keys_changed = True

    def _flush_keys(self, txn: Any) -> None:
        """Write the key table's changes into the meta database (inside the apply txn)."""
        for key_id, rec in self.machine.keys.take_dirty().items():
            k = KEY_PREFIX + key_id.encode()
            if rec is None:
                txn.delete(k, db=self._meta)
            else:
                txn.put(k, encode_record(rec), db=self._meta)
        self._keys_changed = True

    def _records(self, txn: Any) -> Iterator[tuple[bytes, bytes]]:
        for k, v in self._stored_records(txn):
            yield k, v[8:]

    def _stored_in(self, txn: Any, name: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, stored value) of every record of database `name`: messages composed
        with their lease entries (`_compose`), gone ones left out."""
        it = txn.cursor(db=self._db[name]).iternext()
        if name != b"state_messages":
            return it  # type: ignore[no-any-return]
        leases = dict(txn.cursor(db=self._leases).iternext())
        gone = self._gone_in(txn)
        if not leases and not gone:
            return it  # type: ignore[no-any-return]
        return ((k, _compose(v, leases.get(k))) for k, v in it if k not in gone)

    def _gone_in(self, txn: Any) -> frozenset[bytes]:
        """The message keys noted gone in `txn` (deleted, their bodies not yet removed)."""
        return frozenset(bytes(g[8:]) for g in txn.cursor(db=self._gone).iternext(values=False))

    def _stored(self, txn: Any, key: bytes, gone: AbstractSet[bytes] | None = None) -> bytes | None:
        """The stored value (version + record) of record `key` in `txn`, or None. For a
        message, `gone` is `_gone_in(txn)` (None: read here; a caller of many reads
        passes it)."""
        v = txn.get(key, db=self._kind_db[key[0]])
        if v is None or key[0] != K.MESSAGE:
            return v  # type: ignore[no-any-return]
        if key in (self._gone_in(txn) if gone is None else gone):
            return None
        return _compose(v, txn.get(key, db=self._leases))

    # -- apply ---------------------------------------------------------------------------
    def apply_entries(
        self, txn: lmdb.Transaction, entries: Sequence[tuple[int, bytes | CommandBatch]]
    ) -> list[list[object]]:
        """Apply committed log entries inside the caller's write txn (the caller commits).

        An entry's data is the encoded `CommandBatch`, or the batch object itself when the
        caller holds it already (the single-node log: nothing to decode). Its records get
        version `index + version_offset`. A batch of one restore command is applied by the
        store (module docstring, "Restore through the log"), its one result the outcome.

        Entries at or below `applied_index` are skipped (their result is []); an empty
        entry (a Raft no-op) only advances `applied_index`. Returns one result list per
        entry (one result per command of its batch). Raises ValueError on a corrupt entry.
        Readers see the results once `txn` commits (see `write`).
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
                version = index + self.version_offset
                sink.ver = _V.pack(version)
                batch = data if type(data) is CommandBatch else decode_batch(data) if data else None  # type: ignore[arg-type]
                if batch is None:
                    out.append([])
                elif batch.commands and type(batch.commands[0]) in _KEY_TYPES and all(type(x) in _KEY_TYPES for x in batch.commands):
                    out.append(self._apply_keys(batch))
                elif len(batch.commands) == 1 and type(batch.commands[0]) in _RESTORE_TYPES:
                    out.append([self._apply_restore(txn, index, batch.commands[0])])  # type: ignore[arg-type]
                else:
                    out.append(self.machine.apply(index, batch))
                if version % PRUNE_EVERY == 0:
                    self._prune(txn, version)
                applied = index
            if self.machine.keys.has_dirty():
                self._flush_keys(txn)
            if self.machine.join_tokens.has_dirty():
                self._flush_tokens(txn)
            self._sweep(txn, applied + self.version_offset)
            if applied != self.applied_index:
                txn.put(APPLIED_KEY, _V.pack(applied), db=self._meta)
                self.applied_index = applied
        finally:
            sink.txn = None
        self._broken = False
        return out

    def _apply_keys(self, batch: CommandBatch) -> list[object]:
        """A batch of key (and join token) commands only: applied to their tables without advancing the
        machine's replicated time (no record changes, so a fresh state stays empty for a
        restore after its admin key was created); created at max(replicated time, now_ms)."""
        keys = self.machine.keys
        now = max(self.machine.now_ms, batch.now_ms if type(batch.now_ms) is int else 0)
        out: list[object] = []
        for cmd in batch.commands:
            try:
                if type(cmd) is CreateKey:
                    out.append(keys.create(cmd.id, cmd.secret_hash, cmd.scopes, now))
                elif type(cmd) is CreateJoinToken:
                    self.machine.join_tokens.create(cmd, now)
                    out.append(None)
                elif type(cmd) is UseJoinToken:
                    self.machine.join_tokens.use(cmd, now)
                    out.append(None)
                else:
                    assert type(cmd) is RevokeKey
                    out.append(keys.revoke(cmd.id))
            except DoqError as e:
                out.append(e)
        return out

    # -- restore through the log (module docstring) ----------------------------------------
    def _apply_restore(self, txn: Any, index: int, cmd: RestoreCommand) -> object:
        stage = self._stage(txn)
        if type(cmd) is RestoreChunk:
            return self._stage_chunk(txn, stage, cmd)
        if type(cmd) is RestoreAbort:
            if stage is not None and stage.restore_id == cmd.restore_id:
                self._discard_staging(txn)
            return None
        assert type(cmd) is RestoreCommit
        try:
            return self._commit_restore(txn, index, stage, cmd)
        finally:
            self._discard_staging(txn)

    def _stage(self, txn: Any) -> _Stage | None:
        raw = txn.get(STAGE_KEY, db=self._meta)
        if raw is None:
            return None
        next_seq, broken = _STAGE.unpack_from(raw)
        return _Stage(bytes(raw[_STAGE.size:]), next_seq, bool(broken))

    def _put_stage(self, txn: Any, stage: _Stage) -> None:
        txn.put(STAGE_KEY, _STAGE.pack(stage.next_seq, stage.broken) + stage.restore_id, db=self._meta)

    def _stage_chunk(self, txn: Any, stage: _Stage | None, cmd: RestoreChunk) -> DoqError | None:
        if stage is None or stage.restore_id != cmd.restore_id:
            self._discard_staging(txn)  # an abandoned restore's, if any
            stage = _Stage(cmd.restore_id, 0, False)
        if not stage.broken and cmd.seq == stage.next_seq:
            txn.put(STAGE_CHUNK + _SEQ.pack(cmd.seq), cmd.payload, db=self._meta)
            self._put_stage(txn, stage._replace(next_seq=stage.next_seq + 1))
            return None
        if not stage.broken:
            self._discard_staging(txn)
            self._put_stage(txn, stage._replace(broken=True))
        return FailedPrecondition(
            f"restore chunk {cmd.seq} out of order (expected {stage.next_seq}): the restore "
            "cannot commit; retry it", reason="RESTORE_INCOMPLETE")

    def _discard_staging(self, txn: Any) -> None:
        txn.delete(STAGE_KEY, db=self._meta)
        cur = txn.cursor(db=self._meta)
        if cur.set_range(STAGE_CHUNK):
            while cur.key()[: len(STAGE_CHUNK)] == STAGE_CHUNK:
                if not cur.delete():
                    break

    def _staged_records(self, txn: Any, chunks: int) -> Iterator[Record]:
        for seq in range(chunks):
            payload = txn.get(STAGE_CHUNK + _SEQ.pack(seq), db=self._meta)
            if payload is None:
                raise FailedPrecondition(f"restore chunk {seq} is not staged", reason="RESTORE_INCOMPLETE")
            yield from decode_chunk(bytes(payload))

    def _commit_restore(self, txn: Any, index: int, stage: _Stage | None, cmd: RestoreCommit) -> object:
        """All or nothing in a nested txn of `txn`; the outcome is the entry's result."""
        if (stage is None or stage.restore_id != cmd.restore_id or stage.broken
                or stage.next_seq != cmd.chunk_count):
            staged = "no chunk" if stage is None or stage.restore_id != cmd.restore_id else (
                f"{stage.next_seq} chunks{' (out of order)' if stage.broken else ''}")
            return FailedPrecondition(
                f"the restore's chunks are not all staged ({staged}, {cmd.chunk_count} sent; the "
                "leader changed during the restore?): nothing was restored; retry",
                reason="RESTORE_INCOMPLETE")
        if not 0 <= cmd.to_version < MAX_RESTORE_VERSION:
            return InvalidArgument(f"restore to_version {cmd.to_version} out of range", reason="INVALID_INDEX")
        if not self._is_empty(txn):
            return FailedPrecondition(
                "the target state is not empty: restore needs a fresh cluster (something was "
                "written before the restore committed)", reason="RESTORE_TARGET_NOT_EMPTY")
        tally = _Tally()
        child = self.env.begin(write=True, parent=txn)
        try:
            self._write_records(child, tally.count(self._staged_records(child, cmd.chunk_count)))
            if tally.records != cmd.record_count:
                raise FailedPrecondition(
                    f"the staged chunks hold {tally.records} records, the restore sent {cmd.record_count}",
                    reason="RESTORE_INCOMPLETE")
            offset = max(self.version_offset, cmd.to_version - index)
            child.put(VOFFSET_KEY, _V.pack(offset), db=self._meta)
            if cmd.cluster_id:  # the restored state continues the chain's cluster
                self.set_cluster_id(child, cmd.cluster_id)
            try:
                self.rebuild(child)
            except Exception as e:
                raise InvalidArgument(f"the backup records do not form a valid state: {e!r}",
                                      reason="BACKUP_INCONSISTENT") from e
        except DoqError as e:
            child.abort()
            self._load(txn)  # memory as the parent txn holds it
            return e
        except BaseException:
            child.abort()
            raise
        child.commit()
        return RestoreOutcome(tally.records, tally.tombstones, tally.last_version, index + offset)

    def _sweep(self, txn: Any, version: int) -> None:
        """After the entries up to `version`: start removing the bodies noted gone, or the
        versions entries noted stale, when enough wait, and take the next step of those
        under way (`_Compaction`, `_Collection`): each commit does a bounded part (at most
        `SWEEP_VISIT` bodies walked and as many gone notes dropped; `SWEEP_GATHER` stale
        notes read and sorted, `SWEEP_CHUNK` entries taken and as many notes dropped), so
        no commit stalls the writer on a sort of every noted key (nor on a walk of every
        note). `sweep_keys` counts what this call did."""
        sink = self._sink
        upto = _V.pack(version + 1)
        msgs = self._kind_db[K.MESSAGE]
        work = 0
        if self._compacting is None and len(sink.gone) >= max(
                MIN_COMPACT, txn.stat(msgs)["entries"] // COMPACT_FRACTION):
            cur = txn.cursor(db=msgs)
            self._compacting = _Compaction(bytes(cur.key()) if cur.last() else b"", upto)
        if self._compacting is not None:
            cw = self._compacting
            if not cw.walked:
                visited, cw.walked, removed = cw.step(txn.cursor(db=msgs), sink.gone)
                work += visited
                if removed:  # the bodies' versions entries (kept while the bodies were)
                    removed.sort()
                    self._unversion_dead(txn, removed)
            if cw.walked:
                dropped, done = cw.drop_notes(txn.cursor(db=self._gone), sink.gone)
                work += dropped
                if done:
                    self._compacting = None
        if self._collecting is None and sink.n_stale >= max(
                MIN_COLLECT, txn.stat(self._versions)["entries"] // COLLECT_FRACTION):
            self._collecting = _Collection(upto)
        if self._collecting is not None:
            co = self._collecting
            if co.merged is None:
                work += co.gather(txn.cursor(db=self._stale))
            if co.merged is not None:
                if not co.taken:
                    chunk, co.taken = co.take()
                    work += len(chunk)
                    self._unversion_dead(txn, chunk)
                if co.taken:
                    dropped, done = _drop_first_notes(txn.cursor(db=self._stale), co.upto)
                    work += dropped
                    sink.n_stale = max(0, sink.n_stale - dropped)
                    if done:
                        self._collecting = None
        self.sweep_keys = work

    def _unversion_dead(self, txn: Any, entries: list[bytes]) -> None:
        """Delete the versions `entries` (sorted) noted stale. None can be live again: a
        key's later writes have later versions (a restore, whose records may come in any
        order, writes through a sink that notes nothing)."""
        _drop_keys(txn.cursor(db=self._versions), entries)

    @staticmethod
    def _drop_notes(txn: Any, db: Any, upto: bytes) -> int:
        """Delete the notes of `db` written before version `upto` (its first keys); their
        count. The notes after them (written while a sweep went on: few) are kept aside,
        the table emptied at once and they put back: no walk over the notes dropped."""
        cur = txn.cursor(db=db)
        kept = list(cur.iternext(values=False)) if cur.set_range(upto) else []
        n = txn.stat(db)["entries"] - len(kept)
        if n:
            txn.drop(db, delete=False)
            if kept:
                txn.cursor(db=db).putmulti([(bytes(k), b"") for k in kept], append=True)
        return n

    def _settle_before(self, txn: Any, cutoff: bytes) -> None:
        """Remove the bodies noted gone and the versions entries noted stale before
        version `cutoff` (their tombstones are about to be pruned: none may outlive its
        tombstone, `_is_empty` relies on it)."""
        sink = self._sink
        for db in (self._gone, self._stale):
            cur = txn.cursor(db=db)
            head: list[bytes] = []
            if cur.first():
                for k in cur.iternext(values=False):
                    if k[:8] >= cutoff:
                        break
                    head.append(bytes(k[8:]))
            if not head:
                continue
            head.sort()
            if db is self._gone:
                bodies = _walk(txn.cursor(db=self._kind_db[K.MESSAGE]), head, pop=True)
                self._unversion_dead(txn, sorted(b[:8] + k for k, b in zip(head, bodies, strict=True) if b is not None))
                sink.gone.difference_update(head)
                self._drop_notes(txn, db, cutoff)
            else:
                self._unversion_dead(txn, head)
                sink.n_stale = max(0, sink.n_stale - self._drop_notes(txn, db, cutoff))

    def _prune(self, txn: Any, version: int) -> None:
        cutoff = version - self.tombstone_retention
        if cutoff <= self.horizon(txn):
            return
        ck = _V.pack(cutoff)
        self._settle_before(txn, ck)
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

    # -- cluster id ----------------------------------------------------------------------
    def ensure_cluster_id(self, new_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> str:
        """The cluster id; if the state has none, `new_id()` (a random UUID), committed in
        its own write first. Only a node that bootstraps a cluster calls it (a joining node
        gets the id with the leader's snapshot). Writer thread."""
        if not self.cluster_id:
            with self.write() as txn:
                self.set_cluster_id(txn, new_id())
        return self.cluster_id

    def set_cluster_id(self, txn: lmdb.Transaction, cluster_id: str) -> None:
        """Record `cluster_id` inside `txn` (of `write()`; if it aborts, `write()`
        rebuilds memory). Raises InvalidArgument (INVALID_CLUSTER_ID) unless it is 1 to
        MAX_CLUSTER_ID_BYTES bytes of UTF-8."""
        raw = cluster_id.encode()
        if not 0 < len(raw) <= MAX_CLUSTER_ID_BYTES:
            raise InvalidArgument(f"a cluster id must be 1 to {MAX_CLUSTER_ID_BYTES} bytes, got "
                                  f"{len(raw)}", reason="INVALID_CLUSTER_ID")
        txn.put(CLUSTER_KEY, raw, db=self._meta)
        self.cluster_id = cluster_id

    # -- reads (any thread; committed state) ----------------------------------------------
    def next_due_ms(self) -> int | None:
        """Earliest replicated time at which a delay ends or a lease expires (None: never)."""
        return self.view.next_due_ms

    def deliverable(self, queue: str) -> int:
        """How many messages a dequeue of `queue` could take now (an upper bound for a fair
        queue with a per-group limit). Raises QueueNotFound."""
        v = self.view.queues.get(queue)
        if v is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        return v.deliverable

    def has_deliverable(self, queue: str) -> bool:
        v = self.view.queues.get(queue)
        return v is not None and v.deliverable > 0

    def sort_known(self, queue: str, ids: list[int]) -> tuple[list[int], list[int], list[int]]:
        """`QueueMachine.sort_known` on the state as applied so far (any thread: it reads
        the machine's in-memory index, a look-up or two per id, not a published view). On
        the leader an id it calls gone is gone for good; one it calls unborn may still be
        in entries committed but not applied here (after a leader change): ask again after
        a read barrier. Raises `Unavailable` (retryable) while memory is `behind` the
        published view (a failed commit rolled it back: an id answered may look unborn)."""
        self.check_current()
        return self.machine.sort_known(queue, ids)

    def throttled_groups(self, queues: Iterable[str]) -> dict[str, int]:
        """For each of `queues` that has any, how many of its groups wait for their rate
        (`QueueMachine.throttled_groups`; any thread); none while memory is `behind`."""
        if self.behind:
            return {}
        return {name: n for name in queues if (n := self.machine.throttled_groups(name))}

    def oldest_enqueued_ms(self, queues: Iterable[str]) -> dict[str, int]:
        """When each of `queues`' oldest message was enqueued (replicated ms), for those
        that hold messages: one look-up per queue in one read txn. Any thread (the oldest
        id comes from the machine's index, `QueueMachine.oldest_id`; a message taken
        meanwhile may still answer: an approximate age, as SQS's). A message applied since
        the last commit (a held write, `write(hold=...)`; not readable from another
        thread) counts as enqueued at the replicated time of the last apply (its age is
        under the hold's bound). Nothing while memory is `behind` (after a failed commit)."""
        out: dict[str, int] = {}
        if self.behind:
            return out
        db = self._kind_db[K.MESSAGE]
        uncommitted = self._committed_index < self.applied_index
        with self.env.begin() as txn:
            for name in queues:
                id_ = self.machine.oldest_id(name)
                if id_ is None:
                    continue
                v = txn.get(K.message_key(name, id_), db=db)
                if v is not None:
                    out[name] = R.MSG_HDR.unpack_from(v, 8)[2]
                elif uncommitted:
                    out[name] = self.machine.now_ms
        return out

    def get_message(self, queue: str, id_: int) -> MessageView:
        """The message as last committed (one read txn; a message the machine's index
        already calls gone, `sort_known`, is not found), once every answered apply is
        committed (`wait_committed`). Raises QueueNotFound / MessageNotFound."""
        self.wait_committed()
        return self._read_message(queue, id_)

    def get_message_now(self, queue: str, id_: int) -> MessageView | None:
        """`get_message` when LMDB already holds every answered apply (nothing to wait
        for: one read txn, fit for the event loop); None otherwise, without waiting (the
        caller reads with `get_message` off the loop). What is answered after the check
        need not be seen, as with `wait_committed`'s own check."""
        if self._committed_index < self._answered_index:
            return None
        return self._read_message(queue, id_)

    def _read_message(self, queue: str, id_: int) -> MessageView:
        with self.env.begin() as txn:
            try:
                qkey = K.queue_key(queue)
            except (ValueError, UnicodeError):
                qkey = None
            if qkey is None or txn.get(qkey, db=self._kind_db[K.QUEUE]) is None:
                raise QueueNotFound(f"queue {queue!r} not found")
            if type(id_) is not int or not 0 < id_ < 2**64:
                raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
            # a body noted gone is a message the machine no longer holds (ids are never reused):
            # ask its index (any thread) rather than read every note
            v = self._stored(txn, K.message_key(queue, id_), _NONE_GONE)
            if v is not None and self.machine.sort_known(queue, [id_])[1]:
                v = None
            if v is None:
                raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
            meta = txn.get(K.META_KEY, db=self._meta)
        now_ms = R.META_REC.unpack_from(meta, 8)[1] if meta is not None else 0
        return R.message_view(queue, id_, v[8:], now_ms)

    def peek(self, queue: str, state: MessageState, offset: int, limit: int) -> list[MessageView]:
        """`queue`'s messages in `state` from position `offset`, in the order they leave it
        (`QueueMachine.peek_ids`), as committed; nothing changes (no lease, no attempt).
        Writer thread only (between writes: the in-memory index must not move meanwhile).
        Raises QueueNotFound."""
        self.wait_committed()
        ids = self.machine.peek_ids(queue, state, offset, limit)
        out: list[MessageView] = []
        with self.env.begin() as txn:
            meta = txn.get(K.META_KEY, db=self._meta)
            now_ms = R.META_REC.unpack_from(meta, 8)[1] if meta is not None else 0
            for id_ in ids:
                v = self._stored(txn, K.message_key(queue, id_), _NONE_GONE)  # ids of the index: live
                if v is not None:
                    out.append(R.message_view(queue, id_, v[8:], now_ms))
        return out

    def group_stats(self, queue: str) -> list[GroupStats]:
        """A fair queue's groups with their backlog and messages in flight (writer thread
        only, as `peek`). Raises QueueNotFound, or `Unavailable` (retryable) while memory is
        `behind` the published view (after a failed commit)."""
        self.check_current()
        return self.machine.group_stats(queue)

    def get_queue(self, name: str) -> QueueInfo:
        """Raises QueueNotFound."""
        v = self.view.queues.get(name)
        if v is None:
            raise QueueNotFound(f"queue {name!r} not found")
        return v.info

    def list_queues(self) -> list[QueueInfo]:
        """Every queue, by name."""
        queues = self.view.queues
        return [queues[n].info for n in sorted(queues)]

    # -- backup ----------------------------------------------------------------------------
    def iter_changes(self, since: int) -> Iterator[tuple[bytes, bytes | None, int]]:
        """Every record (key, payload, version) and tombstone (key, None, version) with
        version >= since, in (version, key) order, a tombstone before a record of the same
        key and version. Consume on one thread (it holds a read txn).
        Raises InvalidArgument(reason="SINCE_TOO_OLD") if 0 < since < horizon."""
        _, it = self.changes(since)
        return it

    def changes(self, since: int) -> tuple[int, Iterator[tuple[bytes, bytes | None, int]]]:
        """(version of the snapshot read, iterator as `iter_changes`)."""
        last, _, it = self._changes(since, with_digest=False)
        return last, it

    def snapshot_changes(self, since: int) -> tuple[int, int, Iterator[tuple[bytes, bytes | None, int]]]:
        """(version, state digest at that version, iterator as `iter_changes`), all from
        ONE read txn: a backup records the digest of the state it is a snapshot of. The
        version is the applied index plus the version offset (a backup's to_version).
        The digest (`doq.storage.digest`) costs one scan of every record, here, before the
        iterator starts (not on the write path)."""
        return self._changes(since, with_digest=True)

    def state_digest(self) -> tuple[int, int]:
        """(version, digest of the whole committed state) from one read txn
        (`GET /db/digest`). Costs one scan of every record; any thread."""
        self.wait_committed()
        with self.env.begin() as txn:
            return self._version(txn), self._digest(txn)

    def _version(self, txn: Any) -> int:
        """The committed state's version: applied index + version offset."""
        return sum(_V.unpack(raw)[0] for raw in (txn.get(APPLIED_KEY, db=self._meta),
                                                  txn.get(VOFFSET_KEY, db=self._meta)) if raw)

    def _digest(self, txn: Any) -> int:
        return digest_of_stored(self._stored_records(txn))

    def _stored_records(self, txn: Any) -> Iterator[tuple[bytes, bytes]]:
        """Every live record as (key, stored value = u64 BE version + payload)."""
        for name in (b"state_meta", b"state_queues", b"state_messages", b"state_dedup"):
            it = self._stored_in(txn, name)
            if name == b"state_meta":
                yield from ((k, v) for k, v in it if k[:1] != b"\x00")
            else:
                yield from it

    def _changes(self, since: int, *, with_digest: bool) -> tuple[int, int, Iterator[tuple[bytes, bytes | None, int]]]:
        self.wait_committed()
        txn = self.env.begin()
        try:
            if since < 0:
                raise InvalidArgument("since must be >= 0", reason="INVALID_SINCE")
            h = self.horizon(txn)
            if 0 < since < h:
                raise InvalidArgument(
                    f"since={since} is older than the tombstone horizon {h}; take a full backup",
                    reason="SINCE_TOO_OLD")
            last = self._version(txn)
            digest = self._digest(txn) if with_digest else 0
        except BaseException:
            txn.abort()
            raise
        return last, digest, self._iter_changes(txn, since)

    def _iter_changes(self, txn: Any, since: int) -> Iterator[tuple[bytes, bytes | None, int]]:
        try:
            start = _V.pack(since)
            vs = self._indexed(txn, start)
            ts = self._walk(txn, self._tombs, start)
            v = next(vs, None)
            t = next(ts, None)
            stored = self._stored
            gone = self._gone_in(txn)
            while v is not None or t is not None:
                if t is not None and (v is None or t <= v):
                    yield t[8:], None, _V.unpack_from(t)[0]
                    t = next(ts, None)
                else:
                    assert v is not None
                    key = v[8:]
                    rec = stored(txn, key, gone)
                    if rec is not None and rec[:8] == v[:8]:  # else a stale entry (_TxnSink)
                        yield key, rec[8:], _V.unpack_from(v)[0]
                    v = next(vs, None)
        finally:
            txn.abort()

    def _indexed(self, txn: Any, start: bytes) -> Iterator[bytes]:
        """The (version + key) of every record with version >= `start`, ascending, and
        some stale ones (readers check the record's version): the versions index merged
        with the lease table's entries (a leased message's record has its lease's version,
        which the versions index does not hold, but an earlier layout's may: once each)."""
        leased = sorted(v[:8] + k for k, v in txn.cursor(db=self._leases).iternext() if v[:8] >= start)
        if not leased:
            return self._walk(txn, self._versions, start)
        return (e for e, _ in itertools.groupby(heapq.merge(self._walk(txn, self._versions, start), leased)))

    @staticmethod
    def _walk(txn: Any, db: Any, start: bytes) -> Iterator[bytes]:
        cur = txn.cursor(db=db)
        if cur.set_range(start):
            yield from cur.iternext(keys=True, values=False)

    def is_empty(self) -> bool:
        """No record and no tombstone (a fresh store). The applied index does not count:
        a fresh Raft cluster has applied its leaders' empty entries."""
        self.wait_committed()
        with self.env.begin() as txn:
            return self._is_empty(txn)

    def _is_empty(self, txn: Any) -> bool:
        return not txn.cursor(db=self._versions).first() and not txn.cursor(db=self._tombs).first()

    def restore(self, records: Iterable[Record], applied_index: int, cluster_id: str = "") -> int:
        """Fill this EMPTY store with backup records (payload None = tombstone, kept even for
        a key the store never had, so the result is identical to the source), in version
        order, and record `applied_index` and the backup's `cluster_id` (adopted: the
        restored state continues that cluster's history; "" keeps this store's): all in ONE
        write transaction, with memory rebuilt from it before it commits. All or nothing:
        on any error (`applied_index` not below MAX_RESTORE_VERSION: InvalidArgument
        INVALID_INDEX; not empty: FailedPrecondition RESTORE_TARGET_NOT_EMPTY; a bad key: InvalidArgument
        INVALID_RECORD or INVALID_CLUSTER_ID; records that do not form a valid state:
        InvalidArgument BACKUP_INCONSISTENT; or whatever `records` raises while it is read)
        nothing changes.
        Returns the number of records written. Writer thread."""
        if type(applied_index) is not int or not 0 <= applied_index < MAX_RESTORE_VERSION:
            raise InvalidArgument(f"applied index must be within 0..{MAX_RESTORE_VERSION - 1}",
                                  reason="INVALID_INDEX")
        if not self.is_empty():  # checked before the write: a refusal reloads nothing
            raise FailedPrecondition(
                "the target state is not empty: restore needs a fresh node (remove its data dir)",
                reason="RESTORE_TARGET_NOT_EMPTY")
        with self.write() as txn:  # the only writer: still empty
            if cluster_id:
                self.set_cluster_id(txn, cluster_id)
            n = self._write_records(txn, records)
            txn.put(APPLIED_KEY, _V.pack(applied_index), db=self._meta)
            try:
                self.rebuild(txn)
            except Exception as e:
                raise InvalidArgument(f"the backup records do not form a valid state: {e!r}",
                                      reason="BACKUP_INCONSISTENT") from e
        return n

    def _write_records(self, txn: Any, records: Iterable[Record]) -> int:
        sink = _TxnSink(self._kind_db, self._versions, self._tombs, self._stale, self._leases, self._gone,
                        lazy=False)
        sink.txn = txn
        n = 0
        for key, value, version in records:
            if not key or key[0] not in self._kind_db or (key[0] == K.META[0] and key != K.META_KEY):
                raise InvalidArgument(f"unknown record key {key!r}", reason="INVALID_RECORD")
            if len(key) > MAX_RECORD_KEY_BYTES:
                raise InvalidArgument(f"record key of {len(key)} bytes (at most {MAX_RECORD_KEY_BYTES}): "
                                      f"{key[:40]!r}...", reason="INVALID_RECORD")
            if type(version) is not int or not 0 < version < 2**64:
                raise InvalidArgument(f"invalid record version {version!r}", reason="INVALID_RECORD")
            sink.ver = _V.pack(version)
            if value is None:
                sink.delete(key)
                txn.put(sink.ver + key, b"", db=self._tombs)
            else:
                sink.put(key, value)
            n += 1
        return n

    def replace_records(self, txn: lmdb.Transaction, records: Iterable[Record],
                        applied_index: int, store_keys: Mapping[bytes, bytes]) -> int:
        """Replace the whole state by `records` (a full backup's: a Raft snapshot) at
        `applied_index`, with the replicated `store_keys` of `open_read` (tombstone
        horizon, cluster id, version offset, restore staging), inside `txn` (of `write()`),
        and rebuild memory from it (readers see it once `txn` commits). Returns the record
        count. Raises as `restore` does on bad records (then `write()` aborts and rebuilds)."""
        self._broken = True
        for db in self._db.values():
            txn.drop(db, delete=False)
        n = self._write_records(txn, records)
        for k, v in store_keys.items():
            if k[:1] != b"\x00" or k == APPLIED_KEY:
                raise ValueError(f"not a replicated store key: {k!r}")
            txn.put(k, v, db=self._meta)
        txn.put(APPLIED_KEY, _V.pack(applied_index), db=self._meta)
        self.rebuild(txn)
        return n

    def open_read(self) -> StateRead:
        """Everything a Raft snapshot carries, from ONE read txn: call it on the writer
        thread between two commits (so it is exactly at the applied index); consume
        `records` on any ONE thread (it holds the txn until exhausted or closed). A held
        write (`write(hold=...)`) is committed first."""
        self.wait_committed()
        txn = self.env.begin()
        try:
            raw = txn.get(APPLIED_KEY, db=self._meta)
            applied = _V.unpack(raw)[0] if raw else 0
            keys = {bytes(k): bytes(v) for k, v in txn.cursor(db=self._meta).iternext()
                    if k[:1] == b"\x00" and k != APPLIED_KEY}
            version = self._version(txn)
        except BaseException:
            txn.abort()
            raise
        return StateRead(applied, version, keys, self._iter_changes(txn, 0))

    # -- snapshots -------------------------------------------------------------------------
    def iter_dump(self) -> Iterator[bytes]:
        """Deterministic chunks of the whole replicated state (see dump_state_bytes)."""
        self.wait_committed()
        with self.env.begin() as txn:
            yield DUMP_MAGIC
            for tag, name in _DUMPED:
                pack = _DUMP_REC.pack
                for k, v in self._stored_in(txn, name):
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
        """Replace the whole state with a `dump_state_bytes()` image inside `txn` (of
        `write()`) and rebuild memory from it (readers see it once `txn` commits)."""
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
