"""The executor side of the backup verification job (doq/backup/verify.py drives it).

Stage 1, `decode_task`: read and check a range of frames of one file with the one decoder
of `doq.backup.format`, hash every record (`doq.storage.digest`), classify it with the
decoders of `doq.queues.records`, and pack it for the shuffle. Stage 2, `summarize`:
rebuild the keys of one shuffle partition (per key, the highest version across the chain)
and add up digests and per-queue counts. Both are plain functions of plain data: Spark
calls them, and so can a test.
"""

from __future__ import annotations

import contextlib
import gc
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from doq.backup.format import BackupFormatError, FrameEntry, read_frame
from doq.queues import keys as K
from doq.queues import records as R
from doq.queues import redrive as RD
from doq.queues.group_policy import decode_group
from doq.queues.model import QueueType
from doq.storage import digest as D

MAX_FAILURES_PER_PARTITION = 100
Task = tuple[int, int, str, int, tuple[tuple[int, ...], ...]]  # id, file, path, first frame, frames


@dataclass(frozen=True, slots=True)
class Failure:
    """One thing that did not verify. `reason`: BACKUP_* of the format and chain rules,
    BACKUP_FILE (cannot open), BACKUP_TOTALS (footer totals vs the frames), DIGEST_MISMATCH,
    DIGEST_NOT_RECORDED, STATE_INCONSISTENT (records that do not form a state), AGAINST
    (the live node could not be backed up)."""

    reason: str
    message: str
    file: str | None = None
    frame: int | None = None  # index in the file's frame index
    offset: int | None = None  # byte offset in the file
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}  # type: ignore[attr-defined]

    def line(self) -> str:
        where = ", ".join(p for p in (
            self.file, None if self.frame is None else f"frame {self.frame}",
            None if self.offset is None else f"offset {self.offset}",
            None if self.key is None else f"key {self.key}") if p)
        return f"{self.reason}: {where + ': ' if where else ''}{self.message}"


# -- executors: stage 1, decode a range of frames ----------------------------------------
# What travels through the shuffle, per frame and shuffle partition: (keys, blob), `keys` a
# list of the records' keys and `blob` their fixed parts back to back (_FIXED: file,
# version, flags, info, 32-byte item digest; zeros for a tombstone). Few large items, and
# per record only C-level packing and unpacking: Spark's Python shuffle costs per item.
_FIXED = struct.Struct("<HQBq32s")
_LIVE, _INFO, _FAIR = 1, 2, 4  # flags: live record; info valid; the queue is fair
_NO_DIGEST = bytes(32)
_MAX_INFO = 2**63 - 1


