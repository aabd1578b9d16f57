"""How a node's Raft log begins: the writes `RaftNode.start` makes before the core exists.

Each function runs on the node's writer thread (nothing else writes meanwhile) and makes
ONE write txn, so a crash leaves the log as it was or as the function leaves it:

- `bootstrap`: a new one-node cluster (this node its only voter);
- `remember_join_cluster_id`: an empty joiner answers to the cluster it was told to join;
- `rebase`: the state is ahead of the log, so the log restarts after the state's applied
  index (entries the state already holds must never be reused).
"""

from __future__ import annotations

import logging
import random
import uuid

import lmdb

from doq.node.cluster import MemberAddrs
from doq.node.wal_log import WalLogStorage
from doq.raft.types import NONE, ConfState, HardState, Snapshot, SnapshotMeta
from doq.storage.env import sync_meta
from doq.storage.state import StateStore

log = logging.getLogger(__name__)


def bootstrap(env: lmdb.Environment, storage: WalLogStorage, state: StateStore,
              node_id: str, addrs: MemberAddrs, rng: random.Random) -> None:
    """A new one-node cluster. The bootstrap snapshot (index 1, or the state's applied
    index when the state already holds data, e.g. after an offline restore) makes
    `node_id` its only voter and carries its addresses and the cluster id (created now
    from `rng`, so a seed replays, unless a restore brought one), which joining nodes
    adopt. Its data is the state's (produced on demand)."""
    members = {node_id: addrs}
    index = max(1, state.applied_index)
    state.ensure_cluster_id(lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    snap = Snapshot(SnapshotMeta(index, 1, ConfState((node_id,), ())))
    with env.begin(write=True) as txn:
        storage.apply_snapshot(txn, snap)
        storage.set_hard_state(txn, HardState(1, NONE, index))
        storage.set_members(txn, members)
    sync_meta(env)
    storage.after_commit(durable=True)


def remember_join_cluster_id(env: lmdb.Environment, storage: WalLogStorage, cluster_id: str) -> None:
    """A joiner answers to the cluster it was told to join: persisted, so a restart
    before its first snapshot keeps its peer door shut to other clusters."""
    with env.begin(write=True) as txn:
        storage.add_peer_cluster_id(txn, cluster_id)
    sync_meta(env)


def rebase(env: lmdb.Environment, storage: WalLogStorage, state: StateStore,
           conf: ConfState, node_id: str) -> None:
    """The state is ahead of the log (an offline restore into a member, or an online
    restore of an older doq cut short by a crash): replace the log by a snapshot of the
    state at its applied index, in configuration `conf` (new entries follow it). The
    term stays (at least 1); the vote stays if the term does."""
    applied = state.applied_index
    hs = storage.hard_state
    term = max(hs.term, 1)
    snap = Snapshot(SnapshotMeta(applied, term, conf))  # data: the state's, on demand
    with env.begin(write=True) as txn:
        storage.apply_snapshot(txn, snap)
        storage.set_hard_state(txn, HardState(term, hs.vote if hs.term == term else NONE, applied))
    sync_meta(env)
    storage.after_commit(durable=True)
    log.info("node %s: the Raft log now starts after the state's applied index %d", node_id, applied)
