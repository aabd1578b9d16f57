"""The wire form of cluster membership, shared by the node's `/cluster` routes and the
clients that read them (`doq.cluster_client`): the JSON form of a `ClusterStatus` and
the leader header. Pure data; no I/O.

JSON form of a `ClusterStatus` (`GET /cluster`, and the answer of `POST /cluster/join`):
`{"node_id", "role", "leader_id", "term", "commit_index", "applied_index", "members":
[{"node_id", "role", "leader", "raft_addr", "grpc_addr", "http_addr"}, ...]}`.
A 503 answer of a node that is not the leader carries the leader's HTTP address
(HOST:PORT) in the `X-Doq-Leader` header when the node knows it.
"""

from __future__ import annotations

from typing import Any

from doq.node.cluster import ClusterStatus, Member, MemberAddrs, NodeIdentity, StorageUsage

LEADER_HEADER = "X-Doq-Leader"
"""Response header: the leader's HTTP address (HOST:PORT), on NOT_LEADER answers and on
answers a follower relayed from the leader."""


def status_to_json(s: ClusterStatus) -> dict[str, Any]:
    """The JSON form of a status (see the module docstring)."""
    return {
        "node_id": s.node_id,
        "cluster_id": s.cluster_id,
        "role": s.role,
        "leader_id": s.leader_id,
        "term": s.term,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "alarms": [{"node_id": n, "reason": r, "message": m} for n, r, m in s.alarms],
        "members": [
            {"node_id": m.node_id, "role": m.role, "leader": bool(s.leader_id) and m.node_id == s.leader_id,
             "raft_addr": m.addrs.raft_addr, "grpc_addr": m.addrs.grpc_addr, "http_addr": m.addrs.http_addr,
             "reachable": m.reachable, "last_contact_ms": m.last_contact_ms, "match_index": m.match_index,
             "lag": m.lag}
            for m in s.members
        ],
        "storage": None if s.storage is None else {
            "used_bytes": s.storage.used_bytes, "max_bytes": s.storage.max_bytes,
            "disk_free_bytes": s.storage.disk_free_bytes,
            "disk_free_limit_bytes": s.storage.disk_free_limit_bytes},
    }


def status_from_json(d: dict[str, Any]) -> ClusterStatus:
    """Inverse of `status_to_json`; raises ValueError on a malformed document."""
    try:
        members = [
            Member(str(m["node_id"]), MemberAddrs(str(m["raft_addr"]), str(m["grpc_addr"]), str(m["http_addr"])),
                   str(m["role"]), _opt(m.get("reachable"), bool), _opt(m.get("last_contact_ms"), int),
                   _opt(m.get("match_index"), int), _opt(m.get("lag"), int))  # absent from older nodes
            for m in d["members"]
        ]
        return ClusterStatus(
            node_id=str(d["node_id"]), leader_id=str(d["leader_id"]), term=int(d["term"]),
            commit_index=int(d["commit_index"]), applied_index=int(d["applied_index"]), role=str(d["role"]),
            members=members, cluster_id=str(d.get("cluster_id", "")),  # absent from older nodes
            alarms=tuple((str(a["node_id"]), str(a["reason"]), str(a["message"])) for a in d.get("alarms", ())),
            storage=_storage(d.get("storage")),  # absent from older nodes
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a cluster status: {e!r}") from None


def _storage(d: Any) -> StorageUsage | None:
    if d is None:
        return None
    return StorageUsage(int(d["used_bytes"]), int(d["max_bytes"]), _opt(d.get("disk_free_bytes"), int),
                        int(d["disk_free_limit_bytes"]))


def _opt(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def identity_to_json(i: NodeIdentity) -> dict[str, Any]:
    """The JSON form of `GET /cluster/identity`."""
    return {"node_id": i.node_id, "store_id": i.store_id, "cluster_id": i.cluster_id, "empty": i.empty}


def identity_from_json(d: Any) -> NodeIdentity:
    """Inverse of `identity_to_json`; raises ValueError on a malformed document."""
    try:
        return NodeIdentity(str(d["node_id"]), str(d["store_id"]), str(d["cluster_id"]), bool(d["empty"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a store identity: {e!r}") from None


def leader_http_addr(s: ClusterStatus) -> str:
    """The leader's HTTP address in `s` ("" if no leader is known or it has no address)."""
    for m in s.members:
        if m.node_id == s.leader_id:
            return m.addrs.http_addr
    return ""
