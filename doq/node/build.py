"""Opening the Raft node a server runs: bootstrap, join or restart.

- Data in the environment: restart from it (`join_addrs` is then ignored: a restarted
  member rejoins from its own data, it never asks to be added again).
- No data, no `join_addrs`: bootstrap a one-node cluster (this node its only voter).
- No data, `join_addrs`: ask the cluster to add this node (`join_cluster`, blocking, run
  in a thread: e.g. `doq.cluster_client.join_cluster`, which follows the leader hint), then
  start empty with the answer's members as peers; the leader sends a snapshot and the log.
  The request names this store (`doq.node.store_identity`: a member that lost its disk is
  replaced, not taken for the voter it was) and the cluster it means to join: `cluster_id`,
  or the one a previous join admitted this store into; the answer's cluster is recorded.

`cluster_id` ("" : any) also refuses a store that belongs to another cluster
(`ClusterMismatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

import lmdb

from doq.node import store_identity
from doq.node.alarms import StorageGauge
from doq.node.cluster import ClusterStatus, MemberAddrs
from doq.node.raft_log import has_old_entries
from doq.node.raft_meta import RaftMeta
from doq.node.raft_node import RaftNode, RaftNodeConfig, TransportFactory
from doq.storage.env import open_db
from doq.storage.state import StateStore


class JoinCluster(Protocol):
    """(join HTTP addresses, node id, this node's addresses with its store id; whether
    the store is empty, the cluster meant ("" : any)) -> the cluster's status after the add."""

    def __call__(self, join_addrs: Sequence[str], node_id: str, addrs: MemberAddrs, *,
                 empty: bool, cluster_id: str) -> ClusterStatus: ...


class ClusterMismatch(Exception):
    """The node's store belongs to another cluster than the one it was told to be part of."""


def has_raft_data(env: lmdb.Environment) -> bool:
    """Has this environment ever persisted Raft state (a bootstrapped or joined member)?"""
    meta_db, log_db = open_db(env, b"raft_meta"), open_db(env, b"raft_log")
    with env.begin() as txn:
        return not RaftMeta.read(txn, meta_db).never_written() or has_old_entries(txn, log_db)


async def open_raft_node(
    state: StateStore,
    *,
    node_id: str,
    addrs: MemberAddrs,
    transport: TransportFactory,
    join_addrs: Sequence[str] = (),
    join_cluster: JoinCluster | None = None,
    cluster_id: str = "",
    config: RaftNodeConfig | None = None,
    on_applied: Callable[[int], None] | None = None,
    on_commit: Callable[[float, float | None], None] | None = None,
    gauge: StorageGauge | None = None,
) -> RaftNode:
    """Build (not start) the node; joins first when needed (see the module docstring).
    Raises what `join_cluster` raises when the cluster refuses or cannot be reached, and
    `ClusterMismatch`."""
    peers: dict[str, MemberAddrs] | None = None
    join_cluster_id = ""
    join = bool(join_addrs)
    empty = not has_raft_data(state.env)
    ident = store_identity.ensure(state.env, empty_join=join and empty)
    mine = state.cluster_id or ident.cluster_id
    if cluster_id and mine and mine != cluster_id:
        raise ClusterMismatch(f"this store belongs to cluster {mine}, not {cluster_id}")
    if join and empty:
        if join_cluster is None:
            raise ValueError("join_addrs given without a join_cluster function")
        status = await asyncio.to_thread(join_cluster, list(join_addrs), node_id,
                                         replace(addrs, store_id=ident.store_id),
                                         empty=True, cluster_id=mine or cluster_id)
        store_identity.record_cluster(state.env, status.cluster_id)
        peers = {m.node_id: m.addrs for m in status.members if m.node_id != node_id}
        join_cluster_id = status.cluster_id  # until caught up, the peer door takes only its frames
    return RaftNode(state, node_id=node_id, addrs=addrs, transport=transport, config=config,
                    join=join, peers=peers, join_cluster_id=join_cluster_id, on_applied=on_applied,
                    on_commit=on_commit, gauge=gauge)