def decode_task(task: Task, partitions: int, counters: tuple[Any, Any] | None = None) -> Iterator[tuple[int, Any]]:
    """Read and check the task's frames. Yields (shuffle partition, (keys, blob)) per frame
    and partition (the partition: CRC-32 of the key), then (task id % partitions, frame
    stats and failures). A record's `info`: message: -1 in flight, else deliver_at_ms;
    queue: its dead count (flag _FAIR for a fair queue); meta: now_ms; dedup: the dedup ids
    it remembers (a run of canonical ids: its count)."""
    with _no_gc():
        yield from _decode_task(task, partitions, counters)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off: the job's loops build millions of tuples and no
    cycle, and each collection would walk them all (~30 % of the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _decode_task(task: Task, partitions: int, counters: tuple[Any, Any] | None) -> Iterator[tuple[int, Any]]:
    task_id, fi, path, first, frames = task
    stats: list[tuple[int, int, int, int, int]] = []  # frame, records, tombstones, raw bytes, last version
    failures: list[Failure] = []  # frames that do not read
    bad_records: list[Failure] = []  # records that are not doq records (the first few)
    n_bad = 0
    item_digest = D.item_digest
    delivery = R.message_delivery
    dedup_ids = R.decode_dedup
    pack = _FIXED.pack
    crc = zlib.crc32
    msg, queue, dedup, meta = K.MESSAGE, K.QUEUE, K.DEDUP, K.META_KEY
    fair = QueueType.FAIR
    n_records = 0
    with open(path, "rb") as fh:
        for i, t in enumerate(frames, start=first):
            entry = FrameEntry(*t)
            try:
                recs = read_frame(fh, entry)
            except BackupFormatError as e:
                failures.append(Failure(e.reason, e.message, path, i, e.offset))
                continue
            keys: list[list[bytes]] = [[] for _ in range(partitions)]
            fixed: list[list[bytes]] = [[] for _ in range(partitions)]
            tombs = 0
            for key, value, version in recs:
                b = crc(key) % partitions
                keys[b].append(key)
                if value is None:
                    tombs += 1
                    fixed[b].append(pack(fi, version, 0, 0, _NO_DIGEST))
                    continue
                kind = key[0] if key else -1
                flags = _LIVE | _INFO
                try:
                    if kind == msg:
                        in_flight, at = delivery(value)
                        info = -1 if in_flight else min(at, _MAX_INFO)
                    elif kind == queue:
                        qtype, _, dead, _ = R.decode_queue(value)
                        info = min(dead, _MAX_INFO)
                        if qtype is fair:
                            flags |= _FAIR
                    elif kind == dedup:
                        info = dedup_ids(value)[2]
                    elif key == meta:
                        info = min(R.META_REC.unpack_from(value)[1], _MAX_INFO)
                    elif kind == K.JOIN_TOKEN:
                        info = 0  # a join token (a hash and an expiry): counted in no queue
                    elif kind == K.REDRIVE:
                        _, name, _ = K.split_name(key)
                        info = RD.decode_task(name, value).moved  # a redrive task: counted in no queue
                    elif kind == K.GROUP:
                        decode_group(value)  # a fair-queue group's policy and bucket: checked, counted
                        info = 0
                    else:
                        raise ValueError("unknown record kind")
                except Exception as e:  # not a doq record: still part of the state (and its digest)
                    n_bad += 1
                    if len(bad_records) < MAX_FAILURES_PER_PARTITION:
                        bad_records.append(Failure("STATE_INCONSISTENT", f"undecodable {chr(kind) if kind > 0 else ''} "
                                                   f"record at version {version}: {e}", path, i, entry.offset,
                                                   _show(key)))
                    flags, info = _LIVE, 0
                fixed[b].append(pack(fi, version, flags, info, item_digest(key, value, version)))
            for b in range(partitions):
                if keys[b]:
                    yield b, (keys[b], b"".join(fixed[b]))
            stats.append((i, len(recs), tombs, entry.uncompressed_length, entry.last_version))
            n_records += len(recs)
    if counters is not None:
        counters[0].add(len(stats) + len(failures))
        counters[1].add(n_records)
    yield task_id % partitions, (fi, _partition_id(), stats, failures, bad_records, n_bad - len(bad_records))


def unpack_records(keys: list[bytes], blob: bytes, into: dict[bytes, Any]) -> None:
    """Add records to `into`: key -> (file, version, flags, info, digest), or a list of
    them when a key has several records."""
    get = into.get
    for key, rec in zip(keys, _FIXED.iter_unpack(blob), strict=True):
        old = get(key)
        if old is None:
            into[key] = rec
        elif type(old) is list:
            old.append(rec)
        else:
            into[key] = [old, rec]


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else -1
    except ImportError:
        return -1


def _show(key: bytes) -> str:
    """A key for humans: kind letter, queue name, and the rest (message id) if any."""
    try:
        if key == K.META_KEY:
            return "G (meta)"
        kind, name, rest = K.split_name(key)
        tail = f" id {K.message_id(rest)}" if kind == K.MESSAGE else (f" {rest.decode()!r}" if rest else "")
        return f"{chr(kind)} {name!r}{tail}"
    except (ValueError, UnicodeError):
        return repr(key[:80])


# -- executors: stage 2, rebuild the keys of one shuffle partition ------------------------
def summarize(items: Iterable[tuple[int, Any]], now_ms: int, n_files: int) -> Iterator[dict[str, Any]]:
    """Per shuffle partition: rebuild its keys from the blobs of every task, then yield
    digest deltas per file (the digest of the state rebuilt up to file i is the sum of the
    deltas of files 0..i), per-queue counts of the final state, and the task stats."""
    with _no_gc():
        yield _summarize(items, now_ms, n_files)


def _summarize(items: Iterable[tuple[int, Any]], now_ms: int, n_files: int) -> dict[str, Any]:
    records: dict[bytes, Any] = {}
    stats: list[Any] = []
    for _, v in items:
        if len(v) == 2:
            unpack_records(v[0], v[1], records)
        else:
            stats.append(v)
    deltas = [0] * n_files
    final = 0
    live = 0
    msgs: dict[bytes, list[int]] = {}  # queue name -> [ready, delayed, in flight, dedup ids]
    queues: dict[bytes, tuple[str, int]] = {}
    groups: dict[bytes, int] = {}  # queue name -> group records (fair queues' group policies)
    failures: list[Failure] = []
    dropped = 0
    meta_now: int | None = None
    frm = int.from_bytes
    for key, v in records.items():
        if type(v) is tuple:
            f, _, flags, info, h = v
            if not flags & _LIVE:
                continue
            hv = frm(h, "big")
            deltas[f] += hv
        else:
            cur, problem = _history(v, deltas)
            if problem is not None:
                if len(failures) < MAX_FAILURES_PER_PARTITION:
                    failures.append(Failure("STATE_INCONSISTENT", problem, None, None, None, _show(key)))
                else:
                    dropped += 1
            if cur is None or not cur[2] & _LIVE:
                continue
            _, _, flags, info, h = cur
            hv = frm(h, "big")
        final += hv
        live += 1
        if not flags & _INFO:
            continue  # undecodable (reported by stage 1)
        kind = key[0]
        if kind == K.MESSAGE:
            c = msgs.get(key[3:-8])
            if c is None:
                c = msgs[key[3:-8]] = [0, 0, 0, 0]
            c[2 if info < 0 else 1 if info > now_ms else 0] += 1
        elif kind == K.QUEUE:
            queues[key[3:]] = ("fair" if flags & _FAIR else "delayed", info)
        elif kind == K.DEDUP:
            name = key[3 : 3 + int.from_bytes(key[1:3], "big")]
            c = msgs.get(name)
            if c is None:
                c = msgs[name] = [0, 0, 0, 0]
            c[3] += info
        elif kind == K.GROUP:
            name = key[3 : 3 + int.from_bytes(key[1:3], "big")]
            groups[name] = groups.get(name, 0) + 1
        elif key == K.META_KEY:
            meta_now = info
    return {"deltas": [d & D.MASK for d in deltas], "final": final & D.MASK, "live": live, "msgs": msgs, "groups": groups,
            "queues": queues, "stats": stats, "failures": failures, "dropped": dropped, "meta_now": meta_now}


def _history(entries: list[tuple[int, int, int, int, bytes]], deltas: list[int]) -> tuple[Any, str | None]:
    """The records of one key across the chain, each (file, version, flags, info, digest):
    add to `deltas[i]` how the key's contribution changes with file i, and return (the
    final record or None, a problem or None).

    The state up to file i holds, per key, the record with the highest version among
    files 0..i (a live record wins over a tombstone of the same version: deleted and
    written again by one log entry). A file holds at most one live record per key, and
    two files holding the same version of a key must agree on it."""
    entries.sort(key=lambda e: (e[0], e[1], e[2] & _LIVE))
    cur: tuple[int, int, int, int, bytes] | None = None
    problem = None
    i = 0
    n = len(entries)
    while i < n:
        f = entries[i][0]
        j = i
        lives = 0
        while j < n and entries[j][0] == f:
            lives += entries[j][2] & _LIVE
            j += 1
        best = entries[j - 1]  # highest (version, live) of file f
        if lives > 1:
            problem = f"file #{f + 1} holds {lives} live records of this key (a file holds at most one)"
        if cur is None or (best[1], best[2] & _LIVE) > (cur[1], cur[2] & _LIVE):
            deltas[f] += _value(best) - (_value(cur) if cur is not None else 0)
            cur = best
        elif best[1] == cur[1] and best[2] & _LIVE and best[4] != cur[4]:
            problem = (f"version {best[1]} differs between file #{cur[0] + 1} and file #{f + 1} "
                       "(files of different histories?)")
        i = j
    return cur, problem


def _value(rec: tuple[int, int, int, int, bytes]) -> int:
    """A record's contribution to the digest: its item hash if live, else 0."""
    return int.from_bytes(rec[4], "big") if rec[2] & _LIVE else 0
