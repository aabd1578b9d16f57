"""Cluster membership as the service and the peer transport see it (no Raft types).

A member is known by its node id and the three addresses it serves: `raft_addr` (peer
transport), `grpc_addr` (clients, doq.v1.DOQ) and `http_addr` (the HTTP gateway). The
addresses travel with the member's conf change through the log, so every member knows
every other one and can point clients at the leader.

`ClusterAdmin` is what a clustered node offers on top of `doq.node.base.Node` (its
`cluster_admin()`); the HTTP `/cluster` endpoints and `doq cluster` call it. A node
without membership (the tests' single-process `LocalNode`) has none (`cluster_admin()` is
None, `/cluster` is 404); its `cluster_status()` (on `Node`) answers as a one-member cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MemberAddrs:
    """Where a member listens (HOST:PORT each), and the store it was admitted with.

    `store_id` is the member's store incarnation (`doq.node.store_identity`): random,
    created with the node's store, so a member that comes back with an empty store (its
    disk was lost) joins with another one and the leader replaces it instead of taking
    it for the voter it was. "" for members admitted before store ids (and in answers).
    Equality compares the addresses only."""

    raft_addr: str
    grpc_addr: str
    http_addr: str
    store_id: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Member:
    """A member as the answering node sees it. The health fields are None where it cannot
    know: a follower knows its own and its leader's, a leader everyone's."""

    node_id: str
    addrs: MemberAddrs
    role: str  # "voter" | "learner"
    reachable: bool | None = None  # heard from within an election timeout
    last_contact_ms: int | None = None  # since the last message from it (0: the answering node)
    match_index: int | None = None  # the last log index known to be in its log
    lag: int | None = None  # commit index minus match index (entries it is behind)


@dataclass(frozen=True, slots=True)
class StorageUsage:
    """What one node's store takes and has left (`doq.node.alarms.StorageGauge`)."""

    used_bytes: int  # pages its trees use (the data size `--max-data-size` limits)
    max_bytes: int  # its `--max-data-size`
    disk_free_bytes: int | None  # free on the data dir's file system (None: not measured yet)
    disk_free_limit_bytes: int  # its `--disk-free-limit`


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """One node's view of the cluster (`GET /cluster`)."""

    node_id: str
    leader_id: str  # "" when no leader is known
    term: int
    commit_index: int
    applied_index: int
    role: str  # this node: "leader" | "follower" | "candidate" | "learner"
    members: list[Member] = field(default_factory=list)
    cluster_id: str = ""  # the replicated state's (StateStore.cluster_id); "" if it has none
    alarms: tuple[tuple[str, str, str], ...] = ()  # storage alarms on: (node id, reason, message)
    storage: StorageUsage | None = None  # the answering node's (None: it measures none)


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What a node says of its store (`GET /cluster/identity`), answered even before it
    has a leader or while it waits to join: its node id, its store's id, the cluster the
    store belongs to ("" if none yet), and `empty`: the store holds no cluster at all (no
    Raft data, no cluster id). A seed bootstraps only when every other replica is empty."""

    node_id: str
    store_id: str
    cluster_id: str
    empty: bool


class ClusterAdmin(Protocol):
    """Membership and leadership operations. Mutations must run on the leader: a follower
    raises `doq.errors.NotLeader` with the leader's hint (the HTTP layer forwards)."""

    def cluster_status(self) -> ClusterStatus: ...

    def identity_of_store(self) -> NodeIdentity: ...

    async def add_member(self, node_id: str, addrs: MemberAddrs, *, empty: bool = False,
                         cluster_id: str = "") -> ClusterStatus:
        """Add `node_id` as a learner; the leader promotes it to voter once it has caught
        up. Idempotent for the same addresses and store. A known member that comes back
        with another store (`addrs.store_id`), or a voter whose store is `empty`, is
        replaced: removed, then added again as a learner with fresh progress. Refused
        (FailedPrecondition, CLUSTER_MISMATCH) when `cluster_id` is given and is not this
        cluster's. Returns the status after the add."""
        ...

    async def remove_member(self, node_id: str) -> None: ...

    async def transfer_leader(self, target_id: str | None = None) -> str:
        """Hand leadership to `target_id` (None: the most up-to-date voter); returns the
        new leader's id once it leads."""
        ...
