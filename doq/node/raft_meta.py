"""raft_meta: the node's Raft state beside the log's entries, in LMDB (the node's one
environment), written in the driver's write transactions.

Keys of the raft_meta database (reserved in `doq.storage.env.DB_NAMES`):
- b"hs":       `codec.encode_hard_state`
- b"snap":     `codec.encode_snapshot` of the latest snapshot's meta (data b""): the node's
               own (a point at or below its applied index, recorded every `snapshot_every`
               entries: the log is compacted up to `keep_entries` behind it) or the last
               one it installed
- b"first":    u64 BE index + u64 BE term of the entry before the log's first one (the
               compaction point; its term answers `term(first_index()-1)`)
- b"members":  the member addresses (JSON, see `encode_members`)
- b"peer_ids": cluster ids this node also answers to at its peer door besides its
               state's (JSON list: the cluster it was told to join; ids its state had
               before an online restore replaced them)
- (b"snap_data": a snapshot's data, written by older versions; never read, and deleted
  with the next snapshot meta)

The log's entries are in segment files (`doq.node.wal_log`); an older doq kept them in
LMDB's raft_log table (`doq.node.raft_log`, read once to move them).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import lmdb

from doq.node.cluster import MemberAddrs
from doq.raft import codec
from doq.raft.types import HardState, Snapshot, SnapshotMeta

_FIRST = struct.Struct(">QQ")
HS_KEY = b"hs"
SNAP_KEY = b"snap"
SNAP_DATA_KEY = b"snap_data"
FIRST_KEY = b"first"
MEMBERS_KEY = b"members"
PEER_IDS_KEY = b"peer_ids"
MAX_PEER_IDS = 8  # the oldest are forgotten (each online restore adds one)


def _addrs_list(a: MemberAddrs) -> list[str]:
    """[raft, grpc, http] and the store id when there is one (older versions read the
    first three and ignore the rest)."""
    return [a.raft_addr, a.grpc_addr, a.http_addr, *([a.store_id] if a.store_id else [])]


def _addrs_of(a: Any) -> MemberAddrs:
    return MemberAddrs(str(a[0]), str(a[1]), str(a[2]), str(a[3]) if len(a) > 3 else "")


def encode_members(members: dict[str, MemberAddrs]) -> bytes:
    """Deterministic bytes of a member address map (sorted JSON)."""
    return json.dumps(
        {nid: _addrs_list(a) for nid, a in sorted(members.items())},
        separators=(",", ":"),
    ).encode()


def decode_members(raw: bytes) -> dict[str, MemberAddrs]:
    """Inverse of `encode_members`; raises ValueError on malformed bytes."""
    try:
        obj = json.loads(raw)
        return {str(nid): _addrs_of(a) for nid, a in obj.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"malformed member addresses: {e}") from e


def encode_addrs(addrs: MemberAddrs) -> bytes:
    """A conf change's context: the addresses (and store id) of the member it adds."""
    return json.dumps(_addrs_list(addrs)).encode()


def decode_addrs(raw: bytes) -> MemberAddrs | None:
    """Inverse of `encode_addrs`; None for an empty or malformed context."""
    try:
        return _addrs_of(json.loads(raw))
    except (ValueError, TypeError, IndexError, KeyError):
        return None


@dataclass(slots=True)
class RaftMeta:
    """The raft_meta records, in memory: `read` them, and change them only through the
    write methods (each puts the record in the caller's write transaction)."""

    db: Any  # the raft_meta handle (`doq.storage.env.open_db`)
    hard_state: HardState = field(default_factory=HardState)
    snap_meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    first: tuple[int, int] = (0, 0)  # (index, term) of the compaction point
    members: dict[str, MemberAddrs] = field(default_factory=dict)
    peer_cluster_ids: tuple[str, ...] = ()

    @classmethod
    def read(cls, txn: lmdb.Transaction, db: Any) -> RaftMeta:
        meta = cls(db)
        raw = txn.get(HS_KEY, db=db)
        if raw is not None:
            meta.hard_state = codec.decode_hard_state(bytes(raw))
        raw = txn.get(SNAP_KEY, db=db)
        if raw is not None:
            meta.snap_meta = codec.decode_snapshot(bytes(raw)).meta
        raw = txn.get(FIRST_KEY, db=db)
        meta.first = _FIRST.unpack(raw) if raw else (meta.snap_meta.index, meta.snap_meta.term)
        raw = txn.get(MEMBERS_KEY, db=db)
        if raw is not None:
            meta.members = decode_members(bytes(raw))
        raw = txn.get(PEER_IDS_KEY, db=db)
        if raw is not None:
            meta.peer_cluster_ids = tuple(str(i) for i in json.loads(bytes(raw)))
        return meta

    def never_written(self) -> bool:
        """No Raft state was ever recorded (with no log entries: a new store)."""
        return self.snap_meta.index == 0 and self.hard_state == HardState() and self.first[0] == 0

    def set_hard_state(self, txn: lmdb.Transaction, hs: HardState) -> None:
        txn.put(HS_KEY, codec.encode_hard_state(hs), db=self.db)
        self.hard_state = hs

    def set_members(self, txn: lmdb.Transaction, members: dict[str, MemberAddrs]) -> None:
        txn.put(MEMBERS_KEY, encode_members(members), db=self.db)
        self.members = dict(members)

    def add_peer_cluster_id(self, txn: lmdb.Transaction, cluster_id: str) -> None:
        """Answer to `cluster_id` at the peer door too (kept across restarts; the newest
        `MAX_PEER_IDS`)."""
        if not cluster_id or cluster_id in self.peer_cluster_ids:
            return
        ids = (*self.peer_cluster_ids, cluster_id)[-MAX_PEER_IDS:]
        txn.put(PEER_IDS_KEY, json.dumps(list(ids)).encode(), db=self.db)
        self.peer_cluster_ids = ids

    def set_snapshot(self, txn: lmdb.Transaction, meta: SnapshotMeta) -> None:
        txn.put(SNAP_KEY, codec.encode_snapshot(Snapshot(meta, b"")), db=self.db)
        txn.delete(SNAP_DATA_KEY, db=self.db)  # an older version's data, if any
        self.snap_meta = meta

    def set_first(self, txn: lmdb.Transaction, index: int, term: int) -> None:
        txn.put(FIRST_KEY, _FIRST.pack(index, term), db=self.db)
        self.first = (index, term)
