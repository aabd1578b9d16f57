"""Compact binary codecs of the replicated records (pure: struct only; the hot path).

Message record: a fixed little-endian header, then group, dedup_id, metadata, content.
The mutable fields live in the header, so a state change rewrites the header and reuses
the tail bytes unchanged (`with_header`).
"""

from __future__ import annotations

import struct

from doq.queues.model import MessageState, MessageView, QueueSettings, QueueType

# priority, not_before_ms, enqueued_at_ms, lease_expires_at_ms, lease_id, attempts, flags,
# group_len, dedup_len, meta_len
MSG_HDR = struct.Struct("<qQQQQIBHHI")
HDR_SIZE = MSG_HDR.size
FLAG_IN_FLIGHT = 1
_LEN = struct.Struct("<I")

TS_PRIORITY_MIN = 1_000_000_000
MAX_MS = 2**63 - 1


def priority_deliver_at(priority: int) -> int:
    """The seed's rule: a priority >= 1e9 is a Unix timestamp in seconds, and the message is
    not delivered before priority*1000 ms (clamped to 2**63-1). Smaller priorities: 0."""
    if priority >= TS_PRIORITY_MIN:
        return min(priority * 1000, MAX_MS)
    return 0


def encode_metadata(md: dict[str, str]) -> bytes:
    """Canonical (sorted by key) encoding of a str->str map."""
    if not md:
        return b""
    out = []
    for k in sorted(md):
        kb = k.encode()
        vb = md[k].encode()
        out.append(_LEN.pack(len(kb)))
        out.append(kb)
        out.append(_LEN.pack(len(vb)))
        out.append(vb)
    return b"".join(out)


def decode_metadata(raw: bytes | memoryview) -> dict[str, str]:
    md: dict[str, str] = {}
    pos, end = 0, len(raw)
    while pos < end:
        n = _LEN.unpack_from(raw, pos)[0]
        k = bytes(raw[pos + 4 : pos + 4 + n]).decode()
        pos += 4 + n
        n = _LEN.unpack_from(raw, pos)[0]
        md[k] = bytes(raw[pos + 4 : pos + 4 + n]).decode()
        pos += 4 + n
    return md


def encode_message(
    priority: int,
    not_before_ms: int,
    enqueued_at_ms: int,
    group: bytes,
    dedup_id: bytes,
    metadata: bytes,
    content: bytes,
    *,
    attempts: int = 0,
    lease_expires_at_ms: int = 0,
    lease_id: int = 0,
    flags: int = 0,
) -> bytes:
    return b"".join((
        MSG_HDR.pack(priority, not_before_ms, enqueued_at_ms, lease_expires_at_ms, lease_id,
                     attempts, flags, len(group), len(dedup_id), len(metadata)),
        group, dedup_id, metadata, content,
    ))


def with_header(
    rec: bytes, priority: int, not_before_ms: int, lease_expires_at_ms: int, lease_id: int,
    attempts: int, flags: int,
) -> bytes:
    """`rec` with its mutable header fields replaced (tail bytes reused)."""
    h = MSG_HDR.unpack_from(rec)
    return MSG_HDR.pack(priority, not_before_ms, h[2], lease_expires_at_ms, lease_id, attempts,
                        flags, h[7], h[8], h[9]) + rec[HDR_SIZE:]


def message_parts(rec: bytes) -> tuple[str, str, dict[str, str], bytes]:
    """(group, dedup_id, metadata, content) of a message record."""
    h = MSG_HDR.unpack_from(rec)
    p = HDR_SIZE
    group = rec[p : p + h[7]].decode()
    p += h[7]
    dedup = rec[p : p + h[8]].decode()
    p += h[8]
    md = decode_metadata(rec[p : p + h[9]]) if h[9] else {}
    p += h[9]
    return group, dedup, md, rec[p:]


# the lease fields of MSG_HDR (lease_expires_at_ms, lease_id, attempts, flags): bytes
# LEASE_AT..LEASE_END of a record; a delivery, a touch or a return without a new priority
# or delay changes these only (a store may keep them apart from the record)
LEASE_AT = struct.calcsize("<qQQ")
LEASE_END = struct.calcsize("<qQQQQIB")


def lease_only(old: bytes, new: bytes) -> bool:
    """`new` is the message record `old` with (at most) its lease fields changed."""
    return (len(old) == len(new) and old[:LEASE_AT] == new[:LEASE_AT]
            and old[LEASE_END:] == new[LEASE_END:])


_PRIO_NOT_BEFORE = struct.Struct("<qQ")  # the first two fields of MSG_HDR
_FLAGS_AT = struct.calcsize("<qQQQQI")  # offset of MSG_HDR's flags byte


def message_delivery(rec: bytes) -> tuple[bool, int]:
    """(in flight, deliver_at_ms) of a message record: what its state derives from.
    (Reads only the fields it needs: backup verification calls it for every message.)"""
    if len(rec) < HDR_SIZE:
        raise ValueError(f"message record of {len(rec)} bytes, shorter than its header")
    prio, not_before = _PRIO_NOT_BEFORE.unpack_from(rec)
    at = max(not_before, priority_deliver_at(prio)) if prio >= TS_PRIORITY_MIN else not_before
    return bool(rec[_FLAGS_AT] & FLAG_IN_FLIGHT), at


