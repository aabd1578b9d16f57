"""Binary codec of `CommandBatch` (the bytes of one log entry). Pure, deterministic.

Layout: version byte, now_ms (u64), command count (u32), then per command a tag byte and
its fields (little endian; strings and bytes are u32-length-prefixed utf-8 / raw; metadata
is a count and sorted key/value pairs). `decode_batch(encode_batch(b)) == b`.
A `Nack` with `release=True` is written with its own tag (13, same fields as a nack), so
entries written before releases existed decode unchanged and an older reader refuses a
release rather than misreading it as a nack.
`EnqueueColumns` (tag 14): queue, count n, a byte of flags naming the optional columns
present (1 groups, 2 priorities, 4 metadata, 8 dedup ids, 16 delays), n content lengths
(u32) and the contents back to back, then each present column in that order (n strings,
n i64, n metadata maps, n strings, n u64).
Restore commands (applied by the state store, see `doq.queues.commands`): `RestoreChunk`
(tag 15): restore id (u32-length-prefixed bytes), seq (u32), payload (u32-length-prefixed
bytes); `RestoreCommit` (tag 16): restore id, chunk count (u32), record count (u64),
to_version (u64), cluster id (string); `RestoreAbort` (tag 17): restore id.
Key commands: `CreateKey` (tag 18): id (string), secret hash (u32-length-prefixed bytes),
scope count (u32) and each scope (string); `RevokeKey` (tag 19): id (string).
`CreateQueue` with a queue limit (`max_queues` > 0; tag 30): as tag 1 (name, type,
settings) then max_queues (u64); without one it is written with tag 1, as before.
A `Dequeue` with a lease seed (the leader's, `doq.queues.leaseids`) is written with tag
40: the fields of tag 6 then the seed (u64); one without (seed 0) keeps tag 6, so entries
written before seeds existed decode unchanged (seed 0: sequential lease ids). A
`DeleteMessage` with a lease id or `holder_only` is written with tag 41: queue, id (u64),
lease id (u64), holder_only (u8); one without either keeps tag 11.
Join tokens: `CreateJoinToken` (tag 20): token id
(bytes), secret hash (bytes), expires_ms (u64); `UseJoinToken` (tag 21): token id,
secret hash (bytes), node id (string).
Fair-queue groups (tags 50-59): a `CreateQueue` whose settings name a group default
(`default_group_weight` or `default_group_max_per_second` not 0) is written with tag 50:
the fields of tag 30 (max_queues 0 included) then the group defaults (u32 weight, u64
rate); an `UpdateQueue` with one, tag 51: the fields of tag 2 then the group defaults.
Without them both keep their older tags, so older entries decode unchanged.
`SetGroupPolicy` (tag 52): queue, group (strings), a byte of flags (1: weight given,
2: max_per_second given), weight (u32), max_per_second (i64).
Redrive (`doq.queues.redrive`): `StartRedrive` (tag 60): queue, to (strings),
max_per_second (u64); `CancelRedrive` (tag 61): queue. (Tags 60-69 are redrive's.)
Raises ValueError on malformed input (or struct.error / OverflowError for out-of-range
values on encode: the service validates ranges first).
"""

from __future__ import annotations

import dataclasses
import itertools
import struct

from doq.queues import commands as c
from doq.queues.model import QueueSettings

VERSION = 1
_HDR = struct.Struct("<BQI")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_SETTINGS = struct.Struct("<QIIQ")
_ITEM = struct.Struct("<qQIIII")  # priority, delay_ms, group, dedup, metadata count, content len
_DEQ = struct.Struct("<IBQ")
_NACK = struct.Struct("<QQQBq")
_TOUCH = struct.Struct("<QQQ")
_IDP = struct.Struct("<Qq")
_COLS_HDR = struct.Struct("<IB")
_COMMIT = struct.Struct("<IQQ")

