"""The client door in process: the gateway app over the real service (a `LocalNode` over
LMDB; httpx over ASGI, no socket), keys created through the log like any command; and
when a node requires keys (`doq.auth.mode`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from doq.auth.admin import create_key
from doq.auth.authorizer import Authorizer
from doq.auth.mode import keys_required
from doq.config import ServeConfig
from doq.errors import InvalidArgument
from doq.service.api import QueueService
from doq.service.http_gateway import create_app
from tests.support.inproc import local_service

Q = "/API/v1/queues"


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[QueueService]:
    async with local_service(tmp_path) as s:
        yield s


def _client(service: QueueService, required: bool) -> httpx.AsyncClient:
    app = create_app(service, Authorizer(service.node.state.keys, required=required))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://doq")


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_an_open_node_needs_no_key_but_holds_a_presented_key_to_its_scopes(service: QueueService) -> None:
    async with _client(service, required=False) as c:  # dev mode registers no key: an empty table is final
        r = await c.get(Q, headers=_auth("doq_0000_nope"))
        assert (r.status_code, r.json()["reason"]) == (401, "INVALID_KEY")
    metrics = (await create_key(service.node, ["metrics"])).token
    async with _client(service, required=False) as c:
        assert (await c.post(Q, json={"name": "a", "type": "delayed"})).status_code == 201  # the seed's curl
        r = await c.post(Q, json={"name": "b"}, headers=_auth("doq_0000_nope"))
        assert (r.status_code, r.json()["reason"]) == (401, "INVALID_KEY")
        r = await c.post(Q, json={"name": "b"}, headers=_auth(metrics))
        assert (r.status_code, r.json()["reason"]) == (403, "SCOPE_REQUIRED")
        assert (await c.get("/metrics", headers=_auth(metrics))).status_code == 200
        assert [q.name for q in service.node.state.list_queues()] == ["a"]  # the refusals changed nothing


async def test_a_node_that_requires_keys_refuses_a_call_without_one(service: QueueService) -> None:
    admin = (await create_key(service.node, ["admin"])).token
    async with _client(service, required=True) as c:
        r = await c.get(Q)
        assert (r.status_code, r.json()["reason"], r.headers["www-authenticate"]) == (401, "KEY_REQUIRED", "Bearer")
        assert r.headers["content-type"] == "application/problem+json"
        r = await c.get(Q, headers={"Authorization": f"Basic {admin}"})
        assert r.status_code == 401
        assert (await c.get(Q, headers=_auth(admin))).status_code == 200
        assert (await c.get("/livez")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/openapi.json")).status_code == 200


async def test_a_node_that_requires_keys_but_knows_none_yet_answers_retry_not_invalid(service: QueueService) -> None:
    """A new cluster before its first admin key commits (or a member before the table
    reaches it) cannot call any key invalid: 503 NO_KEYS_YET, retryable; a key once known
    is checked as always."""
    async with _client(service, required=True) as c:
        r = await c.get(Q, headers=_auth("doq_0000_notyet"))
        assert (r.status_code, r.json()["reason"], r.json()["retryable"]) == (503, "NO_KEYS_YET", True)
        assert (await c.get(Q)).json()["reason"] == "KEY_REQUIRED"  # no key at all: still 401
        admin = (await create_key(service.node, ["admin"])).token
        r = await c.get(Q, headers=_auth("doq_0000_notyet"))
        assert (r.status_code, r.json()["reason"]) == (401, "INVALID_KEY")
        assert (await c.get(Q, headers=_auth(admin))).status_code == 200


async def test_bad_key_requests_change_nothing(service: QueueService) -> None:
    admin = (await create_key(service.node, ["admin"])).token
    async with _client(service, required=True) as c:
        for bad in ([], ["root"], ["produce:"], ["metrics:x"], "admin"):
            r = await c.post("/API/v1/keys", json={"scopes": bad}, headers=_auth(admin))
            assert r.status_code == 400, bad
        r = await c.delete("/API/v1/keys/nokey", headers=_auth(admin))
        assert (r.status_code, r.json()["reason"]) == (404, "KEY_NOT_FOUND")
        assert list(service.node.state.keys()) == [admin.split("_")[1]]


@pytest.mark.parametrize("addrs, secure, insecure, required", [
    (("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), False, False, False),
    (("localhost:1", "[::1]:2", "127.0.0.5:3"), False, False, False),
    (("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), True, False, True),
    (("0.0.0.0:1", "127.0.0.1:2", "127.0.0.1:3"), False, False, True),
    (("127.0.0.1:1", "127.0.0.1:2", "doq-0.doq-internal:3"), False, False, True),
    (("0.0.0.0:1", "0.0.0.0:2", "0.0.0.0:3"), False, True, False),
])
def test_keys_are_required_when_secure_or_bound_beyond_loopback(
        addrs: tuple[str, str, str], secure: bool, insecure: bool, required: bool) -> None:
    config = ServeConfig(grpc_addr=addrs[0], http_addr=addrs[1], raft_addr=addrs[2], secure=secure, insecure=insecure)
    assert keys_required(config) is required


def test_keys_are_required_exactly_where_tls_is_on() -> None:
    """One decision for both (`doq.auth.mode.runs_secure`): a node enrolling with a join
    token, or announcing a non-loopback host, serves TLS and requires keys."""
    loop = {"grpc_addr": "127.0.0.1:1", "http_addr": "127.0.0.1:2", "raft_addr": "127.0.0.1:3"}
    assert keys_required(ServeConfig(**loop, join=("127.0.0.1:9",), join_token="doqjt1.x")) is True
    assert keys_required(ServeConfig(**loop, advertise_host="doq-1.example")) is True
    with pytest.raises(InvalidArgument):  # --join-token means secure: not with --insecure
        keys_required(ServeConfig(**loop, join=("127.0.0.1:9",), join_token="doqjt1.x", insecure=True))


def test_every_admin_action_of_the_table_is_audited() -> None:
    from doq.auth.table import GRPC_RULES, HTTP_RULES

    for (method, path), rule in HTTP_RULES.items():
        changes = method in ("POST", "PUT", "DELETE")
        if changes and (rule.scopes == ("admin",) or path.startswith("/db/")):
            assert rule.audit, (method, path)
    audited = {rule.audit for rule in GRPC_RULES.values() if rule.audit} | {
        rule.audit for rule in HTTP_RULES.values() if rule.audit}
    assert audited == {"queue.create", "queue.update", "queue.delete", "queue.purge", "queue.redrive",
                       "queue.redrive_cancel", "key.create", "key.revoke",
                       "member.add", "member.remove", "leader.transfer", "backup", "restore", "join_token.create",
                       "tls.renew", "tls.sign", "tls.trust", "tls.ca_begin", "tls.ca_promote", "tls.reload"}
    for name, rule in GRPC_RULES.items():
        if rule.scopes == ("admin",) and not name.endswith("/ListKeys"):
            assert rule.audit, name


async def test_admin_actions_are_logged_once_with_key_id_target_and_result(
        service: QueueService, caplog: pytest.LogCaptureFixture) -> None:
    import json

    admin = await create_key(service.node, ["admin"])
    async with _client(service, required=True) as c:
        with caplog.at_level("INFO", logger="doq.audit"):
            assert (await c.post(Q, json={"name": "a"}, headers=_auth(admin.token))).status_code == 201
            assert (await c.delete(f"{Q}/zz", headers=_auth(admin.token))).status_code == 404
            r = await c.post("/API/v1/keys", json={"scopes": ["metrics"]}, headers=_auth(admin.token))
            assert (await c.post(Q, json={"name": "b"})).status_code == 401  # refused: not an action
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "doq.audit"]
    assert [(x["audit"], x["key"], x["target"], x["result"]) for x in lines] == [
        ("queue.create", admin.record.id, "a", "ok"),
        ("queue.delete", admin.record.id, "zz", "http 404"),
        ("key.create", admin.record.id, r.json()["id"], "ok"),
    ]
    assert admin.token not in caplog.text and r.json()["key"] not in caplog.text
class _Enrollment:  # the join-token routes exist only on a secure node; their handlers are not called here
    ca_cert = b"-----BEGIN CERTIFICATE-----\n"


def _every_route(service: QueueService) -> tuple[set[tuple[str, str]], list[str]]:
    """(method, path) of every route the gateway can serve, in or out of the OpenAPI
    document (the dashboard, the docs pages), the `/cluster` routes of a clustered node
    and the join-token and certificate routes of a secure one; and the paths of mounted
    file trees."""
    from types import SimpleNamespace

    from starlette.routing import Mount

    from doq.service.http.cluster import build_cluster_router

    app = create_app(service, enrollment=_Enrollment(), tls_admin=object())  # type: ignore[arg-type]
    clustered = SimpleNamespace(node=SimpleNamespace(cluster_admin=lambda: object()))
    ops: set[tuple[str, str]] = set()
    mounts: list[str] = []
    for route in [*app.router.routes, *build_cluster_router(clustered).routes]:  # type: ignore[arg-type]
        if isinstance(route, Mount):
            mounts.append(route.path)
            continue
        ops |= {(m, getattr(route, "path_format", route.path)) for m in getattr(route, "methods", None) or () if m != "HEAD"}
    return ops, mounts


async def test_every_route_of_the_gateway_is_in_the_table_and_no_rule_is_stale(service: QueueService) -> None:
    """Walks the app's own routes (not only the OpenAPI document: `/ui`, `/docs` are not in
    it), so a route added anywhere without a rule fails here."""
    from doq.auth.table import HTTP_RULES, OPEN_PATH_PREFIXES

    ops, mounts = _every_route(service)
    assert {("GET", "/ui"), ("GET", "/events"), ("POST", "/cluster/enroll"), ("GET", "/cluster/identity"),
            ("POST", "/cluster/tls/renew"),
            ("GET", "/API/v1/queues/{name}/messages:peek")} <= ops
    assert not sorted(ops - HTTP_RULES.keys()), "routes missing from doq.auth.table.HTTP_RULES"
    assert not sorted(HTTP_RULES.keys() - ops), "rules for routes that do not exist"
    assert [m for m in mounts if m + "/" not in OPEN_PATH_PREFIXES] == []


async def test_the_dashboard_page_is_open_its_data_needs_a_key(service: QueueService) -> None:
    metrics = (await create_key(service.node, ["metrics"])).token
    async with _client(service, required=True) as c:
        r = await c.get("/ui")
        assert r.status_code == 200 and "<html" in r.text.lower()
        assert (await c.get("/static/ui/app.js")).status_code == 200
        r = await c.get("/events")
        assert (r.status_code, r.json()["reason"]) == (401, "KEY_REQUIRED")
        backup = (await create_key(service.node, ["backup"])).token
        r = await c.get("/events", headers=_auth(backup))
        assert (r.status_code, r.json()["reason"]) == (403, "SCOPE_REQUIRED")
        r = await c.get("/API/v1/queues/q/messages:peek", headers=_auth(metrics))
        assert (r.status_code, r.json()["reason"]) == (403, "SCOPE_REQUIRED")


@pytest.mark.parametrize("settle", ["nack", "ack", "touch"])
async def test_a_key_for_one_queue_prefix_cannot_settle_a_message_of_another_queue(
    service: QueueService, settle: str
) -> None:
    """A consumer key scoped to the queues starting with `a` holds no lease of queue `b`:
    settling a delivered message of `b` is refused SCOPE_REQUIRED and leaves it in flight."""
    admin = _auth((await create_key(service.node, ["admin"])).token)
    only_a = _auth((await create_key(service.node, ["consume:a"])).token)
    async with _client(service, required=True) as c:
        for name in ("a", "b"):
            assert (await c.post(Q, json={"name": name}, headers=admin)).status_code == 201
        assert (await c.post(f"{Q}/b/messages", json={"content": "x"}, headers=admin)).status_code == 201
        msg = (await c.get(f"{Q}/b/messages", params={"ack": "false"}, headers=admin)).json()
        r = await c.post(f"{Q}/b/messages/{msg['id']}/{settle}", json={"lease_id": msg["lease_id"]}, headers=only_a)
        assert (r.status_code, r.json()["reason"]) == (403, "SCOPE_REQUIRED")
        now = (await c.get(f"{Q}/b/messages/{msg['id']}", headers=admin)).json()
        assert (now["state"], now["lease_id"], now["lease_expires_at_ms"]) == (
            "in_flight", msg["lease_id"], msg["lease_expires_at_ms"])
