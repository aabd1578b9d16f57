"""Key layout of the replicated state (pure: struct only).

This is the queue machine's own data layout: the machine writes these keys through its
`Store`, and doq.storage persists them unchanged (one LMDB database per record kind).

One logical key space; the first byte names the record kind (and the LMDB database the
state store keeps it in). Queue names are length-prefixed (u16, big endian), so no queue
name can collide with another queue's keys; message ids are big-endian u64, so a queue's
messages sort by id.

    b"G"                                    machine meta (next ids, replicated time)
    b"Q" + u16 len + name                   queue record
    b"M" + u16 len + name + u64 id          message record
    b"D" + u16 len + name + dedup_id utf-8  dedup record (a run of canonical ids: its first id)
    b"R" + u16 len + name                   redrive task of a (dead-letter) queue (doq.queues.redrive)
    b"W" + u16 len + name + group utf-8     a fair queue's group: its weight / rate overrides and
                                            token bucket (doq.queues.group_policy)
    b"J" + 16-byte token id                 join token of an older version: tokens now live beside
                                            the client keys (doq.queues.join_tokens); such a record
                                            (a data dir or backup of before) still loads, and is
                                            ignored: it enrolls nobody
"""

from __future__ import annotations

import struct

META = b"G"
QUEUE = ord("Q")
MESSAGE = ord("M")
DEDUP = ord("D")
JOIN_TOKEN = ord("J")
REDRIVE = ord("R")
GROUP = ord("W")
META_KEY = META

MAX_NAME_BYTES = 0xFFFF
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def name_prefix(kind: int, name: str) -> bytes:
    """`kind` byte + length-prefixed utf-8 name (raises ValueError if the name is too long)."""
    raw = name.encode()
    if len(raw) > MAX_NAME_BYTES:
        raise ValueError("name too long")
    return bytes((kind,)) + _U16.pack(len(raw)) + raw


def queue_key(name: str) -> bytes:
    return name_prefix(QUEUE, name)


def message_key(name: str, id_: int) -> bytes:
    return name_prefix(MESSAGE, name) + _U64.pack(id_)


def message_key_from_prefix(prefix: bytes, id_: int) -> bytes:
    """Message key from a cached `name_prefix(MESSAGE, name)`."""
    return prefix + _U64.pack(id_)


def redrive_key(name: str) -> bytes:
    return name_prefix(REDRIVE, name)


def join_token_key(token_id: bytes) -> bytes:
    return bytes((JOIN_TOKEN,)) + token_id


def dedup_key(name: str, dedup_id: str) -> bytes:
    return name_prefix(DEDUP, name) + dedup_id.encode()


def group_key(name: str, group: str) -> bytes:
    return name_prefix(GROUP, name) + group.encode()


def split_name(key: bytes) -> tuple[int, str, bytes]:
    """(kind, name, rest) of a queue/message/dedup key; raises ValueError if malformed."""
    if len(key) < 3:
        raise ValueError(f"malformed key {key!r}")
    n = _U16.unpack_from(key, 1)[0]
    end = 3 + n
    if len(key) < end:
        raise ValueError(f"malformed key {key!r}")
    return key[0], key[3:end].decode(), key[end:]


def message_id(rest: bytes) -> int:
    """Id from the `rest` of a message key."""
    if len(rest) != 8:
        raise ValueError("malformed message key")
    return int(_U64.unpack(rest)[0])
