"""Opening the node's LMDB environment.

One environment per node (`<data_dir>/<node_id>/doq.lmdb`) holds every named database:
the state and the Raft meta (term, vote, snapshot meta, members), so that applying
committed entries and recording the hard state happen in ONE write transaction (group
commit). The Raft log's entries live in segment files beside it (`doq.lmdb/wal/`,
`doq.storage.segment_log`); raft_log holds only an older doq's entries until they move. Named databases are opened by their owners through
`open_db`; the names in `DB_NAMES` are reserved here so owners never collide.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from doq.errors import InvalidArgument
from doq.storage.files import FILE_MODE, private_dir, tighten

DEFAULT_MAP_SIZE = 64 * 1024**3  # sparse on Linux; grows lazily (`--max-data-size`)
MIN_MAP_SIZE = 2 << 20  # the smallest `--max-data-size`: room for the reserve of `doq.node.alarms`
MAX_DBS = 32

# Owners: raft_* -> doq.node (log seam / raft storage); everything else -> doq.storage.state.
DB_NAMES = (
    b"raft_log",
    b"raft_meta",
    b"state_meta",
    b"state_queues",
    b"state_messages",
    b"state_versions",
    b"state_tombstones",
    b"state_dedup",
    b"state_stale",
    b"state_leases",
    b"state_gone",
)


def node_dir(data_dir: str | os.PathLike[str], node_id: str) -> Path:
    """Directory of one node's files: several nodes may share a data dir."""
    if not node_id or "/" in node_id or node_id in (".", ".."):
        raise InvalidArgument(f"invalid node id {node_id!r}")
    return Path(data_dir) / node_id


def open_env(path: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE) -> lmdb.Environment:
    """Open (creating) the environment at `path` (a directory).

    Every write-transaction commit syncs its data pages, then writes the meta page that
    makes it current WITHOUT syncing it (`metasync=False`, LMDB's MDB_NOMETASYNC: the store
    stays whole after an OS crash, which may only undo the last commit; the next
    commit's data sync flushes its meta page). A commit that
    must be durable when it returns calls `sync_meta` after it (`StateStore.write` does by
    default), which syncs the meta page too: the same two syncs as LMDB's default. A
    process crash (kill -9) loses nothing committed either way: the page cache keeps it.
    Raises OSError/lmdb.Error if the directory is unusable.
    """
    p = private_dir(path)
    env = lmdb.open(
        str(p),
        map_size=map_size,
        max_dbs=MAX_DBS,
        sync=True,
        metasync=False,  # `sync_meta` after each commit that must be durable
        writemap=False,
        readahead=False,
        max_readers=256,
        lock=True,
        mode=FILE_MODE,  # the data and lock files: 0600 (the umask can only remove bits)
    )
    for name in ("data.mdb", "lock.mdb"):  # files of an older doq: tightened
        tighten(p / name, FILE_MODE)
    return env


def sync_meta(env: lmdb.Environment) -> None:
    """Make every commit so far durable (its meta page synced: `open_env`)."""
    env.sync(True)


def open_db(env: lmdb.Environment, name: bytes) -> lmdb._Database:
    """Open (creating) a reserved named database."""
    if name not in DB_NAMES:
        raise ValueError(f"unreserved database name {name!r}; add it to DB_NAMES")
    return env.open_db(name, create=True)
