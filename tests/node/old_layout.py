"""Data dirs of the previous layout of the Raft log (its entries in LMDB's raft_log table),
written byte for byte as that layout's code wrote them (`doq.node.raft_log`): what the
migration to segment files reads."""

from __future__ import annotations

from collections.abc import Sequence

import lmdb

from doq.node.raft_log import encode_old_entry
from doq.node.raft_meta import RaftMeta
from doq.raft.types import Entry, HardState, SnapshotMeta
from doq.storage.env import open_db, sync_meta


def write_old_layout(env: lmdb.Environment, entries: Sequence[Entry], *, hard_state: HardState | None = None,
                     snapshot: SnapshotMeta | None = None, first: tuple[int, int] | None = None) -> None:
    """Put `entries` in the raft_log table (and the given raft_meta records), durably."""
    meta_db, log_db = open_db(env, b"raft_meta"), open_db(env, b"raft_log")
    with env.begin(write=True) as txn:
        meta = RaftMeta.read(txn, meta_db)
        if snapshot is not None:
            meta.set_snapshot(txn, snapshot)
        if first is not None:
            meta.set_first(txn, *first)
        if hard_state is not None:
            meta.set_hard_state(txn, hard_state)
        for e in entries:
            txn.put(*encode_old_entry(e.index, e.term, int(e.type), e.data), db=log_db)
    sync_meta(env)


def old_entry_count(env: lmdb.Environment) -> int:
    """Entries left in the raft_log table."""
    log_db = open_db(env, b"raft_log")
    with env.begin() as txn:
        return int(txn.stat(log_db)["entries"])
