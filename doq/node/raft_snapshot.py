"""The data of a Raft snapshot: member addresses + the node's state as a full backup.

    magic "DOQRSNP1" (8 B) | tombstone horizon (u64 BE) | members length (u32 BE)
    | members (`raft_log.encode_members`) | a doq backup file of every record (since 0)

The state part IS the backup format of doq/backup (same records, same checksums), read in
one LMDB read transaction at the snapshot's applied index; its header's cluster id is the
state's, so a member that installs the snapshot (a joining node first of all: the
bootstrap snapshot of a new cluster carries the id and an empty state) adopts it. An empty
state part (written before cluster ids) means an empty state and no cluster id. Installing
replaces the whole state inside the caller's write txn (all or nothing).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator

import lmdb

from doq.backup.format import BackupReader, Record
from doq.backup.ops import write_backup
from doq.node.cluster import MemberAddrs
from doq.node.raft_log import decode_members, encode_members
from doq.storage.state import StateStore

MAGIC = b"DOQRSNP1"
_HDR = struct.Struct(">8sQI")


def encode_snapshot_data(members: dict[str, MemberAddrs], horizon: int, state: bytes) -> bytes:
    m = encode_members(members)
    return _HDR.pack(MAGIC, horizon, len(m)) + m + state


def decode_snapshot_data(data: bytes) -> tuple[dict[str, MemberAddrs], int, bytes]:
    """(members, horizon, backup bytes); raises ValueError on malformed data."""
    if len(data) < _HDR.size:
        raise ValueError("truncated Raft snapshot data")
    magic, horizon, mlen = _HDR.unpack_from(data)
    if magic != MAGIC or _HDR.size + mlen > len(data):
        raise ValueError("not a doq Raft snapshot")
    members = decode_members(data[_HDR.size : _HDR.size + mlen])
    return members, horizon, data[_HDR.size + mlen :]


class _Opened:
    """A `BackupState` whose `changes(0)` was already opened (on the writer thread). It
    records no state digest: a Raft snapshot does not need one, and computing it would
    scan the whole state on the writer thread."""

    def __init__(self, applied: int, records: Iterator[Record], cluster_id: str) -> None:
        self.env = None
        self.cluster_id = cluster_id
        self.applied_index = applied
        self._changes = (applied, records)

    def snapshot_changes(self, since: int) -> tuple[int, int | None, Iterator[Record]]:
        return self._changes[0], None, self._changes[1]


def open_state_read(state: StateStore) -> tuple[int, int, Iterator[Record]]:
    """(applied index, horizon, records) from one read txn. Call it on the writer thread
    between two commits so the read is exactly at the applied index; consume the records
    on any ONE thread (`write_state_snapshot`)."""
    horizon = state.horizon()
    applied, records = state.changes(0)
    return applied, horizon, records


def write_state_snapshot(applied: int, horizon: int, records: Iterator[Record],
                         members: dict[str, MemberAddrs], node_id: str, cluster_id: str = "") -> bytes:
    """Snapshot data from an opened read and the state's cluster id (blocking: run it off
    the event loop)."""
    buf = io.BytesIO()
    write_backup(_Opened(applied, records, cluster_id), 0, buf, node_id=node_id)  # type: ignore[arg-type]
    return encode_snapshot_data(members, horizon, buf.getvalue())


def install_snapshot_data(state: StateStore, txn: lmdb.Transaction, data: bytes,
                          index: int) -> dict[str, MemberAddrs]:
    """Replace the state (and its cluster id, when the snapshot records one) by the
    snapshot's inside `txn`; returns the snapshot's members. Raises ValueError /
    BackupFormatError / InvalidArgument on corrupt data (the caller aborts)."""
    members, horizon, backup = decode_snapshot_data(data)
    records: Iterator[Record] = iter(())
    cluster_id = ""
    if backup:
        reader = BackupReader(io.BytesIO(backup))
        records, cluster_id = reader.records(), reader.header.cluster_id
    state.replace_records(txn, records, index, horizon)
    if cluster_id:
        state.set_cluster_id(txn, cluster_id)
    return members
