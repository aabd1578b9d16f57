"""The previous layout of the Raft log: its entries in LMDB's raft_log table, read once by
`doq.node.wal_log.WalLogStorage` to move them to segment files (a data dir of an older doq).

raft_log (reserved in `doq.storage.env.DB_NAMES`): u64 BE index -> u64 BE term + u8 entry
type + data. The rest of the Raft state (hard state, snapshot meta, compaction point,
members) is in raft_meta, in the same form in both layouts (`doq.node.raft_meta`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import lmdb

_U64 = struct.Struct(">Q")
_ENT = struct.Struct(">QB")


def has_old_entries(txn: lmdb.Transaction, db: Any) -> bool:
    """Does the raft_log table hold any entry?"""
    return bool(txn.cursor(db=db).first())


def old_entries(txn: lmdb.Transaction, db: Any, after: int) -> Iterator[tuple[int, int, int, bytes]]:
    """The table's entries after index `after` (the compaction point), in index order, as
    (index, term, entry type, data); `txn` may be a `buffers=True` one."""
    for k, v in txn.cursor(db=db):
        i = _U64.unpack(k)[0]
        if i <= after:
            continue  # at or below the compaction point: never read again
        term, t = _ENT.unpack_from(v)
        yield i, term, t, bytes(v[_ENT.size :])


def encode_old_entry(index: int, term: int, kind: int, data: bytes) -> tuple[bytes, bytes]:
    """(key, value) of an entry in the previous layout (tests build old data dirs with it)."""
    return _U64.pack(index), _ENT.pack(term, kind) + data
