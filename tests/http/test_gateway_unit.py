"""The HTTP adapter over the real service (LocalNode, LMDB in a temp dir): mapping, JSON
shapes, problem+json errors.

Every refused request is checked to have changed nothing: the stored queue, message,
dedup and tombstone records are the same before and after (`user_records`). Error rows
the real node cannot be made to produce on demand (not the leader, overload, commit
timeout...) are injected by replacing one facade method on the service instance.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query, Request
from starlette.responses import JSONResponse

from doq.errors import (
    AlreadyExists,
    DoqError,
    FailedPrecondition,
    InvalidArgument,
    MessageNotFound,
    NotLeader,
    Overloaded,
    QueueNotFound,
    StaleLease,
    TooLarge,
    Unavailable,
)
from doq.service.api import QueueService
from doq.service.http.lean import LeanRoute
from doq.service.http.problems import install_handlers
from doq.service.http_gateway import DESCRIPTION, body_limits
from tests.support.inproc import http_client, user_records

Q = "/API/v1/queues"
PROBLEM_KEYS = {"type", "title", "status", "detail", "reason", "retryable", "leader_hint"}


def assert_problem(r: httpx.Response, status: int, reason: str | None = None) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert PROBLEM_KEYS <= doc.keys()
    assert doc["status"] == status
    assert doc["detail"]
    if reason:
        assert doc["reason"] == reason, doc
    return doc


async def make_queue(client: httpx.AsyncClient, name: str = "q1") -> None:
    r = await client.post(Q, json={"name": name, "type": "delayed"})
    assert r.status_code == 201, r.text


async def test_queue_lifecycle(client: httpx.AsyncClient) -> None:
    r = await client.post(Q, json={"name": "jobs", "type": "fair", "settings": {"max_attempts": 3}})
    assert r.status_code == 201
    assert r.json()["queue"]["type"] == "fair"
    assert r.json()["queue"]["settings"]["max_attempts"] == 3
    assert_problem(await client.post(Q, json={"name": "jobs"}), 409, "QUEUE_EXISTS")  # kind already_exists
    r = await client.put(f"{Q}/jobs", json={"settings": {"visibility_timeout_ms": 5000}})
    assert r.json()["queue"]["settings"]["visibility_timeout_ms"] == 5000
    await client.post(f"{Q}/jobs/messages", json={"content": "a", "group": "g"})
    r = await client.get(f"{Q}/jobs")
    assert r.json()["stats"] == {"ready": 1, "delayed": 0, "in_flight": 0, "dead": 0, "total": 1}
    assert [q["name"] for q in (await client.get(Q)).json()["queues"]] == ["jobs"]
    assert (await client.post(f"{Q}/jobs/purge")).json() == {"success": True, "purged": 1}
    assert (await client.delete(f"{Q}/jobs")).json() == {"success": True}
    assert_problem(await client.get(f"{Q}/jobs"), 404, "QUEUE_NOT_FOUND")


async def test_enqueue_dequeue_ack_with_string_ids(client: httpx.AsyncClient) -> None:
    await make_queue(client)
    r = await client.post(f"{Q}/q1/messages", json={"content": "{\"user_id\": 1}", "group": "default", "priority": 60})
    assert r.status_code == 201
    doc = r.json()
    assert doc["id"] == "1" and doc["success"] is True and doc["duplicate"] is False
    r = await client.get(f"{Q}/q1/messages", params={"ack": "false"})
    msg = r.json()
    assert msg["id"] == "1" and msg["content"] == "{\"user_id\": 1}" and msg["content_encoding"] == "text"
    assert msg["state"] == "in_flight" and isinstance(msg["lease_id"], str)
    r = await client.post(f"{Q}/q1/messages/1/touch",
                          json={"lease_id": msg["lease_id"], "visibility_timeout_ms": 3_600_000})
    until = r.json()["lease_expires_at_ms"]  # an hour from the touch: far past the queue's 30 s
    assert r.json()["success"] is True and until >= int(msg["lease_expires_at_ms"]) + 3_000_000
    assert int((await client.get(f"{Q}/q1/messages/1")).json()["lease_expires_at_ms"]) == until
    stale = int(msg["lease_id"]) + 1
    assert_problem(await client.post(f"{Q}/q1/messages/1/ack", json={"lease_id": stale}), 409, "STALE_LEASE")
    r = await client.post(f"{Q}/q1/messages/1/ack", json={"lease_id": int(msg["lease_id"])})  # integer id accepted
    assert r.json() == {"success": True}
    assert_problem(await client.post(f"{Q}/q1/messages/1/ack"), 404, "MESSAGE_NOT_FOUND")


async def test_empty_queue_dequeue_is_204(client: httpx.AsyncClient) -> None:
    await make_queue(client)
    r = await client.get(f"{Q}/q1/messages", params={"ack": "true", "wait_ms": 10})
    assert r.status_code == 204 and r.content == b""
    r = await client.post(f"{Q}/q1/messages:dequeue", json={"max_messages": 5})
    assert r.json() == {"messages": []}


async def test_nack_priority_get_delete(client: httpx.AsyncClient) -> None:
    await make_queue(client)
    await client.post(f"{Q}/q1/messages", json={"content": "x", "metadata": {"k": "v"}})
    lease = (await client.get(f"{Q}/q1/messages")).json()["lease_id"]
    assert_problem(await client.post(f"{Q}/q1/messages/1/nack", json={"priority": 7}), 400, "LEASE_REQUIRED")
    r = await client.post(f"{Q}/q1/messages/1/nack", json={"priority": 7, "lease_id": lease})
    assert r.json() == {"success": True}
    assert (await client.get(f"{Q}/q1/messages/1")).json()["priority"] == 7
    r = await client.put(f"{Q}/q1/messages/1/priority", json={"priority": 12})
    assert r.json()["success"] is True and r.json()["message"]["priority"] == 12
    assert (await client.get(f"{Q}/q1/messages/1")).json()["metadata"] == {"k": "v"}
    assert (await client.delete(f"{Q}/q1/messages/1")).json() == {"success": True}
    assert_problem(await client.get(f"{Q}/q1/messages/1"), 404, "MESSAGE_NOT_FOUND")


async def test_binary_content_round_trips_as_base64(client: httpx.AsyncClient, service: QueueService) -> None:
    await make_queue(client)
    raw = bytes(range(256))
    r = await client.post(f"{Q}/q1/messages", json={"content": base64.b64encode(raw).decode(), "content_encoding": "base64"})
    assert r.status_code == 201
    assert service.node.state.get_message("q1", 1).content == raw
    msg = (await client.get(f"{Q}/q1/messages?ack=true")).json()
    assert msg["content_encoding"] == "base64" and base64.b64decode(msg["content"]) == raw
    before = user_records(service)
    assert_problem(await client.post(f"{Q}/q1/messages", json={"content": "!!", "content_encoding": "base64"}), 400,
                   "INVALID_CONTENT")
    assert user_records(service) == before


async def test_batch_enqueue_and_ack(client: httpx.AsyncClient) -> None:
    await make_queue(client)
    msgs = [{"content": f"m{i}", "priority": i - 10} for i in range(3)] + [{"content": "d", "dedup_id": "k"}] * 2
    r = await client.post(f"{Q}/q1/messages:batch", json={"messages": msgs})
    res = r.json()["results"]
    assert [x["success"] for x in res] == [True] * 5
    assert [x["id"] for x in res] == ["1", "2", "3", "4", "4"] and res[4]["duplicate"] is True
    got = (await client.post(f"{Q}/q1/messages:dequeue", json={"max_messages": 2})).json()["messages"]
    assert [m["id"] for m in got] == ["1", "2"]
    assert_problem(await client.post(f"{Q}/q1/messages:ack", json={"ids": ["1", 2]}), 400, "LEASE_REQUIRED")
    leases = [m["lease_id"] for m in got]
    r = await client.post(f"{Q}/q1/messages:ack", json={"ids": ["1", 2, "3"], "lease_ids": [*leases, "1"]})
    res = r.json()["results"]
    assert [(x["id"], x["success"]) for x in res] == [("1", True), ("2", True), ("3", False)]
    assert res[2]["error"]["reason"] == "STALE_LEASE" and res[2]["error"]["status"] == 409  # never delivered
    assert_problem(await client.post(f"{Q}/nope/messages:batch", json={"messages": msgs}), 404, "QUEUE_NOT_FOUND")


@pytest.mark.parametrize(
    ("bad", "status", "reason"),
    [
        ({"content": "!!", "content_encoding": "base64"}, 400, "INVALID_CONTENT"),
        ({"content": "x" * (1024 * 1024 + 1)}, 413, "MESSAGE_TOO_LARGE"),
        ({"content": "a", "metadata": {f"k{i}": "v" for i in range(65)}}, 400, "METADATA_TOO_LARGE"),
        ({"content": "a", "group": "\u00e9" * 200}, 400, "INVALID_GROUP"),  # 400 bytes > 256
    ],
)
async def test_batch_enqueue_is_all_or_nothing(
    client: httpx.AsyncClient, service: QueueService, bad: dict[str, object], status: int, reason: str
) -> None:
    """One invalid message refuses the whole batch, naming it; nothing is enqueued."""
    await make_queue(client)
    before = user_records(service)
    msgs = [{"content": "ok0"}, {"content": "ok1"}, bad, {"content": "ok3"}]
    r = await client.post(f"{Q}/q1/messages:batch", json={"messages": msgs})
    doc = assert_problem(r, status, reason)
    assert doc["detail"].startswith("messages[2]: ") and "nothing was enqueued" in doc["detail"]  # type: ignore[union-attr]
    assert doc["errors"][0]["loc"] == ["body", "messages", 2]  # type: ignore[index]
    assert user_records(service) == before
    # a wrong JSON type in one item is refused by the body's schema, also as a whole
    msgs[2] = {"content": "a", "priority": "60"}
    doc = assert_problem(await client.post(f"{Q}/q1/messages:batch", json={"messages": msgs}), 400, "INVALID_REQUEST")
    assert doc["errors"][0]["loc"] == ["body", "messages", 2, "priority"]  # type: ignore[index]
    assert user_records(service) == before
    assert (await client.get(f"{Q}/q1")).json()["stats"]["total"] == 0


async def test_batch_enqueue_command_level_errors_are_the_answer(
    client: httpx.AsyncClient, service: QueueService
) -> None:
    from doq.errors import NotLeader

    msgs = {"messages": [{"content": "a"}, {"content": "b"}]}
    assert_problem(await client.post(f"{Q}/bad%20name/messages:batch", json=msgs), 400, "INVALID_QUEUE_NAME")
    await make_queue(client)
    err = NotLeader("not the leader", leader_hint="127.0.0.1:8002")

    async def refuse(requests: object, *, caller: object = None) -> list[object]:
        return [err, err]  # what the facade answers when the one proposal is refused

    service.enqueue_many = refuse  # type: ignore[assignment,method-assign]
    doc = assert_problem(await client.post(f"{Q}/q1/messages:batch", json=msgs), 503, "NOT_LEADER")
    assert doc["leader_hint"] == "127.0.0.1:8002"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "reason"),
    [
        ("POST", f"{Q}/q1/messages", b'{"content": "a",', 400, "MALFORMED_JSON"),
        ("POST", f"{Q}/q1/messages", b"[1, 2]", 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": 5}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": "a", "priority": "60"}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": "a", "priority": 1.5}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": "a", "priority": 9223372036854775808}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": "a", "colour": "red"}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b'{"content": "a", "delay_ms": -1}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages", b"", 400, "MISSING_BODY"),
        ("POST", f"{Q}/nope/messages", b'{"content": "a"}', 404, "QUEUE_NOT_FOUND"),
        ("POST", f"{Q}/bad%20name/messages", b'{"content": "a"}', 400, "INVALID_QUEUE_NAME"),
        ("POST", Q, b'{"name": "bad name"}', 400, "INVALID_QUEUE_NAME"),
        ("POST", Q, b'{"name": "q2", "type": "lifo"}', 400, "INVALID_REQUEST"),
        ("POST", Q, b'{"name": "q2", "settings": {"max_attempts": -1}}', 400, "INVALID_REQUEST"),
        ("PUT", f"{Q}/q1/messages/1/priority", b'{"priority": true}', 400, "INVALID_REQUEST"),
        ("PUT", f"{Q}/q1/messages/abc/priority", b'{"priority": 1}', 400, "INVALID_ID"),
        ("PUT", f"{Q}/q1/messages/0/priority", b'{"priority": 1}', 400, "INVALID_ID"),
        ("POST", f"{Q}/q1/messages/1/ack", b'{"lease_id": "x"}', 400, "INVALID_REQUEST"),
        ("POST", f"{Q}/q1/messages:ack", b'{"ids": []}', 400, "INVALID_REQUEST"),
        ("GET", f"{Q}/q1/messages?wait_ms=-5", b"", 400, "INVALID_REQUEST"),
        ("GET", f"{Q}/q1/messages?ack=maybe", b"", 400, "INVALID_REQUEST"),
        ("GET", "/API/v1/nothing", b"", 404, "NOT_FOUND"),
        ("PATCH", f"{Q}/q1", b"{}", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_bad_requests_are_problems_and_change_nothing(
    client: httpx.AsyncClient, service: QueueService, method: str, path: str, body: bytes, status: int, reason: str
) -> None:
    await make_queue(client)
    await client.post(f"{Q}/q1/messages", json={"content": "keep"})
    before = user_records(service)
    r = await client.request(method, path, content=body, headers={"Content-Type": "application/json"})
    doc = assert_problem(r, status, reason)
    assert doc["retryable"] is False
    assert user_records(service) == before


async def test_validation_problem_names_the_field(client: httpx.AsyncClient) -> None:
    await make_queue(client)
    r = await client.post(f"{Q}/q1/messages", json={"content": "a", "priority": "high"})
    doc = assert_problem(r, 400, "INVALID_REQUEST")
    assert "priority" in doc["detail"]  # type: ignore[operator]
    assert doc["errors"][0]["loc"] == ["body", "priority"]  # type: ignore[index]


async def test_wrong_content_type_is_415(client: httpx.AsyncClient, service: QueueService) -> None:
    await make_queue(client)
    before = user_records(service)
    r = await client.post(f"{Q}/q1/messages", content=b'{"content": "a"}', headers={"Content-Type": "text/plain"})
    assert_problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert user_records(service) == before
    # curl -d without -H sends application/x-www-form-urlencoded: accepted as JSON
    r = await client.post(f"{Q}/q1/messages", content=b'{"content": "a"}',
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 201 and user_records(service) != before
    assert (await client.get(f"{Q}/q1")).json()["stats"]["total"] == 1


async def test_oversized_bodies_are_413_and_change_nothing(client: httpx.AsyncClient, service: QueueService) -> None:
    await make_queue(client)
    single, batch = body_limits(service.limits.max_message_bytes)
    before = user_records(service)
    big = json.dumps({"content": "x" * (single + 10)}).encode()
    r = await client.post(f"{Q}/q1/messages", content=big, headers={"Content-Type": "application/json"})
    assert_problem(r, 413, "BODY_TOO_LARGE")

    async def chunks():  # no Content-Length: refused while streaming
        for _ in range(single // 65536 + 2):
            yield b"x" * 65536

    r = await client.post(f"{Q}/q1/messages", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_problem(r, 413, "BODY_TOO_LARGE")
    # within the body limit but over the message limit: the service's TooLarge (413)
    r = await client.post(f"{Q}/q1/messages", json={"content": "x" * (service.limits.max_message_bytes + 1)})
    assert_problem(r, 413, "MESSAGE_TOO_LARGE")
    assert user_records(service) == before
    # a batch body may exceed the single-message limit
    msgs = [{"content": "y" * 1000}] * ((single // 1000) + 10)
    r = await client.post(f"{Q}/q1/messages:batch", json={"messages": msgs})
    assert r.status_code == 200 and len(r.json()["results"]) == len(msgs)


async def test_not_leader_is_503_with_hint(client: httpx.AsyncClient, service: QueueService) -> None:
    from doq.errors import NotLeader

    async def refuse(*a: object, **k: object) -> None:
        raise NotLeader("not the leader", leader_hint="127.0.0.1:8002")

    service.create_queue = refuse  # type: ignore[method-assign]
    r = await client.post(Q, json={"name": "x"})
    doc = assert_problem(r, 503, "NOT_LEADER")
    assert doc["retryable"] is True and doc["leader_hint"] == "127.0.0.1:8002"
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("error", "status", "reason", "retry_after"),
    [
        (InvalidArgument("bad"), 400, "INVALID_ARGUMENT", None),
        (QueueNotFound("queue 'q1' does not exist"), 404, "QUEUE_NOT_FOUND", None),
        (MessageNotFound("message 1 not found"), 404, "MESSAGE_NOT_FOUND", None),
        (AlreadyExists("exists"), 409, "ALREADY_EXISTS", None),
        (FailedPrecondition("not in flight", reason="NOT_IN_FLIGHT"), 409, "NOT_IN_FLIGHT", None),
        (StaleLease("stale"), 409, "STALE_LEASE", None),
        (TooLarge("too large", reason="MESSAGE_TOO_LARGE"), 413, "MESSAGE_TOO_LARGE", None),
        (Overloaded("too many commands waiting"), 429, "OVERLOADED", "1"),
        (NotLeader("not the leader", leader_hint="127.0.0.1:8002"), 503, "NOT_LEADER", "1"),
        (Unavailable("shutting down", reason="SHUTTING_DOWN"), 503, "SHUTTING_DOWN", "1"),
    ],
)
async def test_error_table_on_every_path(
    client: httpx.AsyncClient, service: QueueService, error: DoqError, status: int, reason: str,
    retry_after: str | None,
) -> None:
    """Each domain error answers the status of ARCHITECTURE's table, as problem+json, from
    enqueue, dequeue and ack alike (the gateway adds no mapping of its own)."""
    await make_queue(client)

    async def fail(*a: object, **k: object) -> None:
        raise error

    for name in ("enqueue", "dequeue", "ack"):
        setattr(service, name, fail)
    for method, path, body in [("POST", f"{Q}/q1/messages", {"content": "a"}),
                               ("GET", f"{Q}/q1/messages?wait_ms=5", None),
                               ("POST", f"{Q}/q1/messages/7/ack", None)]:
        r = await client.request(method, path, json=body)
        doc = assert_problem(r, status, reason)
        assert doc["retryable"] is error.retryable and doc["detail"] == error.message
        assert doc["leader_hint"] == error.leader_hint
        assert r.headers.get("retry-after") == retry_after


async def test_unexpected_exception_is_a_500_problem(service: QueueService) -> None:
    async def boom(*a: object, **k: object) -> None:
        raise RuntimeError("bug")

    service.list_queues = boom  # type: ignore[method-assign]
    async with http_client(service, raise_app_exceptions=False) as c:
        doc = assert_problem(await c.get(Q), 500, "INTERNAL")
    assert "RuntimeError" in doc["detail"] and "bug" not in doc["detail"]  # no internals leak


async def test_health_and_metrics(client: httpx.AsyncClient, service: QueueService) -> None:
    assert (await client.get("/livez")).json() == {"status": "ok", "reasons": []}
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True
    await make_queue(client, "depth_q")
    await client.post(f"{Q}/depth_q/messages", json={"content": "a"})
    await client.post(f"{Q}/depth_q/messages", json={"content": "b"})
    await client.get(f"{Q}/depth_q/messages")
    await service.node.stop()  # a stopping node is no leader: not ready
    r = await client.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False and r.json()["reasons"] == ["shutting_down"]
    assert (await client.get("/livez")).status_code == 200
    text = (await client.get("/metrics")).text
    assert 'doq_queue_messages{queue="depth_q",state="ready"} 1.0' in text
    assert 'doq_queue_messages{queue="depth_q",state="in_flight"} 1.0' in text
    assert re.search(r'doq_messages_enqueued_total\{transport="http"\} [1-9]', text)
    assert "doq_commit_seconds_bucket" in text and "doq_fsync_seconds_bucket" in text
    assert "doq_node_is_leader 0.0" in text


async def test_openapi_document(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["description"] == DESCRIPTION  # what the API is, shown atop /docs and /redoc
    text = json.dumps(doc)
    assert "HTTPValidationError" not in text and '"422"' not in text
    for ref in set(re.findall(r'"#/components/schemas/([^"]+)"', text)):
        assert ref in doc["components"]["schemas"], ref
    paths = doc["paths"]
    for path, methods in {
        "/API/v1/queues": {"get", "post"},
        "/API/v1/queues/{name}": {"get", "put", "delete"},
        "/API/v1/queues/{name}/purge": {"post"},
        "/API/v1/queues/{name}/messages": {"get", "post"},
        "/API/v1/queues/{name}/messages:batch": {"post"},
        "/API/v1/queues/{name}/messages:dequeue": {"post"},
        "/API/v1/queues/{name}/messages:ack": {"post"},
        "/API/v1/queues/{name}/messages/{id}": {"get", "delete"},
        "/API/v1/queues/{name}/messages/{id}/ack": {"post"},
        "/API/v1/queues/{name}/messages/{id}/nack": {"post"},
        "/API/v1/queues/{name}/messages/{id}/touch": {"post"},
        "/API/v1/queues/{name}/messages/{id}/priority": {"put"},
        "/db/backup": {"post"}, "/db/restore": {"post"},
        "/livez": {"get"}, "/readyz": {"get"}, "/metrics": {"get"},
    }.items():
        assert methods <= set(paths[path]), path
    enqueue = paths["/API/v1/queues/{name}/messages"]["post"]
    assert enqueue["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/EnqueueBody")
    assert "application/problem+json" in enqueue["responses"]["404"]["content"]
    assert "204" in paths["/API/v1/queues/{name}/messages"]["get"]["responses"]
    schemas = doc["components"]["schemas"]
    assert schemas["EnqueueResultModel"]["properties"]["id"]["type"] == "string"
    assert schemas["EnqueueBody"]["additionalProperties"] is False
    assert schemas["EnqueueBody"]["examples"][0]["content"] == "{\"user_id\": 1}"
    assert schemas["MessageModel"]["properties"]["id"]["type"] == "string"
    assert set(schemas["Problem"]["required"]) == PROBLEM_KEYS
    for name in ("EnqueueResultModel", "MessageModel", "MessageList", "QueueModel", "QueueList",
                 "BatchEnqueueResult", "AckBatchResult", "Problem", "EnqueueBatchBody", "AckBatchBody"):
        assert schemas[name].get("examples"), f"{name} has no example"
    ids = []
    for path, item in paths.items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            ids.append(op["operationId"])
            assert re.fullmatch(r"[a-z_]+", op["operationId"]), where
            assert op.get("summary") and op.get("description"), where
            for status, answer in op["responses"].items():
                assert answer["description"] and answer["description"] != "Successful Response", (where, status)
                if path.startswith("/API/") and int(status) >= 400:
                    assert answer["content"] == {"application/problem+json": {
                        "schema": {"$ref": "#/components/schemas/Problem"}}}, (where, status)
    assert len(ids) == len(set(ids))
    # long poll on dequeue: wait_ms, bounded
    params = {p["name"]: p for p in paths["/API/v1/queues/{name}/messages"]["get"]["parameters"]}
    assert params["wait_ms"]["in"] == "query" and params["wait_ms"]["schema"]["maximum"] == 60000
    assert "ack" in params and "visibility_timeout_ms" in params


# -- LeanRoute: the same parameters as FastAPI's own handling -------------------------------
@pytest.fixture(scope="module")
def lean_vs_fastapi_app() -> FastAPI:
    """One endpoint mounted twice: /fastapi (FastAPI's handler) and /lean (LeanRoute)."""
    app = FastAPI()
    install_handlers(app)
    for prefix, route_class in (("/fastapi", None), ("/lean", LeanRoute)):
        r = APIRouter(prefix=prefix, **({"route_class": route_class} if route_class else {}))

        @r.get("/q/{name}/m/{id}")
        async def endpoint(
            request: Request, name: str, id: str,
            ack: Annotated[bool, Query()] = False,
            wait_ms: Annotated[int, Query(ge=0, le=60_000)] = 0,
            vis: Annotated[int, Query(ge=0)] = 7,
        ) -> JSONResponse:
            return JSONResponse({"name": name, "id": id, "ack": ack, "wait_ms": wait_ms, "vis": vis,
                                 "path": request.url.path.split("/", 2)[2]})

        app.router.routes.extend(r.routes)
    assert isinstance(app.router.routes[-1], LeanRoute)
    return app


@pytest.mark.parametrize("query", [
    "", "ack=true", "ack=TRUE", "ack=1", "ack=0", "ack=off", "ack=yes", "ack=maybe", "ack=",
    "wait_ms=5", "wait_ms=60000", "wait_ms=60001", "wait_ms=-1", "wait_ms=1e3", "wait_ms=", "wait_ms=5.0",
    "wait_ms=1&wait_ms=2", "vis=3&other=x", "ack=true&wait_ms=abc&vis=-2", "wait_ms=%20", "wait_ms=0x10",
])
async def test_lean_route_parameters_match_fastapi(lean_vs_fastapi_app: FastAPI, query: str) -> None:
    transport = httpx.ASGITransport(app=lean_vs_fastapi_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://doq.test") as c:
        answers = []
        for prefix in ("/fastapi", "/lean"):
            r = await c.get(f"{prefix}/q/my%20queue/m/12?{query}")
            doc = r.json()
            doc.pop("instance", None)
            doc.pop("path", None)
            answers.append((r.status_code, doc))
    assert answers[0] == answers[1]
    assert answers[0][0] in (200, 400)


async def test_online_restore_documents_every_refusal(client: httpx.AsyncClient) -> None:
    """A user reading /docs learns each reason POST /db/restore can refuse with, under its status."""
    responses = (await client.get("/openapi.json")).json()["paths"]["/db/restore"]["post"]["responses"]
    for status, reasons in {
        "400": ("BACKUP_CLUSTER_MISMATCH", "BACKUP_INCONSISTENT"),
        "409": ("RESTORE_TARGET_NOT_EMPTY", "RESTORE_CLUSTER_MISMATCH", "RESTORE_INCOMPLETE"),
        "503": ("NOT_LEADER",),
    }.items():
        for reason in reasons:
            assert reason in responses[status]["description"], (status, reason)
