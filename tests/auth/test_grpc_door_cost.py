"""What a key costs a data-path call, as structure rather than timing (docs/benchmarks.md,
"Keys on and off"): a key without a queue prefix is checked once when the call or stream
opens and the service's own handler is then run as it is — the same object a call without
any key gets — so a stream's messages pay nothing for it. A prefix key wraps the handler
(its queues are checked per frame): the control that the identity test can fail."""

from __future__ import annotations

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
