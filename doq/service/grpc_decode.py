"""Undecodable gRPC requests are answered INVALID_ARGUMENT (gRPC's own answer is UNKNOWN
"Unexpected DecodeError", as if the server had failed).

`UndecodableRequests` is a server interceptor: it wraps each method's request deserializer
so that bytes that are not a valid message become an `_Undecodable` marker instead of an
exception, and the method's behavior so that the marker aborts the call with
INVALID_ARGUMENT (reason INVALID_REQUEST) before the servicer sees it: at once for a unary
request, at the bad frame for a request stream (the frames before it were handled).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class _Undecodable:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


async def _abort(context: grpc.aio.ServicerContext, bad: _Undecodable) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {bad.error}",
                        trailing_metadata=(("doq-reason", "INVALID_REQUEST"), ("doq-retryable", "false")))


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError) as e:
            return _Undecodable(str(e) or type(e).__name__)
    return deserialize


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for r in requests:
        if isinstance(r, _Undecodable):
            await _abort(context, r)
        yield r


def _unary_in(behavior: Callable[..., Any], streams_out: bool) -> Callable[..., Any]:
    if streams_out and inspect.isasyncgenfunction(behavior):
        async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _abort(context, request)
            async for r in behavior(request, context):
                yield r
        return gen

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await _abort(context, request)
        return await behavior(request, context)
    return call


def _stream_in(behavior: Callable[..., Any], streams_out: bool) -> Callable[..., Any]:
    if streams_out and inspect.isasyncgenfunction(behavior):
        async def gen(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for r in behavior(_checked(requests, context), context):
                yield r
        return gen

    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(_checked(requests, context), context)
    return call


class UndecodableRequests(grpc.aio.ServerInterceptor):
    """See the module docstring. The wrapped handler of each handler is made once."""

    def __init__(self) -> None:
        self._wrapped: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        known = self._wrapped.get(id(handler))
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = _wrap(handler)
        if len(self._wrapped) < 1024:  # the servicer's handlers (a forwarder's proxies: a few per leader)
            self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    deserialize = _safe(handler.request_deserializer)
    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_unary_in(handler.unary_unary, False), deserialize, serialize)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_unary_in(handler.unary_stream, True), deserialize, serialize)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_stream_in(handler.stream_unary, False), deserialize, serialize)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(_stream_in(handler.stream_stream, True), deserialize, serialize)
    return handler
