"""What a key costs a data-path call, as structure rather than timing (docs/benchmarks.md,
"Keys on and off"): a key without a queue prefix is checked once when the call or stream
opens and the service's own handler is then run as it is — the same object a call without
any key gets — so a stream's messages pay nothing for it. A prefix key wraps the handler
(its queues are checked per frame): the control that the identity test can fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from doq.auth.admin import create_key
from doq.auth.authorizer import Authorizer
from doq.auth.grpc_door import AuthInterceptor
from doq.service.api import QueueService
from tests.support.inproc import local_service

DATA_PATH = ["EnqueueStream", "EnqueueBatchStream", "DequeueStream", "DequeueBatchStream", "Enqueue", "Dequeue"]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[QueueService]:
    async with local_service(tmp_path) as s:
        yield s


def _handler() -> grpc.RpcMethodHandler:
    async def behavior(request: Any, context: Any) -> Any:
        return request
    return grpc.stream_stream_rpc_method_handler(behavior, request_deserializer=lambda b: b,
                                                 response_serializer=lambda b: b)


async def _intercepted(authz: Authorizer, method: str, key: str | None, handler: grpc.RpcMethodHandler) -> Any:
    md = [("authorization", f"Bearer {key}")] if key else []
    details = SimpleNamespace(method=f"/doq.v1.DOQ/{method}", invocation_metadata=md)

    async def continuation(_details: Any) -> grpc.RpcMethodHandler:
        return handler

    return await AuthInterceptor(authz).intercept_service(continuation, details)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", DATA_PATH)
async def test_a_key_without_prefix_leaves_the_data_path_handler_as_it_is(service: QueueService, method: str) -> None:
    scope = "produce" if method.startswith("Enqueue") else "consume"
    plain = (await create_key(service.node, [scope])).token
    prefixed = (await create_key(service.node, [f"{scope}:tenant-"])).token
    for required in (True, False):
        authz = Authorizer(service.node.state.keys, required=required)
        handler = _handler()
        assert await _intercepted(authz, method, plain, handler) is handler
        wrapped = await _intercepted(authz, method, prefixed, handler)
        assert wrapped is not handler and wrapped is not None
    open_node = Authorizer(service.node.state.keys, required=False)
    handler = _handler()
    assert await _intercepted(open_node, method, None, handler) is handler  # no key on an open node: untouched


async def test_a_keys_calls_in_progress_are_bounded_and_given_back_when_their_task_ends(
        service: QueueService) -> None:
    """`KeyCalls`: the door counts a key's calls in the call's own task (its handler still
    the service's own object, above) and gives the slot back when that task ends, however
    it ends; past the bound a call of that key gets a refusing handler, another key's call
    does not; a keyless call on an open node is not counted."""
    mine = (await create_key(service.node, ["consume"])).token
    theirs = (await create_key(service.node, ["consume"])).token
    authz = Authorizer(service.node.state.keys, required=False)
    door = AuthInterceptor(authz, max_calls_per_key=2)
    handler = _handler()
    release = asyncio.Event()

    async def call(key: str | None) -> Any:
        got = await door.intercept_service(_continuation(handler), _details("Dequeue", key))  # type: ignore[arg-type]
        if got is handler:
            await release.wait()  # the call lasts until released
        return got

    held = [asyncio.create_task(call(mine)) for _ in range(2)]
    await asyncio.sleep(0)
    assert await call(mine) is not handler  # a third call of the key: refused
    others = [asyncio.create_task(call(theirs)), asyncio.create_task(call(None)), asyncio.create_task(call(None))]
    await asyncio.sleep(0)
    assert door.key_calls.in_progress == {mine.split("_")[1]: 2, theirs.split("_")[1]: 1}
    held[0].cancel()  # a call that ends by cancellation gives its slot back
    await asyncio.gather(held[0], return_exceptions=True)
    later = asyncio.create_task(call(mine))
    await asyncio.sleep(0)
    assert not later.done()  # admitted: it waits like any call in progress
    release.set()
    assert await asyncio.gather(held[1], later, *others) == [handler] * 5
    assert door.key_calls.in_progress == {}


def _details(method: str, key: str | None) -> Any:
    md = [("authorization", f"Bearer {key}")] if key else []
    return SimpleNamespace(method=f"/doq.v1.DOQ/{method}", invocation_metadata=md)


def _continuation(handler: grpc.RpcMethodHandler) -> Any:
    async def continuation(_details: Any) -> grpc.RpcMethodHandler:
        return handler
    return continuation
