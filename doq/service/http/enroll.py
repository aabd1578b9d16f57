"""Join-token routes of a secure node (doq/tls/enrollment.py; docs/security.md, "Join tokens"):

- `POST /cluster/join-tokens {"ttl_s"}` → `{"token"}`: a one-time token for a new member.
  A token is worth a member certificate: the client door requires an admin key for it
  (`doq.auth.table`). On a node that requires no keys (`loopback_only`), only a client on
  the leader's own machine (a loopback connection, not forwarded) may create one: anyone
  else gets 403 `LOOPBACK_ONLY`. A follower answers 503 `NOT_LEADER` with the leader.
- `GET /cluster/ca` → the cluster CA certificate (PEM; public): a joining node checks its
  fingerprint against its token's.
- `POST /cluster/enroll {"token", "node_id", "raft_addr", "grpc_addr", "http_addr",
  "store_id", "empty", "cluster_id", "csr"}` → `{"status", "ca_cert", "node_cert"}`:
  spends the token, adds the member under its store (as `POST /cluster/join`) and signs
  its certificate signing request for that node id (`doq.service.enrollment`; the CA key
  never leaves the leader). No key: the token authenticates it.

Only on a secure node (a node without TLS has no CA to hand out: these paths are 404).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from doq.errors import NotLeader
from doq.node.cluster import MemberAddrs
from doq.node.member_input import ADDR_MAX, ADDR_PATTERN, NODE_ID_PATTERN
from doq.service.enrollment import Enrollment
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.cluster import CLUSTER_ID_PATTERN, STORE_ID_PATTERN
from doq.service.http.lean import LeanRoute
from doq.service.http.problems import PROBLEM_JSON, problem_response
from doq.tls.enrollment import DEFAULT_TTL_S, MAX_TTL_S
from doq.tls.mode import is_loopback


class TokenBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra={"examples": [{"ttl_s": 3600}]})
    ttl_s: int = Field(DEFAULT_TTL_S, ge=1, le=MAX_TTL_S, description="Seconds the token stays usable.")


class TokenAnswer(BaseModel):
    token: str = Field(description="The join token (give it once to `doq serve --join-token`).")


class EnrollBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    token: str = Field(max_length=4096, description="A join token of this cluster.")
    node_id: str = Field(pattern=NODE_ID_PATTERN, description="The new member's node id.")
    raft_addr: str = Field(pattern=ADDR_PATTERN, max_length=ADDR_MAX, description="Its peer address HOST:PORT.")
    grpc_addr: str = Field(pattern=ADDR_PATTERN, max_length=ADDR_MAX, description="Its gRPC address HOST:PORT.")
    http_addr: str = Field(pattern=ADDR_PATTERN, max_length=ADDR_MAX, description="Its HTTP address HOST:PORT.")
    store_id: str = Field("", pattern=STORE_ID_PATTERN, description=(
        "Its store's id: the member is added under it (as `POST /cluster/join`), and the node "
        "votes only once its log holds the change that admitted this store."))
    empty: bool = Field(False, description="Its store holds no Raft data.")
    cluster_id: str = Field("", pattern=CLUSTER_ID_PATTERN, description=(
        "The cluster it means to join: refused (409 CLUSTER_MISMATCH) if this is another one."))
    csr: str = Field(max_length=8192, description=(
        "A PEM certificate signing request for the node's own key (ECDSA P-256): the answer's "
        "`node_cert` certifies that key for `node_id`."))


def _forbidden(path: str, detail: str) -> Response:
    doc = {"type": "about:blank", "title": "Permission denied", "status": 403, "detail": detail,
           "instance": path, "reason": "LOOPBACK_ONLY"}
    return Response(m.dumps(doc), status_code=403, media_type=PROBLEM_JSON)


def build_enroll_router(enrollment: Enrollment, *, loopback_only: bool = True) -> APIRouter:
    """The routes; `loopback_only`: tokens only for a loopback client (a node that requires
    no keys; where keys are required the door asks for an admin key instead)."""
    r = APIRouter(generate_unique_id_function=operation_id, route_class=LeanRoute)

    @r.post("/cluster/join-tokens", tags=["cluster"], response_model=TokenAnswer, summary="Create a join token",
            responses=errors(400, 403, 409, 413, 415), openapi_extra=body_doc(TokenBody, required=False))
    async def create_join_token(request: Request) -> Response:
        """A one-time join token for a new member, valid `ttl_s` seconds (`doq join-token create`)."""
        b = await read_json(request, TokenBody, required=False)
        client = request.client.host if request.client else ""
        if loopback_only and not is_loopback(client):
            return _forbidden(request.url.path, "join tokens are created through a loopback connection "
                              "to the leader (run `doq join-token create` on the leader's machine)")
        try:
            token = await enrollment.create_token(b.ttl_s)
        except NotLeader as e:
            return problem_response(e, request.url.path)
        return Response(m.dumps({"token": token}), media_type="application/json")

    @r.get("/cluster/ca", tags=["cluster"], summary="The cluster CA certificate",
           response_class=Response, responses={200: {"content": {"application/x-pem-file": {}}}})
    async def cluster_ca() -> Response:
        """The cluster CA's certificate (PEM, public): what clients give as `--ca-file`."""
        return Response(enrollment.ca_cert, media_type="application/x-pem-file")

    @r.post("/cluster/enroll", tags=["cluster"], summary="Enroll a member with a join token",
            responses=errors(400, 409, 413, 415), openapi_extra=body_doc(EnrollBody))
    async def enroll(request: Request) -> Response:
        """Spend a join token: add the node as a member; answer the cluster's status, the
        cluster CA certificate and the node's certificate (its CSR signed for `node_id`)."""
        b = await read_json(request, EnrollBody)
        try:
            doc = await enrollment.enroll(b.token, b.node_id,
                                          MemberAddrs(b.raft_addr, b.grpc_addr, b.http_addr, b.store_id),
                                          b.csr.encode(), empty=b.empty, cluster_id=b.cluster_id)
        except NotLeader as e:
            return problem_response(e, request.url.path)
        return Response(m.dumps(doc), media_type="application/json")

    return r