(T_CREATE, T_UPDATE, T_DELETE, T_PURGE, T_ENQ, T_DEQ, T_ACK, T_NACK, T_TOUCH, T_PRIO, T_DEL, T_TICK,
 T_RELEASE, T_ENQ_COLS, T_RESTORE_CHUNK, T_RESTORE_COMMIT, T_RESTORE_ABORT, T_CREATE_KEY, T_REVOKE_KEY,
 ) = range(1, 20)
T_CREATE_JOIN_TOKEN, T_USE_JOIN_TOKEN = 20, 21
T_CREATE_LIMITED = 30  # a CreateQueue with max_queues > 0 (tag 1 stays the one without)
T_DEQ_SEEDED = 40  # a Dequeue with a lease seed (far from the other tags: new ones grow from 22)
T_DEL_HELD = 41  # a DeleteMessage with a lease id or holder_only
T_REDRIVE_START, T_REDRIVE_CANCEL = 60, 61  # redrive's (60-69)
_DEL_HELD = struct.Struct("<QQB")
T_CREATE_GROUPED, T_UPDATE_GROUPED, T_SET_GROUP = 50, 51, 52
_GROUP_DEFAULTS = struct.Struct("<IQ")
_GROUP_POLICY = struct.Struct("<BIq")
_COL_GROUPS, _COL_PRIOS, _COL_MD, _COL_DEDUP, _COL_DELAYS = 1, 2, 4, 8, 16


def _s(out: list[bytes], s: str) -> None:
    b = s.encode()
    out.append(_U32.pack(len(b)))
    out.append(b)


def _strs(out: list[bytes], items: list[str]) -> None:
    """Each string as `_s` writes it; in one C call when they are ASCII of one length (a
    producer's dedup ids): the length prefixes are then one separator."""
    n = len(items)
    if n > 1 and type(items[0]) is str:
        ln = len(items[0])
        if ln < 0x80 and set(map(len, items)) == {ln}:
            sep = chr(ln) + "\0\0\0"  # _U32.pack(ln) as text (ASCII)
            try:
                raw = (sep + sep.join(items)).encode()
            except (TypeError, UnicodeError):
                raw = b""
            if len(raw) == n * (4 + ln):  # every character one byte
                out.append(raw)
                return
    for s in items:
        _s(out, s)


def _settings(out: list[bytes], s: QueueSettings) -> None:
    out.append(_SETTINGS.pack(s.visibility_timeout_ms, s.max_attempts, s.max_unacked_per_group,
                              s.dedup_window_ms))
    _s(out, s.dead_letter_queue)


def _grouped(s: QueueSettings) -> bool:
    return bool(s.default_group_weight or s.default_group_max_per_second)


def _group_defaults(out: list[bytes], s: QueueSettings) -> None:
    out.append(_GROUP_DEFAULTS.pack(s.default_group_weight, s.default_group_max_per_second))


def _b(out: list[bytes], b: bytes) -> None:
    out.append(_U32.pack(len(b)))
    out.append(b)


def _md(out: list[bytes], md: dict[str, str]) -> None:
    out.append(_U32.pack(len(md)))
    for k in sorted(md):
        _s(out, k)
        _s(out, md[k])


def _encode_columns(out: list[bytes], cmd: c.EnqueueColumns) -> None:
    ap = out.append
    ap(b"\x0e")
    _s(out, cmd.queue)
    contents = cmd.contents
    n = len(contents)
    cols = (cmd.groups, cmd.priorities, cmd.metadata, cmd.dedup_ids, cmd.delays_ms)
    for col in cols:
        if col and len(col) != n:
            raise ValueError("a column's length differs from the contents'")
    flags = sum(bit for bit, col in zip((1, 2, 4, 8, 16), cols, strict=True) if col)
    ap(_COLS_HDR.pack(n, flags))
    ap(struct.pack(f"<{n}I", *map(len, contents)))
    ap(b"".join(contents))
    if cmd.groups:
        _strs(out, cmd.groups)
    if cmd.priorities:
        ap(struct.pack(f"<{n}q", *cmd.priorities))
    if cmd.metadata:
        for md in cmd.metadata:
            _md(out, md)
    if cmd.dedup_ids:
        _strs(out, cmd.dedup_ids)
    if cmd.delays_ms:
        ap(struct.pack(f"<{n}Q", *cmd.delays_ms))


