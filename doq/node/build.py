"""Opening the Raft node a server runs: bootstrap, join or restart.

- Data in the environment: restart from it (`join_addrs` is then ignored: a restarted
  member rejoins from its own data, it never asks to be added again).
- No data, no `join_addrs`: bootstrap a one-node cluster (this node its only voter).
- No data, `join_addrs`: ask the cluster to add this node (`join_cluster`, blocking, run
  in a thread: e.g. `doq.cluster_client.join_cluster`, which follows the leader hint), then
  start empty with the answer's members as peers; the leader sends a snapshot and the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import lmdb

from doq.node.alarms import StorageGauge
from doq.node.cluster import ClusterStatus, MemberAddrs
from doq.node.raft_log import LmdbLogStorage
from doq.node.raft_node import RaftNode, RaftNodeConfig, TransportFactory
from doq.storage.state import StateStore

JoinCluster = Callable[[Sequence[str], str, MemberAddrs], ClusterStatus]
"""(join HTTP addresses, node id, this node's addresses) -> the cluster's status after the add."""


def has_raft_data(env: lmdb.Environment) -> bool:
    """Has this environment ever persisted Raft state (a bootstrapped or joined member)?"""
    return not LmdbLogStorage(env).is_empty()


async def open_raft_node(
    state: StateStore,
    *,
    node_id: str,
    addrs: MemberAddrs,
    transport: TransportFactory,
    join_addrs: Sequence[str] = (),
    join_cluster: JoinCluster | None = None,
    config: RaftNodeConfig | None = None,
    on_commit: Callable[[int, float, float], None] | None = None,
    gauge: StorageGauge | None = None,
) -> RaftNode:
    """Build (not start) the node; joins first when needed (see the module docstring).
    Raises what `join_cluster` raises when the cluster refuses or cannot be reached."""
    peers: dict[str, MemberAddrs] | None = None
    join = bool(join_addrs)
    if join and not has_raft_data(state.env):
        if join_cluster is None:
            raise ValueError("join_addrs given without a join_cluster function")
        status = await asyncio.to_thread(join_cluster, list(join_addrs), node_id, addrs)
        peers = {m.node_id: m.addrs for m in status.members if m.node_id != node_id}
    return RaftNode(state, node_id=node_id, addrs=addrs, transport=transport,
                    config=config, join=join, peers=peers, on_commit=on_commit,
                    gauge=gauge)
