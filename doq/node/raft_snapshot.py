"""The data of a Raft snapshot: member addresses, replicated store keys, and the node's
state as a full backup. Produced only when the leader sends a follower a snapshot (the
node's own snapshots are metas: docs/raft.md, "Snapshots and compaction"), never stored.

    magic "DOQRSNP2" (8 B) | members length (u32 BE) | store keys length (u64 BE)
    | members (`raft_log.encode_members`) | store keys | a doq backup file of every record
    (since 0)

    store keys: count (u32 BE), then per key: key length (u32 BE), value length (u32 BE),
    key, value: every replicated store key of the state but its applied index (the
    tombstone horizon, the cluster id, the version offset, the staging of an online
    restore in progress: `StateStore.open_read`), so a follower that installs a snapshot
    mid-restore stages exactly what the others do.

The older "DOQRSNP1" layout (magic | horizon (u64 BE) | members length (u32 BE) | members
| backup) still installs (its only store key was the horizon). The state part IS the
backup format of doq/backup (same records, same checksums), read in one LMDB read
transaction at the snapshot's applied index, its to_version the state's version, its
header's cluster id the read's: a member that installs the snapshot (a joining node
first of all: the first snapshot it receives carries the cluster's id) adopts it from the
store keys (which are the whole truth: a state without the key has no id, whatever the
header says), or from that header in the older layout. An empty state part means an
empty state (older versions sent one from the stored bootstrap snapshot of a cluster from
before cluster ids: no cluster id). Installing replaces the whole state inside the
caller's write txn (all or nothing).
"""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Generator, Iterator, Mapping

import lmdb

from doq.backup.format import BackupReader, Record
from doq.backup.ops import write_backup
from doq.node.cluster import MemberAddrs
from doq.node.raft_meta import decode_members, encode_members
from doq.storage.state import CLUSTER_KEY, HORIZON_KEY, StateRead, StateStore

MAGIC = b"DOQRSNP2"
MAGIC_V1 = b"DOQRSNP1"
_HDR = struct.Struct(">8sIQ")
_HDR_V1 = struct.Struct(">8sQI")
_U32 = struct.Struct(">I")
_KV = struct.Struct(">II")


def encode_snapshot_data(members: dict[str, MemberAddrs], store_keys: Mapping[bytes, bytes],
                         state: bytes) -> bytes:
    m = encode_members(members)
    keys = [_U32.pack(len(store_keys))]
    for k in sorted(store_keys):
        v = store_keys[k]
        keys += (_KV.pack(len(k), len(v)), k, v)
    kb = b"".join(keys)
    return b"".join((_HDR.pack(MAGIC, len(m), len(kb)), m, kb, state))


def decode_snapshot_data(data: bytes) -> tuple[dict[str, MemberAddrs], dict[bytes, bytes], bytes]:
    """(members, store keys, backup bytes); raises ValueError on malformed data."""
    if data[:8] == MAGIC_V1 and len(data) >= _HDR_V1.size:
        _, horizon, mlen = _HDR_V1.unpack_from(data)
        if _HDR_V1.size + mlen > len(data):
            raise ValueError("truncated Raft snapshot data")
        members = decode_members(data[_HDR_V1.size : _HDR_V1.size + mlen])
        v1_keys = {HORIZON_KEY: horizon.to_bytes(8, "big")} if horizon else {}
        return members, v1_keys, data[_HDR_V1.size + mlen :]
    if len(data) < _HDR.size:
        raise ValueError("truncated Raft snapshot data")
    magic, mlen, klen = _HDR.unpack_from(data)
    pos = _HDR.size
    if magic != MAGIC or pos + mlen + klen > len(data):
        raise ValueError("not a doq Raft snapshot")
    members = decode_members(data[pos : pos + mlen])
    pos += mlen
    end = pos + klen
    keys: dict[bytes, bytes] = {}
    if klen < _U32.size:
        raise ValueError("corrupt Raft snapshot store keys")
    count = _U32.unpack_from(data, pos)[0]
    pos += _U32.size
    for _ in range(count):
        if pos + _KV.size > end:
            raise ValueError("corrupt Raft snapshot store keys")
        kl, vl = _KV.unpack_from(data, pos)
        pos += _KV.size
        if pos + kl + vl > end:
            raise ValueError("corrupt Raft snapshot store keys")
        keys[data[pos : pos + kl]] = data[pos + kl : pos + kl + vl]
        pos += kl + vl
    if pos != end:
        raise ValueError("corrupt Raft snapshot store keys")
    return members, keys, data[end:]


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


YIELD_EVERY_RECORDS = 64


def _yielding(records: Iterator[Record], every: int) -> Generator[Record, None, None]:
    """`records`, letting other threads take the GIL after every `every` of them: a thread
    that builds snapshot data holds it otherwise for the interpreter's whole switch
    interval (5 ms) at a time, which the event loop and the writer wait for."""
    n = 0
    for r in records:
        yield r
        n += 1
        if n == every:
            n = 0
            time.sleep(0)  # releases the GIL: a thread waiting for it may take it now
    close = getattr(records, "close", None)
    if close is not None:
        close()


def write_state_snapshot(read: StateRead, members: dict[str, MemberAddrs], node_id: str) -> bytes:
    """Snapshot data from a read opened with `StateStore.open_read` on the writer thread;
    the backup's header records the cluster id of that read (its store key: never the
    store's id in memory, which a later commit may have changed). Blocking: run it off
    the event loop, on one thread (it yields the GIL every `YIELD_EVERY_RECORDS` records)."""
    cluster_id = bytes(read.store_keys.get(CLUSTER_KEY, b"")).decode()
    buf = io.BytesIO()
    records = _yielding(read.records, YIELD_EVERY_RECORDS)
    try:
        write_backup(_Opened(read.version, records, cluster_id), 0, buf, node_id=node_id)  # type: ignore[arg-type]
    finally:
        records.close()  # ends the read txn also if the writer failed
        close_state_read(read)
    return encode_snapshot_data(members, read.store_keys, buf.getvalue())


def close_state_read(read: StateRead) -> None:
    """Release the read txn of a read that will not be written."""
    close = getattr(read.records, "close", None)
    if close is not None:
        close()


def install_snapshot_data(state: StateStore, txn: lmdb.Transaction, data: bytes,
                          index: int) -> dict[str, MemberAddrs]:
    """Replace the state (with its store keys: cluster id, version offset, restore
    staging...) by the snapshot's inside `txn`; returns the snapshot's members. Raises
    ValueError / BackupFormatError / InvalidArgument on corrupt data (the caller aborts)."""
    members, store_keys, backup = decode_snapshot_data(data)
    records: Iterator[Record] = iter(())
    cluster_id = ""
    if backup:
        reader = BackupReader(io.BytesIO(backup))
        records, cluster_id = reader.records(), reader.header.cluster_id
    state.replace_records(txn, records, index, store_keys)
    if cluster_id and data[:8] == MAGIC_V1:  # only the older layout takes it from the header
        state.set_cluster_id(txn, cluster_id)
    return members
