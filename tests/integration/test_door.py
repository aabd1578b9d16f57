"""The one door: every call through gRPC and HTTP reaches the facade's `Door.admit` with
its caller (transport, principal), its action and its queue, before anything changes;
a check that refuses stops the call. And the adapters pass their caller to every facade
call (a fitness check over their source).

Real service over a temporary LMDB, a real grpc.aio server on 127.0.0.1 with an
interceptor standing in for authentication (it sets `current_principal` from metadata),
the HTTP gateway in process (httpx ASGI transport)."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.errors import FailedPrecondition, QueueNotFound
from doq.service.api import QueueService
from doq.service.door import Action, Caller, current_principal
from doq.service.grpc_server import build_server
from tests.support import inproc

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = [ROOT / "doq" / "service" / "grpc_server.py", ROOT / "doq" / "service" / "http" / "routes.py"]
Seen = list[tuple[str, object, Action, str | None]]


class PrincipalFromMetadata(grpc.aio.ServerInterceptor):
    """Stands in for the authentication interceptor: the principal is the `x-principal` header."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        current_principal.set(dict(details.invocation_metadata or ()).get("x-principal"))
        return await continuation(details)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[QueueService]:
    async with inproc.local_service(tmp_path) as api:
        await api.create_queue("q")
        yield api


def _record(api: QueueService) -> Seen:
    seen: Seen = []

    def check(caller: Caller, action: Action, queue: str | None) -> None:
        seen.append((caller.transport, caller.principal, action, queue))
        if queue == "forbidden":
            raise FailedPrecondition("refused by the door", reason="REFUSED_BY_TEST")

    api.door.add_check(check)
    return seen


async def test_grpc_calls_and_streams_pass_the_door_with_their_queue_and_principal(service: QueueService) -> None:
    seen = _record(service)
    server, port = build_server(service, "127.0.0.1:0", max_message_bytes=service.limits.max_message_bytes,
                                interceptors=[PrincipalFromMetadata()])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DOQStub(channel)
            md = (("x-principal", "alice"),)
            await stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"m"), metadata=md)
            call = stub.DequeueStream(metadata=md)
            await call.write(pb.DequeueStreamRequest(queue_name="q", prefetch=1))
            msg = await asyncio.wait_for(call.read(), 20)
            await call.write(pb.DequeueStreamRequest(ack_ids=[msg.id]))
            await call.done_writing()
            assert await asyncio.wait_for(call.read(), 20) == grpc.aio.EOF
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Enqueue(pb.EnqueueRequest(queue_name="forbidden", content=b"m"), metadata=md)
            assert dict(ei.value.trailing_metadata() or ())["doq-reason"] == "REFUSED_BY_TEST"
            await stub.ListQueues(pb.ListQueuesRequest())
    finally:
        await server.stop(None)
    assert seen == [
        ("grpc", "alice", Action.ENQUEUE, "q"),
        ("grpc", "alice", Action.DEQUEUE, "q"),  # once for the stream, by its first request
        ("grpc", "alice", Action.ENQUEUE, "forbidden"),
        ("grpc", None, Action.LIST_QUEUES, None),
    ]
    assert (await service.get_queue("q")).stats.total == 0
    with pytest.raises(QueueNotFound):  # the refused call proposed nothing
        service.node.state.get_queue("forbidden")


async def test_http_calls_pass_the_door_and_a_refusal_changes_nothing(service: QueueService) -> None:
    seen = _record(service)
    async with inproc.http_client(service) as client:
        assert (await client.post("/API/v1/queues/q/messages", json={"content": "m"})).status_code == 201
        got = await client.get("/API/v1/queues/q/messages")
        assert (await client.post(f"/API/v1/queues/q/messages/{got.json()['id']}/ack")).status_code == 200
        refused = await client.post("/API/v1/queues", json={"name": "forbidden"})
        assert refused.json()["reason"] == "REFUSED_BY_TEST"
    assert seen == [
        ("http", None, Action.ENQUEUE, "q"),
        ("http", None, Action.DEQUEUE, "q"),
        ("http", None, Action.ACK, "q"),
        ("http", None, Action.CREATE_QUEUE, "forbidden"),
    ]
    assert [q.name for q in await service.list_queues()] == ["q"]


def _facade_calls_without_caller(source: str) -> list[str]:
    """Calls `self.api.<public facade method>(...)` that pass no `caller=`."""
    public = {n for n in vars(QueueService) if not n.startswith("_")}
    bad = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in public
                and ast.unparse(node.func.value) == "self.api"
                and not any(k.arg == "caller" for k in node.keywords)):
            bad.append(ast.unparse(node)[:80])
    return bad


@pytest.mark.parametrize("path", ADAPTERS, ids=lambda p: p.name)
def test_the_adapters_pass_their_caller_to_every_facade_call(path: Path) -> None:
    assert _facade_calls_without_caller(path.read_text()) == []


def test_the_fitness_check_finds_a_call_without_its_caller() -> None:
    src = "async def f(self):\n    await self.api.enqueue('q', item)\n    await self.api.ack('q', 1, caller=c)\n"
    assert _facade_calls_without_caller(src) == ["self.api.enqueue('q', item)"]
