"""The /cluster HTTP surface over a ClusterAdmin: JSON shapes, NOT_LEADER with the
leader's address, problem+json for bad input (and nothing changes), the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from doq.cluster_client import LEADER_HEADER, status_from_json
from doq.errors import Unavailable
from doq.node.cluster import Member, MemberAddrs
from doq.service.http.cluster import build_cluster_router
from tests.cluster.support import FakeCluster, cluster_app, three_members

NEW = {"node_id": "node-4", "raft_addr": "127.0.0.1:9004", "grpc_addr": "127.0.0.1:10004",
       "http_addr": "127.0.0.1:8004"}


@pytest.fixture
def leader() -> FakeCluster:
    return FakeCluster("node-1", "node-1", three_members())


@pytest.fixture
def follower() -> FakeCluster:
    return FakeCluster("node-2", "node-1", three_members())


async def client_for(node: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=cluster_app(node))
    async with httpx.AsyncClient(transport=transport, base_url="http://doq.test") as c:
        yield c


@pytest.fixture
async def lc(leader: FakeCluster) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for(leader):
        yield c


@pytest.fixture
async def fc(follower: FakeCluster) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for(follower):
        yield c


def assert_problem(r: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status and doc["reason"] == reason and doc["detail"]
    return doc


async def test_status_lists_members_leader_and_indexes(fc: httpx.AsyncClient) -> None:
    r = await fc.get("/cluster")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert {k: doc[k] for k in ("node_id", "role", "leader_id", "term", "commit_index", "applied_index")} == {
        "node_id": "node-2", "role": "follower", "leader_id": "node-1", "term": 3,
        "commit_index": 120, "applied_index": 118}
    assert doc["members"][0] == {"node_id": "node-1", "role": "voter", "leader": True, "raft_addr": "127.0.0.1:9001",
                                 "grpc_addr": "127.0.0.1:10001", "http_addr": "127.0.0.1:8001",
                                 "reachable": None, "last_contact_ms": None, "match_index": None, "lag": None}
    assert [m["leader"] for m in doc["members"]] == [True, False, False]
    assert status_from_json(doc).members == three_members()


async def test_join_adds_a_learner_and_is_idempotent(lc: httpx.AsyncClient, leader: FakeCluster) -> None:
    r = await lc.post("/cluster/join", json=NEW)
    assert r.status_code == 200, r.text
    status = status_from_json(r.json())
    assert status.members[-1] == Member("node-4", MemberAddrs("127.0.0.1:9004", "127.0.0.1:10004", "127.0.0.1:8004"),
                                        "learner")
    r = await lc.post("/cluster/join", json=NEW)
    assert r.status_code == 200 and len(r.json()["members"]) == 4
    assert leader.calls == [("add", "node-4")]
    r = await lc.post("/cluster/join", json={**NEW, "http_addr": "127.0.0.1:9999"})
    assert_problem(r, 409, "MEMBER_EXISTS")


@pytest.mark.parametrize("body", [
    {k: v for k, v in NEW.items() if k != "raft_addr"},
    {**NEW, "raft_addr": "no-port"},
    {**NEW, "grpc_addr": "host:port"},
    {**NEW, "node_id": ""},
    {**NEW, "node_id": "a/b"},
    {**NEW, "extra": 1},
    {**NEW, "node_id": 4},
])
async def test_join_rejects_bad_bodies_and_changes_nothing(lc: httpx.AsyncClient, leader: FakeCluster,
                                                           body: dict[str, Any]) -> None:
    assert_problem(await lc.post("/cluster/join", json=body), 400, "INVALID_REQUEST")
    assert leader.calls == []


async def test_join_needs_a_json_body(lc: httpx.AsyncClient, leader: FakeCluster) -> None:
    assert_problem(await lc.post("/cluster/join"), 400, "MISSING_BODY")
    assert_problem(await lc.post("/cluster/join", content=b"{", headers={"content-type": "application/json"}),
                   400, "MALFORMED_JSON")
    assert_problem(await lc.post("/cluster/join", content=b"x", headers={"content-type": "text/plain"}),
                   415, "UNSUPPORTED_MEDIA_TYPE")
    assert leader.calls == []


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/cluster/join", NEW),
    ("DELETE", "/cluster/members/node-3", None),
    ("POST", "/cluster/transfer-leader", {"target": "node-3"}),
])
async def test_follower_answers_not_leader_with_the_leaders_http_address(
    fc: httpx.AsyncClient, follower: FakeCluster, method: str, path: str, body: Any,
) -> None:
    r = await fc.request(method, path, json=body)
    doc = assert_problem(r, 503, "NOT_LEADER")
    assert doc["leader_hint"] == "node-1" and doc["retryable"] is True
    assert r.headers[LEADER_HEADER] == "127.0.0.1:8001"
    assert r.headers["retry-after"] == "1"
    assert follower.calls == []


async def test_not_leader_without_a_known_leader_has_no_header() -> None:
    lost = FakeCluster("node-2", "", three_members())
    async for c in client_for(lost):
        r = await c.post("/cluster/join", json=NEW)
        assert_problem(r, 503, "NOT_LEADER")
        assert LEADER_HEADER not in r.headers


async def test_remove_member(lc: httpx.AsyncClient, leader: FakeCluster) -> None:
    r = await lc.delete("/cluster/members/node-3")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert [m.node_id for m in leader.status.members] == ["node-1", "node-2"]
    assert_problem(await lc.delete("/cluster/members/node-3"), 404, "MEMBER_NOT_FOUND")
    assert leader.calls == [("remove", "node-3")]


@pytest.mark.parametrize("reason", ["CONF_CHANGE_PENDING", "CONF_CHANGE_TIMEOUT"])
async def test_a_membership_change_that_must_wait_is_a_retryable_503_as_documented(
        leader: FakeCluster, reason: str) -> None:
    """Another change not applied yet (or this one not in time): 503, retryable, nothing
    changed; the OpenAPI document names both reasons under 503 for join and removal."""

    async def busy(*_a: object, **_kw: object) -> None:
        raise Unavailable("membership change refused for now", reason=reason)

    leader.remove_member = busy  # type: ignore[method-assign]
    leader.add_member = busy  # type: ignore[method-assign,assignment]
    before = list(leader.status.members)
    async for c in client_for(leader):
        for r in (await c.delete("/cluster/members/node-3"), await c.post("/cluster/join", json=NEW)):
            assert assert_problem(r, 503, reason)["retryable"] is True
    assert leader.status.members == before
    paths = cluster_app(leader).openapi()["paths"]
    for op in (paths["/cluster/members/{node_id}"]["delete"], paths["/cluster/join"]["post"]):
        assert reason in op["responses"]["503"]["description"]
        assert "in progress" not in op["responses"]["409"]["description"]


async def test_transfer_leader_with_and_without_target(leader: FakeCluster) -> None:
    async for c in client_for(leader):
        assert_problem(await c.post("/cluster/transfer-leader", json={"target": "node-9"}), 404, "MEMBER_NOT_FOUND")
        assert_problem(await c.post("/cluster/transfer-leader", json={"target": 3}), 400, "INVALID_REQUEST")
        assert_problem(await c.post("/cluster/transfer-leader", json={"to": "node-2"}), 400, "INVALID_REQUEST")
        assert leader.calls == []
        r = await c.post("/cluster/transfer-leader", json={"target": "node-3"})
        assert r.status_code == 200 and r.json() == {"success": True, "leader_id": "node-3"}
    again = FakeCluster("node-1", "node-1", three_members())
    async for c in client_for(again):
        r = await c.post("/cluster/transfer-leader")  # no body: the best voter
        assert r.status_code == 200 and r.json()["leader_id"] == "node-2"


class _PlainNode:
    """A node that cannot change membership (`cluster_admin()` is None, as a LocalNode)."""

    node_id = "solo"
    leader_hint = "solo"

    def cluster_admin(self) -> None:
        return None


class _StatusOnlyNode(_PlainNode):
    """Such a node offering `cluster_status` (for ListServers) all the same."""

    def cluster_status(self) -> Any:
        return FakeCluster("solo", "solo", [Member("solo", MemberAddrs("a:1", "b:2", "c:3"), "voter")]).status


@pytest.mark.parametrize("node", [_PlainNode(), _StatusOnlyNode()])
async def test_a_node_without_a_cluster_admin_has_no_cluster_routes(node: Any) -> None:
    async for c in client_for(node):
        assert_problem(await c.get("/cluster"), 404, "NOT_FOUND")
        assert_problem(await c.post("/cluster/join", json=NEW), 404, "NOT_FOUND")


def test_openapi_documents_the_cluster_operations() -> None:
    from fastapi import FastAPI

    from doq.service.http.docs import install_docs

    app = FastAPI()
    app.router.routes.extend(build_cluster_router(SimpleNamespace(node=FakeCluster("n", "n", []))).routes)  # type: ignore[arg-type]
    install_docs(app)
    paths = app.openapi()["paths"]
    ops = {(p, meth): op for p, item in paths.items() for meth, op in item.items()}
    assert {k[1] + " " + k[0] for k in ops} == {
        "get /cluster", "get /cluster/identity", "post /cluster/join", "delete /cluster/members/{node_id}",
        "post /cluster/transfer-leader"}
    join = ops[("/cluster/join", "post")]
    assert join["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/JoinBody")
    assert "X-Doq-Leader" in join["responses"]["503"]["description"]
    assert {"200", "400", "409", "503"} <= join["responses"].keys()
    assert ops[("/cluster/transfer-leader", "post")]["requestBody"]["required"] is False
    assert all(op["tags"] == ["cluster"] and op["summary"] for op in ops.values())



@pytest.mark.parametrize("free", [123 << 20, None])
def test_a_status_with_storage_round_trips_and_prints(free: int | None) -> None:
    from doq.cluster_cli import format_status
    from doq.node.cluster import ClusterStatus, StorageUsage
    from doq.node.cluster_wire import status_to_json

    usage = StorageUsage(3 << 20, 16 << 20, free, 50 << 20)
    status = ClusterStatus("node-1", "node-1", 2, 9, 9, "leader", three_members(), storage=usage)
    assert status_from_json(status_to_json(status)) == status
    line = format_status(status).splitlines()[-1]
    assert line == ("storage of node-1: 3.0 MiB of 16.0 MiB used; disk "
                    f"{'123.0 MiB free' if free else 'not measured yet'} (limit 50.0 MiB)")
    old = status_to_json(status)
    del old["storage"]  # an older node's answer
    assert status_from_json(old).storage is None
