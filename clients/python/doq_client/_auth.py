"""The client's key: `key=` argument, else `$DOQ_KEY`; sent on every call and stream as
gRPC metadata `authorization: Bearer KEY` (one channel interceptor: once per call, never
per message)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import grpc

KEY_ENV = "DOQ_KEY"


def resolve_key(key: str | None) -> str | None:
    """`key`, else `$DOQ_KEY`, else None (no key: fine on a node that requires none)."""
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    return key.strip() if key else None


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _SyncDetails(_Details, grpc.ClientCallDetails):
    pass


def _with_key(details: Any, header: tuple[str, str]) -> Any:
    md = list(details.metadata or ())
    md.append(header)
    return _SyncDetails(details.method, details.timeout, md, details.credentials, details.wait_for_ready,
                        details.compression)


class KeyInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                     grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the key to every call of a sync channel (`grpc.intercept_channel`)."""

    def __init__(self, key: str) -> None:
        self.header = ("authorization", f"Bearer {key}")

    def _d(self, details: Any) -> Any:
        return _with_key(details, self.header)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._d(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._d(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._d(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._d(details), request_iterator)




class _AioKey:
    def __init__(self, key: str) -> None:
        self.header = ("authorization", f"Bearer {key}")

    def _d(self, details: Any) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(details.metadata or ()))
        md.add(*self.header)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, md, details.credentials,
                                          details.wait_for_ready)


class AioUnaryUnary(_AioKey, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._d(details), request)


class AioUnaryStream(_AioKey, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._d(details), request)


class AioStreamUnary(_AioKey, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._d(details), request_iterator)


class AioStreamStream(_AioKey, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._d(details), request_iterator)


def aio_interceptors(key: str | None) -> list[Any]:
    """The interceptors adding `key` to every call of an aio channel ([] without a key)."""
    if not key:
        return []
    return [AioUnaryUnary(key), AioUnaryStream(key), AioStreamUnary(key), AioStreamStream(key)]


def sync_channel(channel: grpc.Channel, key: str | None) -> grpc.Channel:
    """`channel` sending `key` on every call (itself without a key)."""
    return grpc.intercept_channel(channel, KeyInterceptor(key)) if key else channel
