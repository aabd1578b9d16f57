"""The client's key: `key=` argument, else `$DOQ_KEY`; sent on every call and stream as
gRPC metadata `authorization: Bearer KEY` (one channel interceptor: once per call, never
per message)."""

from __future__ import annotations

import ipaddress
import os
from typing import Any, NamedTuple

import grpc

from doq_client.errors import invalid_argument

KEY_ENV = "DOQ_KEY"
_LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")


def _host(addr: str) -> str:
    """The host of a gRPC target ``HOST:PORT``, ``[IPv6]:PORT`` or ``scheme:///HOST:PORT``."""
    if "://" in addr:
        addr = addr.split("://", 1)[1].lstrip("/")
    host = addr.rpartition(":")[0] if ":" in addr and not addr.endswith("]") else addr
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key_transport(addr: str, key: str | None, tls: bool) -> None:
    """Refuse (InvalidArgument ``KEY_IN_CLEAR``, nothing sent) to send a key over a
    plaintext channel to a host that is not loopback: anyone on the path would read it.
    With TLS (``ca_file=``), or to localhost / 127.0.0.0/8 / ::1, or without a key: fine."""
    if key and not tls and not is_loopback(_host(addr)):
        raise invalid_argument(
            f"refusing to send the client key (key= / ${KEY_ENV}) in clear to {addr}: connect with TLS "
            "(ca_file=, the cluster's tls/ca.crt), or use no key", "KEY_IN_CLEAR")


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