def message_state(in_flight: bool, deliver_at_ms: int, now_ms: int) -> MessageState:
    """In flight while leased; else delayed while `deliver_at_ms > now_ms` (replicated
    time); else ready."""
    if in_flight:
        return MessageState.IN_FLIGHT
    return MessageState.DELAYED if deliver_at_ms > now_ms else MessageState.READY


def message_view(queue: str, id_: int, rec: bytes, now_ms: int, *, with_content: bool = True) -> MessageView:
    """The client view of a stored message; its state is derived from replicated time."""
    prio, not_before, enq, lease_exp, lease_id, attempts, flags, _, _, _ = MSG_HDR.unpack_from(rec)
    group, dedup, md, content = message_parts(rec)
    deliver_at = max(not_before, priority_deliver_at(prio))
    state = message_state(bool(flags & FLAG_IN_FLIGHT), deliver_at, now_ms)
    return MessageView(
        id=id_, queue_name=queue, group=group, priority=prio, attempts=attempts,
        deliver_at_ms=deliver_at, lease_expires_at_ms=lease_exp, enqueued_at_ms=enq,
        state=state, lease_id=lease_id, dedup_id=dedup, metadata=md,
        content=content if with_content else b"",
    )


# -- queue record ------------------------------------------------------------------------
_Q_HDR = struct.Struct("<BQIIQQ")  # type, visibility, max_attempts, max_unacked, dedup_window, dead
_TYPES = (QueueType.DELAYED, QueueType.FAIR)
# the extended record (type byte | _EXT): after the dead-letter queue, the cursor is
# length-prefixed and followed by default_group_weight, default_group_max_per_second and
# the fair rotation's credit; written only when one of those is not 0, so the record of a
# queue that uses none of them keeps its older form (and digest)
_EXT = 0x80
_Q_EXT = struct.Struct("<IQQ")


def encode_queue(qtype: QueueType, s: QueueSettings, dead: int, cursor: str, credit: int = 0) -> bytes:
    dlq = s.dead_letter_queue.encode()
    cur = cursor.encode()
    ext = bool(s.default_group_weight or s.default_group_max_per_second or credit)
    parts = [
        _Q_HDR.pack(_TYPES.index(qtype) | (_EXT if ext else 0), s.visibility_timeout_ms, s.max_attempts,
                    s.max_unacked_per_group, s.dedup_window_ms, dead),
        _LEN.pack(len(dlq)), dlq,
    ]
    if ext:
        parts += [_LEN.pack(len(cur)), cur,
                  _Q_EXT.pack(s.default_group_weight, s.default_group_max_per_second, credit)]
    else:
        parts.append(cur)
    return b"".join(parts)


def decode_queue(rec: bytes) -> tuple[QueueType, QueueSettings, int, str]:
    """(type, settings, dead, fair cursor)."""
    qtype, settings, dead, cursor, _ = decode_queue_full(rec)
    return qtype, settings, dead, cursor


def decode_queue_full(rec: bytes) -> tuple[QueueType, QueueSettings, int, str, int]:
    """(type, settings, dead, fair cursor, fair credit)."""
    t, vis, maxa, maxu, win, dead = _Q_HDR.unpack_from(rec)
    p = _Q_HDR.size
    n = _LEN.unpack_from(rec, p)[0]
    p += 4
    dlq = rec[p : p + n].decode()
    p += n
    if not t & _EXT:
        return _TYPES[t], QueueSettings(vis, maxa, dlq, maxu, win), dead, rec[p:].decode(), 0
    n = _LEN.unpack_from(rec, p)[0]
    p += 4
    cursor = rec[p : p + n].decode()
    p += n
    weight, rate, credit = _Q_EXT.unpack_from(rec, p)
    if p + _Q_EXT.size != len(rec):
        raise ValueError("trailing bytes after a queue record")
    return (_TYPES[t & ~_EXT], QueueSettings(vis, maxa, dlq, maxu, win, weight, rate), dead, cursor,
            credit)


# -- meta and dedup records ----------------------------------------------------------------
META_REC = struct.Struct("<QQQ")  # next_id, now_ms, next_lease_id
DEDUP_REC = struct.Struct("<QQ")  # original id, expires_at_ms
# a run of canonical dedup ids (doq.queues.dedupruns) of more than one id: first message id,
# expires_at_ms, count; a run of one id is a DEDUP_REC
DEDUP_RUN_REC = struct.Struct("<QQQ")


def encode_dedup(id_: int, expires_at_ms: int, count: int = 1) -> bytes:
    """A dedup record: one id (`count` 1) or a run of `count` ids from message id `id_`."""
    return DEDUP_REC.pack(id_, expires_at_ms) if count == 1 else DEDUP_RUN_REC.pack(id_, expires_at_ms, count)


def decode_dedup(rec: bytes) -> tuple[int, int, int]:
    """(first message id, expires_at_ms, count) of a dedup record; raises ValueError if malformed."""
    if len(rec) == DEDUP_REC.size:
        id_, exp = DEDUP_REC.unpack(rec)
        return id_, exp, 1
    if len(rec) != DEDUP_RUN_REC.size:
        raise ValueError(f"a dedup record is {DEDUP_REC.size} or {DEDUP_RUN_REC.size} bytes, got {len(rec)}")
    id_, exp, count = DEDUP_RUN_REC.unpack(rec)
    if count < 2:
        raise ValueError(f"a dedup run record counts {count} ids (at least 2)")
    return id_, exp, count
