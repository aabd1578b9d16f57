"""Binary codec of `CommandBatch` (the bytes of one log entry). Pure, deterministic.

Layout: version byte, now_ms (u64), command count (u32), then per command a tag byte and
its fields (little endian; strings and bytes are u32-length-prefixed utf-8 / raw; metadata
is a count and sorted key/value pairs). `decode_batch(encode_batch(b)) == b`.
A `Nack` with `release=True` is written with its own tag (13, same fields as a nack), so
entries written before releases existed decode unchanged and an older reader refuses a
release rather than misreading it as a nack.
Raises ValueError on malformed input (or struct.error / OverflowError for out-of-range
values on encode: the service validates ranges first).
"""

from __future__ import annotations

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

(T_CREATE, T_UPDATE, T_DELETE, T_PURGE, T_ENQ, T_DEQ, T_ACK, T_NACK, T_TOUCH, T_PRIO, T_DEL, T_TICK,
 T_RELEASE) = range(1, 14)


def _s(out: list[bytes], s: str) -> None:
    b = s.encode()
    out.append(_U32.pack(len(b)))
    out.append(b)


def _settings(out: list[bytes], s: QueueSettings) -> None:
    out.append(_SETTINGS.pack(s.visibility_timeout_ms, s.max_attempts, s.max_unacked_per_group,
                              s.dedup_window_ms))
    _s(out, s.dead_letter_queue)


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
        elif t is c.Dequeue:
            assert isinstance(cmd, c.Dequeue)
            ap(b"\x06")
            _s(out, cmd.queue)
            ap(_DEQ.pack(cmd.max_messages, 1 if cmd.ack else 0, cmd.visibility_timeout_ms))
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
            ap(b"\x0b")
            _s(out, cmd.queue)
            ap(_U64.pack(cmd.id))
        elif t is c.Tick:
            ap(b"\x0c")
        elif t is c.CreateQueue:
            assert isinstance(cmd, c.CreateQueue)
            ap(b"\x01")
            _s(out, cmd.name)
            _s(out, cmd.type)
            _settings(out, cmd.settings)
        elif t is c.UpdateQueue:
            assert isinstance(cmd, c.UpdateQueue)
            ap(b"\x02")
            _s(out, cmd.name)
            _settings(out, cmd.settings)
        elif t is c.DeleteQueue:
            assert isinstance(cmd, c.DeleteQueue)
            ap(b"\x03")
            _s(out, cmd.name)
        elif t is c.PurgeQueue:
            assert isinstance(cmd, c.PurgeQueue)
            ap(b"\x04")
            _s(out, cmd.name)
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

    def settings(self) -> QueueSettings:
        vis, maxa, maxu, win = self.unpack(_SETTINGS)
        return QueueSettings(vis, maxa, self.s(), maxu, win)


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
        elif tag == T_DEQ:
            q = r.s()
            mx, ack, vis = r.unpack(_DEQ)
            ap(c.Dequeue(q, mx, bool(ack), vis))
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
        elif tag == T_TICK:
            ap(c.Tick())
        elif tag == T_CREATE:
            name = r.s()
            typ = r.s()
            ap(c.CreateQueue(name, typ, r.settings()))
        elif tag == T_UPDATE:
            name = r.s()
            ap(c.UpdateQueue(name, r.settings()))
        elif tag == T_DELETE:
            ap(c.DeleteQueue(r.s()))
        elif tag == T_PURGE:
            ap(c.PurgeQueue(r.s()))
        else:
            raise ValueError(f"unknown command tag {tag}")
    if r.pos != len(r.buf):
        raise ValueError("trailing bytes after command batch")
    return c.CommandBatch(now_ms, cmds)
