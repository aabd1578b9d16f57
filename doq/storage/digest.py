"""The state digest: one order-independent hash of a whole state (pure: hashlib + struct).

    item(key, value, version) = SHA-256( u32 BE len(key) | key | u64 BE version | value )
    digest(state)             = sum of int(item(r), big endian) over the LIVE records r,
                                modulo 2**256

Tombstones are not part of a state (a deleted key is simply absent). The sum makes the
digest independent of order, so a Spark job adds up per-task partial sums with a plain
reduce, and a node computes it with one scan of its records. `u64 BE version | value` is
exactly how doq.storage stores a record's value in LMDB, so a node hashes its stored bytes
as they are (`item_hash_stored`). Rendered as 64 lowercase hex digits (`hex_digest`).

The node (`StateStore.state_digest`, `GET /db/digest`, the backup footer) and the
verification job (`doq.backup.verify`) both use this module: one definition.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from hashlib import sha256

MOD = 1 << 256
MASK = MOD - 1
DIGEST_BYTES = 32
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
EMPTY = 0  # the digest of a state without records
_LEN = [_U32.pack(n) for n in range(1 << 12)]  # u32 BE of small key lengths (the hot loop)


def _len4(n: int) -> bytes:
    return _LEN[n] if n < 4096 else _U32.pack(n)


def item_hash(key: bytes, value: bytes, version: int) -> int:
    """The hash of one live record, as an int in [0, 2**256)."""
    return int.from_bytes(sha256(_len4(len(key)) + key + _U64.pack(version) + value).digest(), "big")


def item_digest(key: bytes, value: bytes, version: int) -> bytes:
    """`item_hash` as its 32 bytes (big endian), e.g. to ship it compactly."""
    n = len(key)
    return sha256((_LEN[n] if n < 4096 else _U32.pack(n)) + key + _U64.pack(version) + value).digest()


def item_hash_stored(key: bytes, stored: bytes) -> int:
    """`item_hash` of a record stored as `u64 BE version | value` (doq.storage's layout)."""
    return int.from_bytes(sha256(_len4(len(key)) + key + stored).digest(), "big")


def combine(a: int, b: int) -> int:
    """The digest of the union of two disjoint states with digests `a` and `b`."""
    return (a + b) & MASK


def remove(a: int, b: int) -> int:
    """The digest of state `a` without the records of digest `b` (a subset of it)."""
    return (a - b) & MASK


def digest_of(records: Iterable[tuple[bytes, bytes | None, int]]) -> int:
    """Digest of a state given as (key, value, version) records, each key once; records
    with value None (tombstones) are skipped."""
    return sum(item_hash(k, v, ver) for k, v, ver in records if v is not None) & MASK


def digest_of_stored(items: Iterable[tuple[bytes, bytes]]) -> int:
    """Digest of a state given as (key, `u64 BE version | value`) pairs, each key once."""
    lens, frm = _LEN, int.from_bytes
    return sum(frm(sha256((lens[len(k)] if len(k) < 4096 else _U32.pack(len(k))) + k + v).digest(), "big")
               for k, v in items) & MASK



def hex_digest(d: int) -> str:
    """64 lowercase hex digits (big endian)."""
    return f"{d & MASK:064x}"


def to_bytes(d: int) -> bytes:
    """32 bytes, big endian (how a backup footer stores it)."""
    return (d & MASK).to_bytes(DIGEST_BYTES, "big")


def from_bytes(raw: bytes) -> int:
    """Inverse of `to_bytes`; raises ValueError unless `raw` is 32 bytes."""
    if len(raw) != DIGEST_BYTES:
        raise ValueError(f"a state digest is {DIGEST_BYTES} bytes, got {len(raw)}")
    return int.from_bytes(raw, "big")


def parse_hex(text: str) -> int:
    """Inverse of `hex_digest`; raises ValueError for anything but 64 hex digits."""
    if len(text) != 2 * DIGEST_BYTES:
        raise ValueError(f"a state digest is {2 * DIGEST_BYTES} hex digits, got {text!r}")
    return int(text, 16)
