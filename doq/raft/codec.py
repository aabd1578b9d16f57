"""Deterministic, compact binary encoding of the Raft types (no protobuf).

Layout: a one-byte format tag, then fields in a fixed order; integers are unsigned
LEB128 varints, strings/bytes are varint-length-prefixed. Same value → same bytes.
"""

from __future__ import annotations

from doq.raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

_ENTRY, _MSG, _HS, _CC, _SNAP = 0xE1, 0xA1, 0xB1, 0xC1, 0xD1


class DecodeError(ValueError):
    """The bytes are not a valid encoding."""


def _uvarint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError("negative integer")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _bytes(out: bytearray, b: bytes) -> None:
    _uvarint(out, len(b))
    out += b


def _str(out: bytearray, s: str) -> None:
    _bytes(out, s.encode())


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def uvarint(self) -> int:
        n = shift = 0
        buf = self.buf
        while True:
            if self.pos >= len(buf):
                raise DecodeError("truncated varint")
            b = buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def bytes(self) -> bytes:
        n = self.uvarint()
        end = self.pos + n
        if end > len(self.buf):
            raise DecodeError("truncated bytes")
        b = bytes(self.buf[self.pos : end])
        self.pos = end
        return b

    def str(self) -> str:
        return self.bytes().decode()

    def tag(self, expected: int) -> None:
        if self.pos >= len(self.buf) or self.buf[self.pos] != expected:
            raise DecodeError(f"expected tag {expected:#x}")
        self.pos += 1

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError("trailing bytes")


def _put_entry(out: bytearray, e: Entry) -> None:
    _uvarint(out, e.term)
    _uvarint(out, e.index)
    out.append(int(e.type))
    _bytes(out, e.data)


def _get_entry(r: _Reader) -> Entry:
    term = r.uvarint()
    index = r.uvarint()
    t = r.uvarint()
    return Entry(term, index, EntryType(t), r.bytes())


def _put_conf_state(out: bytearray, cs: ConfState) -> None:
    _uvarint(out, len(cs.voters))
    for v in cs.voters:
        _str(out, v)
    _uvarint(out, len(cs.learners))
    for v in cs.learners:
        _str(out, v)


def _get_conf_state(r: _Reader) -> ConfState:
    voters = tuple(r.str() for _ in range(r.uvarint()))
    learners = tuple(r.str() for _ in range(r.uvarint()))
    return ConfState(voters, learners)


def _put_meta(out: bytearray, m: SnapshotMeta) -> None:
    _uvarint(out, m.index)
    _uvarint(out, m.term)
    _put_conf_state(out, m.conf_state)


def _get_meta(r: _Reader) -> SnapshotMeta:
    index = r.uvarint()
    term = r.uvarint()
    return SnapshotMeta(index, term, _get_conf_state(r))


def encode_entry(e: Entry) -> bytes:
    out = bytearray([_ENTRY])
    _put_entry(out, e)
    return bytes(out)


def decode_entry(b: bytes) -> Entry:
    r = _Reader(b)
    r.tag(_ENTRY)
    e = _get_entry(r)
    r.end()
    return e


def encode_hard_state(hs: HardState) -> bytes:
    out = bytearray([_HS])
    _uvarint(out, hs.term)
    _str(out, hs.vote)
    _uvarint(out, hs.commit)
    return bytes(out)


def decode_hard_state(b: bytes) -> HardState:
    r = _Reader(b)
    r.tag(_HS)
    hs = HardState(r.uvarint(), r.str(), r.uvarint())
    r.end()
    return hs


def encode_conf_change(cc: ConfChange) -> bytes:
    """The context follows the node id only when non-empty (older encodings stay valid)."""
    out = bytearray([_CC, int(cc.type)])
    _str(out, cc.node_id)
    if cc.context:
        _bytes(out, cc.context)
    return bytes(out)


def decode_conf_change(b: bytes) -> ConfChange:
    r = _Reader(b)
    r.tag(_CC)
    try:
        t = ConfChangeType(r.uvarint())
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    nid = r.str()
    context = r.bytes() if r.pos < len(r.buf) else b""
    r.end()
    return ConfChange(t, nid, context)


def encode_snapshot(s: Snapshot) -> bytes:
    out = bytearray([_SNAP])
    _put_meta(out, s.meta)
    _bytes(out, s.data)
    return bytes(out)


def decode_snapshot(b: bytes) -> Snapshot:
    r = _Reader(b)
    r.tag(_SNAP)
    meta = _get_meta(r)
    s = Snapshot(meta, r.bytes())
    r.end()
    return s


def encode_message(m: Message) -> bytes:
    out = bytearray([_MSG, int(m.type)])
    _str(out, m.to)
    _str(out, m.frm)
    for n in (m.term, m.log_term, m.index, m.commit, m.reject_hint, m.offset):
        _uvarint(out, n)
    out.append((1 if m.reject else 0) | (2 if m.done else 0) | (4 if m.snapshot else 0))
    _bytes(out, m.context)
    _bytes(out, m.data)
    _uvarint(out, len(m.entries))
    for e in m.entries:
        _put_entry(out, e)
    if m.snapshot is not None:
        _put_meta(out, m.snapshot)
    return bytes(out)


def decode_message(b: bytes) -> Message:
    r = _Reader(b)
    r.tag(_MSG)
    try:
        mtype = MessageType(r.uvarint())
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc
    to = r.str()
    frm = r.str()
    term, log_term, index, commit, hint, offset = (r.uvarint() for _ in range(6))
    flags = r.uvarint()
    context = r.bytes()
    data = r.bytes()
    entries = tuple(_get_entry(r) for _ in range(r.uvarint()))
    snap = _get_meta(r) if flags & 4 else None
    r.end()
    return Message(
        type=mtype, to=to, frm=frm, term=term, log_term=log_term, index=index,
        entries=entries, commit=commit, reject=bool(flags & 1), reject_hint=hint,
        context=context, snapshot=snap, data=data, offset=offset, done=bool(flags & 2),
    )