def encode_batch(batch: c.CommandBatch) -> bytes:
    out: list[bytes] = [_HDR.pack(VERSION, batch.now_ms, len(batch.commands))]
    ap = out.append
    for cmd in batch.commands:
        t = type(cmd)
        if t is c.Enqueue:
            assert isinstance(cmd, c.Enqueue)
            ap(b"\x05")
            _s(out, cmd.queue)
            ap(_U32.pack(len(cmd.items)))
            for it in cmd.items:
                g = it.group.encode()
                d = it.dedup_id.encode()
                md = it.metadata
                ap(_ITEM.pack(it.priority, it.delay_ms, len(g), len(d), len(md), len(it.content)))
                ap(g)
                ap(d)
                if md:
                    for k in sorted(md):
                        _s(out, k)
                        _s(out, md[k])
                ap(it.content)
        elif t is c.EnqueueColumns:
            assert isinstance(cmd, c.EnqueueColumns)
            _encode_columns(out, cmd)
        elif t is c.Dequeue:
            assert isinstance(cmd, c.Dequeue)
            ap(bytes((T_DEQ_SEEDED,)) if cmd.seed else b"\x06")
            _s(out, cmd.queue)
            ap(_DEQ.pack(cmd.max_messages, 1 if cmd.ack else 0, cmd.visibility_timeout_ms))
            if cmd.seed:
                ap(_U64.pack(cmd.seed))
        elif t is c.Ack:
            assert isinstance(cmd, c.Ack)
            ap(b"\x07")
            _s(out, cmd.queue)
            ap(_U32.pack(len(cmd.ids)))
            ap(struct.pack(f"<{len(cmd.ids)}Q", *cmd.ids))
            ap(_U32.pack(len(cmd.lease_ids)))
            ap(struct.pack(f"<{len(cmd.lease_ids)}Q", *cmd.lease_ids))
        elif t is c.Nack:
            assert isinstance(cmd, c.Nack)
            ap(b"\x0d" if cmd.release else b"\x08")
            _s(out, cmd.queue)
            has = cmd.priority is not None
            ap(_NACK.pack(cmd.id, cmd.lease_id, cmd.delay_ms, 1 if has else 0,
                          cmd.priority if cmd.priority is not None else 0))
        elif t is c.Touch:
            assert isinstance(cmd, c.Touch)
            ap(b"\x09")
            _s(out, cmd.queue)
            ap(_TOUCH.pack(cmd.id, cmd.lease_id, cmd.visibility_timeout_ms))
        elif t is c.UpdatePriority:
            assert isinstance(cmd, c.UpdatePriority)
            ap(b"\x0a")
            _s(out, cmd.queue)
            ap(_IDP.pack(cmd.id, cmd.priority))
        elif t is c.DeleteMessage:
            assert isinstance(cmd, c.DeleteMessage)
            if cmd.lease_id or cmd.holder_only:
                ap(bytes((T_DEL_HELD,)))
                _s(out, cmd.queue)
                ap(_DEL_HELD.pack(cmd.id, cmd.lease_id, 1 if cmd.holder_only else 0))
            else:
                ap(b"\x0b")
                _s(out, cmd.queue)
                ap(_U64.pack(cmd.id))
        elif t is c.Tick:
            ap(b"\x0c")
        elif t is c.CreateQueue:
            assert isinstance(cmd, c.CreateQueue)
            grouped = _grouped(cmd.settings)
            ap(bytes((T_CREATE_GROUPED if grouped else T_CREATE_LIMITED if cmd.max_queues else 1,)))
            _s(out, cmd.name)
            _s(out, cmd.type)
            _settings(out, cmd.settings)
            if cmd.max_queues or grouped:
                ap(_U64.pack(cmd.max_queues))
            if grouped:
                _group_defaults(out, cmd.settings)
        elif t is c.UpdateQueue:
            assert isinstance(cmd, c.UpdateQueue)
            grouped = _grouped(cmd.settings)
            ap(bytes((T_UPDATE_GROUPED if grouped else T_UPDATE,)))
            _s(out, cmd.name)
            _settings(out, cmd.settings)
            if grouped:
                _group_defaults(out, cmd.settings)
        elif t is c.SetGroupPolicy:
            assert isinstance(cmd, c.SetGroupPolicy)
            ap(bytes((T_SET_GROUP,)))
            _s(out, cmd.queue)
            _s(out, cmd.group)
            ap(_GROUP_POLICY.pack((cmd.weight is not None) | (cmd.max_per_second is not None) << 1,
                                  cmd.weight or 0, cmd.max_per_second or 0))
        elif t is c.DeleteQueue:
            assert isinstance(cmd, c.DeleteQueue)
            ap(b"\x03")
            _s(out, cmd.name)
        elif t is c.PurgeQueue:
            assert isinstance(cmd, c.PurgeQueue)
            ap(b"\x04")
            _s(out, cmd.name)
        elif t is c.RestoreChunk:
            assert isinstance(cmd, c.RestoreChunk)
            ap(b"\x0f")
            _b(out, cmd.restore_id)
            ap(_U32.pack(cmd.seq))
            _b(out, cmd.payload)
        elif t is c.RestoreCommit:
            assert isinstance(cmd, c.RestoreCommit)
            ap(b"\x10")
            _b(out, cmd.restore_id)
            ap(_COMMIT.pack(cmd.chunk_count, cmd.record_count, cmd.to_version))
            _s(out, cmd.cluster_id)
        elif t is c.RestoreAbort:
            assert isinstance(cmd, c.RestoreAbort)
            ap(b"\x11")
            _b(out, cmd.restore_id)
        elif t is c.CreateKey:
            assert isinstance(cmd, c.CreateKey)
            ap(b"\x12")
            _s(out, cmd.id)
            _b(out, cmd.secret_hash)
            ap(_U32.pack(len(cmd.scopes)))
            for scope in cmd.scopes:
                _s(out, scope)
        elif t is c.RevokeKey:
            assert isinstance(cmd, c.RevokeKey)
            ap(b"\x13")
            _s(out, cmd.id)
        elif t is c.CreateJoinToken:
            assert isinstance(cmd, c.CreateJoinToken)
            ap(bytes((T_CREATE_JOIN_TOKEN,)))
            _b(out, cmd.token_id)
            _b(out, cmd.secret_hash)
            ap(_U64.pack(cmd.expires_ms))
        elif t is c.UseJoinToken:
            assert isinstance(cmd, c.UseJoinToken)
            ap(bytes((T_USE_JOIN_TOKEN,)))
            _b(out, cmd.token_id)
            _b(out, cmd.secret_hash)
            _s(out, cmd.node_id)
        elif t is c.StartRedrive:
            assert isinstance(cmd, c.StartRedrive)
            ap(bytes((T_REDRIVE_START,)))
            _s(out, cmd.queue)
            _s(out, cmd.to)
            ap(_U64.pack(cmd.max_per_second))
        elif t is c.CancelRedrive:
            assert isinstance(cmd, c.CancelRedrive)
            ap(bytes((T_REDRIVE_CANCEL,)))
            _s(out, cmd.queue)
        else:
            raise ValueError(f"not a command: {cmd!r}")
    return b"".join(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        p = self.pos
        end = p + n
        if end > len(self.buf):
            raise ValueError("truncated command batch")
        self.pos = end
        return self.buf[p:end]

    def unpack(self, st: struct.Struct) -> tuple:  # type: ignore[type-arg]
        p = self.pos
        if p + st.size > len(self.buf):
            raise ValueError("truncated command batch")
        self.pos = p + st.size
        return st.unpack_from(self.buf, p)

    def s(self) -> str:
        return self.take(self.unpack(_U32)[0]).decode()

    def strs(self, n: int) -> list[str]:
        """`n` strings (`s()` each); in a few C calls when they are ASCII of one length."""
        buf, p = self.buf, self.pos
        if n > 1 and p + 4 <= len(buf):
            prefix = buf[p : p + 4]
            ln = _U32.unpack(prefix)[0]
            stride = 4 + ln
            size = n * stride
            if ln < 0x80 and p + size <= len(buf):
                region = buf[p : p + size]
                if all(region[k::stride] == prefix[k : k + 1] * n for k in range(4)):
                    try:
                        text = region.decode()
                    except UnicodeDecodeError:
                        text = ""
                    if len(text) == size:  # ASCII: characters are bytes, at the same offsets
                        parts = text.split(text[:4])
                        if len(parts) != n + 1:  # a string holds the separator itself
                            parts = ["", *(text[i + 4 : i + stride] for i in range(0, size, stride))]
                        self.pos = p + size
                        return parts[1:]
        return [self.s() for _ in range(n)]

    def b(self) -> bytes:
        return self.take(self.unpack(_U32)[0])

    def md(self) -> dict[str, str]:
        md = {}
        for _ in range(self.unpack(_U32)[0]):
            k = self.s()
            md[k] = self.s()
        return md

    def settings(self) -> QueueSettings:
        vis, maxa, maxu, win = self.unpack(_SETTINGS)
        return QueueSettings(vis, maxa, self.s(), maxu, win)

    def group_defaults(self, s: QueueSettings) -> QueueSettings:
        weight, rate = self.unpack(_GROUP_DEFAULTS)
        if not weight and not rate:
            raise ValueError("grouped queue settings without a group default")
        return dataclasses.replace(s, default_group_weight=weight, default_group_max_per_second=rate)


def _decode_columns(r: _Reader) -> c.EnqueueColumns:
    q = r.s()
    n, flags = r.unpack(_COLS_HDR)
    lens = struct.unpack(f"<{n}I", r.take(4 * n))
    blob = r.take(sum(lens))
    ends = list(itertools.accumulate(lens))
    contents = [blob[e - ln : e] for e, ln in zip(ends, lens, strict=True)]
    groups = r.strs(n) if flags & _COL_GROUPS else []
    prios = list(struct.unpack(f"<{n}q", r.take(8 * n))) if flags & _COL_PRIOS else []
    mds = [r.md() for _ in range(n)] if flags & _COL_MD else []
    dedups = r.strs(n) if flags & _COL_DEDUP else []
    delays = list(struct.unpack(f"<{n}Q", r.take(8 * n))) if flags & _COL_DELAYS else []
    if flags >= 32:
        raise ValueError(f"unknown column flags {flags}")
    return c.EnqueueColumns(q, contents, groups, prios, mds, dedups, delays)


def decode_batch(data: bytes) -> c.CommandBatch:
    r = _Reader(bytes(data))
    version, now_ms, n = r.unpack(_HDR)
    if version != VERSION:
        raise ValueError(f"unknown command batch version {version}")
    cmds: list[c.Command] = []
    ap = cmds.append
    for _ in range(n):
        tag = r.take(1)[0]
        if tag == T_ENQ:
            q = r.s()
            items = []
            for _ in range(r.unpack(_U32)[0]):
                prio, delay, gl, dl, mdn, cl = r.unpack(_ITEM)
                g = r.take(gl).decode()
                d = r.take(dl).decode()
                md = {}
                for _ in range(mdn):
                    k = r.s()
                    md[k] = r.s()
                items.append(c.EnqueueItem(r.take(cl), g, prio, md, d, delay))
            ap(c.Enqueue(q, items))
        elif tag == T_ENQ_COLS:
            ap(_decode_columns(r))
        elif tag == T_DEQ or tag == T_DEQ_SEEDED:
            q = r.s()
            mx, ack, vis = r.unpack(_DEQ)
            ap(c.Dequeue(q, mx, bool(ack), vis, r.unpack(_U64)[0] if tag == T_DEQ_SEEDED else 0))
        elif tag == T_ACK:
            q = r.s()
            k = r.unpack(_U32)[0]
            ids = list(struct.unpack(f"<{k}Q", r.take(8 * k)))
            k = r.unpack(_U32)[0]
            lids = list(struct.unpack(f"<{k}Q", r.take(8 * k)))
            ap(c.Ack(q, ids, lids))
        elif tag in (T_NACK, T_RELEASE):
            q = r.s()
            id_, lid, delay, has, prio = r.unpack(_NACK)
            ap(c.Nack(q, id_, lid, delay, prio if has else None, tag == T_RELEASE))
        elif tag == T_TOUCH:
            q = r.s()
            id_, lid, vis = r.unpack(_TOUCH)
            ap(c.Touch(q, id_, lid, vis))
        elif tag == T_PRIO:
            q = r.s()
            id_, prio = r.unpack(_IDP)
            ap(c.UpdatePriority(q, id_, prio))
        elif tag == T_DEL:
            q = r.s()
            ap(c.DeleteMessage(q, r.unpack(_U64)[0]))
        elif tag == T_DEL_HELD:
            q = r.s()
            id_, lease_id, holder_only = r.unpack(_DEL_HELD)
            ap(c.DeleteMessage(q, id_, lease_id, bool(holder_only)))
        elif tag == T_TICK:
            ap(c.Tick())
        elif tag in (T_CREATE, T_CREATE_LIMITED, T_CREATE_GROUPED):
            name = r.s()
            typ = r.s()
            settings = r.settings()
            limit = r.unpack(_U64)[0] if tag != T_CREATE else 0
            if tag == T_CREATE_LIMITED and not limit:
                raise ValueError("a limited CreateQueue with max_queues 0")
            if tag == T_CREATE_GROUPED:
                settings = r.group_defaults(settings)
            ap(c.CreateQueue(name, typ, settings, limit))
        elif tag in (T_UPDATE, T_UPDATE_GROUPED):
            name = r.s()
            settings = r.settings()
            ap(c.UpdateQueue(name, r.group_defaults(settings) if tag == T_UPDATE_GROUPED else settings))
        elif tag == T_SET_GROUP:
            q = r.s()
            group = r.s()
            flags, weight, rate = r.unpack(_GROUP_POLICY)
            if flags & ~3:
                raise ValueError("unknown SetGroupPolicy flags")
            ap(c.SetGroupPolicy(q, group, weight if flags & 1 else None, rate if flags & 2 else None))
        elif tag == T_DELETE:
            ap(c.DeleteQueue(r.s()))
        elif tag == T_PURGE:
            ap(c.PurgeQueue(r.s()))
        elif tag == T_RESTORE_CHUNK:
            rid = r.b()
            seq = r.unpack(_U32)[0]
            ap(c.RestoreChunk(rid, seq, r.b()))
        elif tag == T_RESTORE_COMMIT:
            rid = r.b()
            chunks, records, to_version = r.unpack(_COMMIT)
            ap(c.RestoreCommit(rid, chunks, records, to_version, r.s()))
        elif tag == T_RESTORE_ABORT:
            ap(c.RestoreAbort(r.b()))
        elif tag == T_CREATE_KEY:
            kid = r.s()
            h = r.b()
            ap(c.CreateKey(kid, h, tuple(r.s() for _ in range(r.unpack(_U32)[0]))))
        elif tag == T_REVOKE_KEY:
            ap(c.RevokeKey(r.s()))
        elif tag == T_CREATE_JOIN_TOKEN:
            tid = r.b()
            digest = r.b()
            ap(c.CreateJoinToken(tid, digest, r.unpack(_U64)[0]))
        elif tag == T_USE_JOIN_TOKEN:
            tid = r.b()
            digest = r.b()
            ap(c.UseJoinToken(tid, digest, r.s()))
        elif tag == T_REDRIVE_START:
            q = r.s()
            to = r.s()
            ap(c.StartRedrive(q, to, r.unpack(_U64)[0]))
        elif tag == T_REDRIVE_CANCEL:
            ap(c.CancelRedrive(r.s()))
        else:
            raise ValueError(f"unknown command tag {tag}")
    if r.pos != len(r.buf):
        raise ValueError("trailing bytes after command batch")
    return c.CommandBatch(now_ms, cmds)
