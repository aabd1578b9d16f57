"""Cluster endpoints: `GET /cluster`, `GET /cluster/identity`, `POST /cluster/join`, `DELETE /cluster/members/{id}`,
`POST /cluster/transfer-leader`, over the node's `doq.node.cluster.ClusterAdmin`.

Mutations run on the leader: a follower answers 503 NOT_LEADER with `leader_hint` and,
when it knows the leader's HTTP address, the `X-Doq-Leader` header (HOST:PORT) that
`doq.cluster_client.join_cluster` follows. The JSON form of a status is
`doq.node.cluster_wire.status_to_json`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from doq.errors import NotLeader
from doq.node import member_input
from doq.node.cluster import ClusterAdmin, MemberAddrs
from doq.node.cluster_wire import LEADER_HEADER, identity_to_json, status_to_json
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.http.problems import problem_response

if TYPE_CHECKING:
    from doq.node.base import Node
    from doq.service.api import QueueService

NODE_ID_PATTERN = member_input.NODE_ID_PATTERN
ADDR_PATTERN = member_input.ADDR_PATTERN
STORE_ID_PATTERN = r"^[0-9a-f]{0,64}$"
CLUSTER_ID_PATTERN = r"^[0-9A-Za-z-]{0,64}$"


class MemberModel(BaseModel):
    node_id: str = Field(description="The member's node id.")
    role: str = Field(description="`voter` or `learner` (catching up; promoted by the leader).")
    leader: bool = Field(description="This member is the leader.")
    raft_addr: str = Field(description="Peer transport address HOST:PORT.")
    grpc_addr: str = Field(description="gRPC (doq.v1.DOQ) address HOST:PORT.")
    http_addr: str = Field(description="HTTP gateway address HOST:PORT.")
    reachable: bool | None = Field(None, description="Heard from within an election timeout (null: the "
                                   "answering node cannot know: a follower knows itself and its leader).")
    last_contact_ms: int | None = Field(None, description="Milliseconds since the answering node last heard "
                                        "from it (0 for itself; null: never, or cannot know).")
    match_index: int | None = Field(None, description="The last log index known to be in its log (null: "
                                    "unknown to a follower).")
    lag: int | None = Field(None, description="Entries it is behind: the commit index less its match index.")


class StorageModel(BaseModel):
    used_bytes: int = Field(description="What the answering node's store takes (the pages its trees use: "
                                        "what `--max-data-size` limits).")
    max_bytes: int = Field(description="Its `--max-data-size`.")
    disk_free_bytes: int | None = Field(None, description="Free on its data directory's file system "
                                                          "(null: not measured yet).")
    disk_free_limit_bytes: int = Field(description="Its `--disk-free-limit`.")


class ClusterStatusModel(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "node_id": "node-2", "cluster_id": "0b6f7a3e-5c1d-4e8a-9f52-7d0c3a1e6b94", "role": "follower", "leader_id": "node-1", "term": 3,
        "commit_index": 120, "applied_index": 120,
        "members": [
            {"node_id": "node-1", "role": "voter", "leader": True, "raft_addr": "localhost:9001",
             "grpc_addr": "localhost:10001", "http_addr": "localhost:8001"},
            {"node_id": "node-2", "role": "voter", "leader": False, "raft_addr": "localhost:9002",
             "grpc_addr": "localhost:10002", "http_addr": "localhost:8002"},
        ],
    }]})
    node_id: str = Field(description="The node that answered.")
    cluster_id: str = Field(description="The cluster's id: created when the cluster was bootstrapped, the "
                                        "same on every member, recorded in every backup (\"\" for a "
                                        "cluster bootstrapped before cluster ids).")
    role: str = Field(description="Its role: `leader`, `follower`, `candidate` or `learner`.")
    leader_id: str = Field(description="The leader it knows of (\"\" if none).")
    term: int = Field(description="Its current Raft term.")
    commit_index: int = Field(description="The highest log index it knows to be committed.")
    applied_index: int = Field(description="The highest log index it has applied.")
    members: list[MemberModel] = Field(description="Every member with its role and addresses.")
    alarms: list[dict[str, str]] = Field(default_factory=list, description=(
        "Storage alarms on (node_id, reason, message): this node's, and on the leader its members' "
        "(while any is on, writes that grow the state are refused with 507)."))
    storage: StorageModel | None = Field(None, description="The answering node's store: what it takes and the "
                                                           "disk it has left.")


class JoinBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra={"examples": [{
        "node_id": "node-2", "raft_addr": "localhost:9002", "grpc_addr": "localhost:10002",
        "http_addr": "localhost:8002"}]})
    node_id: str = Field(pattern=NODE_ID_PATTERN, description="The new member's node id.")
    raft_addr: str = Field(pattern=ADDR_PATTERN, max_length=member_input.ADDR_MAX, description="Its peer transport address HOST:PORT.")
    grpc_addr: str = Field(pattern=ADDR_PATTERN, max_length=member_input.ADDR_MAX, description="Its gRPC address HOST:PORT.")
    http_addr: str = Field(pattern=ADDR_PATTERN, max_length=member_input.ADDR_MAX, description="Its HTTP address HOST:PORT.")
    store_id: str = Field("", pattern=STORE_ID_PATTERN, description=(
        "Its store's id (`GET /cluster/identity`). A known member joining with another store "
        "(its disk was lost) is replaced: removed, then added again as a learner."))
    empty: bool = Field(False, description="Its store holds no Raft data (a voter saying so is replaced too).")
    cluster_id: str = Field("", pattern=CLUSTER_ID_PATTERN, description=(
        "The cluster it means to join: refused (409 CLUSTER_MISMATCH) if this is another one."))


class IdentityModel(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "node_id": "doq-1", "store_id": "9f2c1e0b7a6d4c3e8b5a1f0e2d3c4b5a",
        "cluster_id": "0b6f7a3e-5c1d-4e8a-9f52-7d0c3a1e6b94", "empty": False}]})
    node_id: str = Field(description="The node that answered.")
    store_id: str = Field(description="Its store's id: random, created with the store (a node that "
                                      "lost its disk comes back with another one).")
    cluster_id: str = Field(description="The cluster its store belongs to (\"\" if none yet).")
    empty: bool = Field(description="The store holds no cluster at all (no Raft data, no cluster id).")


class TransferBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra={"examples": [{"target": "node-2"}]})
    target: str | None = Field(None, pattern=NODE_ID_PATTERN,
                               description="The voter to hand leadership to (default: the most up-to-date one).")


class TransferResult(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"success": True, "leader_id": "node-2"}]})
    success: bool = True
    leader_id: str = Field(description="The new leader.")


class RemoveResult(BaseModel):
    success: bool = True


MemberId = Annotated[str, Path(description="The member's node id.", examples=["node-3"])]

_NOT_LEADER = ("Not the leader (NOT_LEADER, `leader_hint`; header X-Doq-Leader: the leader's HTTP "
               "address when known), no leader, or shutting down; retryable.")
_CHANGE_BUSY = (" Also while another membership change is not applied yet (CONF_CHANGE_PENDING) or "
                "when this one was not applied in time (CONF_CHANGE_TIMEOUT); both retryable.")
_ANSWERS = {
    "cluster_status": "This node's view of the cluster.",
    "cluster_identity": "This node's store identity.",
    "join_cluster": "Added as a learner (or already a member with these addresses): the cluster's status.",
    "remove_member": "Removed from the cluster.",
    "transfer_leader": "Leadership moved: the new leader.",
}


def build_cluster_router(api: QueueService) -> APIRouter:
    """The `/cluster` routes over `api.node`'s `ClusterAdmin`; none if it has none
    (`cluster_admin()` is None: then `/cluster` is 404, and clients such as `doq bench`
    fall back to the single-node defaults)."""
    r = APIRouter(generate_unique_id_function=operation_id, route_class=LeanRoute)
    admin = admin_of(api.node)
    if admin is None:
        return r

    def not_leader(e: NotLeader, path: str) -> Response:
        addr = _leader_addr(admin, e.leader_hint)
        return problem_response(e, path, {LEADER_HEADER: addr} if addr else None)

    @r.get("/cluster", tags=["cluster"], response_model=ClusterStatusModel, summary="Cluster status",
           responses=errors())
    async def cluster_status() -> Response:
        """Members with their roles and addresses, the leader, and this node's term, commit
        and applied indexes (its own view: no round trip to the leader)."""
        return _json(status_to_json(admin.cluster_status()))

    @r.get("/cluster/identity", tags=["cluster"], response_model=IdentityModel, summary="Store identity",
           responses=errors())
    async def cluster_identity() -> Response:
        """This node's store: its id and the cluster it belongs to, or that it is empty.
        Answered by every node, also while it waits to join or has no leader (a start
        script's seed bootstraps only when every other replica answers `empty`)."""
        return _json(identity_to_json(admin.identity_of_store()))

    @r.post(
        "/cluster/join", tags=["cluster"], response_model=ClusterStatusModel, summary="Add a member",
        responses=errors(400, 409, 413, 415, notes={
            409: "The node id is taken by a member with other addresses (MEMBER_EXISTS), the joiner "
                 "means another cluster (CLUSTER_MISMATCH), or this node cannot add members.",
            503: _NOT_LEADER + _CHANGE_BUSY}),
        openapi_extra=body_doc(JoinBody),
    )
    async def join_cluster(request: Request) -> Response:
        """Add a node as a learner; the leader promotes it to voter once it has caught up.
        Idempotent for the same id, addresses and store. A known member that comes back
        with another store (or a voter with an empty one) is replaced: removed, then added
        again as a learner. `doq serve --join` calls this."""
        b = await read_json(request, JoinBody)
        addrs = MemberAddrs(b.raft_addr, b.grpc_addr, b.http_addr, b.store_id)
        member_input.check_node_id(b.node_id)  # the whole rule (the schema shows its syntax)
        member_input.check_member_addrs(addrs)
        try:
            status = await admin.add_member(b.node_id, addrs, empty=b.empty, cluster_id=b.cluster_id)
        except NotLeader as e:
            return not_leader(e, request.url.path)
        return _json(status_to_json(status))

    @r.delete(
        "/cluster/members/{node_id}", tags=["cluster"], response_model=RemoveResult, summary="Remove a member",
        responses=errors(400, 404, 409, notes={
            404: "No member has this id (NOT_FOUND).",
            409: "The cluster refuses the change (the last voter: LAST_VOTER), or this node cannot "
                 "remove members.",
            503: _NOT_LEADER + _CHANGE_BUSY}),
    )
    async def remove_member(node_id: MemberId, request: Request) -> Response:
        """Remove a member (voter or learner) from the cluster; it stops receiving the log."""
        try:
            await admin.remove_member(node_id)
        except NotLeader as e:
            return not_leader(e, request.url.path)
        return Response(b'{"success":true}', media_type="application/json")

    @r.post(
        "/cluster/transfer-leader", tags=["cluster"], response_model=TransferResult,
        summary="Transfer leadership",
        responses=errors(400, 404, 409, 413, 415, notes={
            404: "No voter has the target id (NOT_FOUND).",
            409: "The transfer is refused (e.g. the target is a learner, or there is no other voter).",
            503: _NOT_LEADER}),
        openapi_extra=body_doc(TransferBody, required=False),
    )
    async def transfer_leader(request: Request) -> Response:
        """Hand leadership to `target`, or to the most up-to-date voter; answers once the
        new leader leads."""
        b = await read_json(request, TransferBody, required=False)
        try:
            leader = await admin.transfer_leader(b.target)
        except NotLeader as e:
            return not_leader(e, request.url.path)
        return _json({"success": True, "leader_id": leader})

    for route in r.routes:
        if isinstance(route, APIRoute) and route.name in _ANSWERS:
            route.response_description = _ANSWERS[route.name]
    return r


def admin_of(node: Node) -> ClusterAdmin | None:
    """The node's `ClusterAdmin`, or None if it cannot change membership."""
    return node.cluster_admin()


def _json(obj: Any) -> Response:
    return Response(m.dumps(obj), media_type="application/json")


def _leader_addr(admin: ClusterAdmin, hint: str) -> str:
    """The leader's HTTP address for a NOT_LEADER hint (a node id, or already HOST:PORT)."""
    status = admin.cluster_status()
    for member in status.members:
        if member.node_id == (hint or status.leader_id):
            return member.addrs.http_addr
    return hint if ":" in hint else ""
