"""gRPC for both clients: the channel settings, and the few calls whose sync and asyncio
forms differ in more than `await` (gRPC has two APIs), each as a `*_aio` / `*_sync` pair
with the same parameters.

`doq_client.aio` (the one hand-written client) calls the `*_aio` forms; the synchronous
`doq_client.client` is generated from it (`clients/python/unasync.py`), which renames each
`*_aio` name to its `*_sync` twin. So everything else a client does (leader following,
retries, requests and results: `doq_client._ops`) is written once.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from doq_client import _ops
from doq_client._auth import aio_interceptors, check_key_transport, sync_channel

AioChannel: TypeAlias = grpc.aio.Channel
SyncChannel: TypeAlias = grpc.Channel

DEFAULT_TARGET = "127.0.0.1:10000"
KEEPALIVE_TIME_MS = 1_000
PING_TIMEOUT_MS = 2_000
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # a restarted node is dialled again within a second (gRPC's default backoff grows to 2 min)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # a node that stops answering (a paused process, a frozen VM) fails the calls open on
    # it within ~3 s, so the client moves to the new leader instead of waiting for its
    # deadline: HTTP/2 pings every second while calls are open, 2 s for their answer
    # (gRPC waits for a ping's answer `ping_timeout_ms`, 1 minute by default, whatever
    # `keepalive_timeout_ms` says)
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", PING_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", PING_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
]
LIST_SERVERS_TIMEOUT_S = 5.0


def checked(targets: list[str], key: str | None, tls: object) -> list[str]:
    """`targets`, once none would get the key in clear (`check_key_transport`)."""
    for addr in targets:
        check_key_transport(addr, key, tls is not None)
    return targets


def tls_credentials(ca_file: str | None) -> grpc.ChannelCredentials | None:
    """TLS credentials verifying servers with the CA in `ca_file` (None: no TLS)."""
    if ca_file is None:
        return None
    with open(ca_file, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


def initial_metadata(e: grpc.RpcError) -> Any:
    """The initial metadata of a failed call (None if the error carries none)."""
    fn = getattr(e, "initial_metadata", None)
    return fn() if callable(fn) else None


# -- the pairs --------------------------------------------------------------------------
def open_channel_aio(addr: str, tls: grpc.ChannelCredentials | None = None,
                     key: str | None = None) -> grpc.aio.Channel:
    """A channel to `addr` sending `key` with every call (TLS with `tls`)."""
    check_key_transport(addr, key, tls is not None)  # a leader learned later too
    if tls is not None:
        return grpc.aio.secure_channel(addr, tls, options=CHANNEL_OPTIONS, interceptors=aio_interceptors(key))
    return grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS, interceptors=aio_interceptors(key))


def open_channel_sync(addr: str, tls: grpc.ChannelCredentials | None = None,
                      key: str | None = None) -> grpc.Channel:
    """See `open_channel_aio`."""
    check_key_transport(addr, key, tls is not None)  # a leader learned later too
    if tls is not None:
        return sync_channel(grpc.secure_channel(addr, tls, options=CHANNEL_OPTIONS), key)
    return sync_channel(grpc.insecure_channel(addr, options=CHANNEL_OPTIONS), key)


def given_channel_aio(channel: grpc.aio.Channel, key: str | None) -> grpc.aio.Channel:
    """A channel the caller gave, as the client uses it: as it is (an aio channel's
    interceptors are fixed when it is made: see `doq_client.key_interceptors`)."""
    return channel


def given_channel_sync(channel: grpc.Channel, key: str | None) -> grpc.Channel:
    """A channel the caller gave, as the client uses it: sending `key` with every call."""
    return sync_channel(channel, key)


async def unary_aio(stub: Any, op: _ops.Op[Any], timeout: float | None) -> tuple[Any, Any]:
    """Send `op` on `stub`: (the response, its initial metadata); raises `grpc.RpcError`."""
    call = getattr(stub, op.method)(op.request, timeout=timeout)
    response = await call
    return response, await call.initial_metadata()


def unary_sync(stub: Any, op: _ops.Op[Any], timeout: float | None) -> tuple[Any, Any]:
    """See `unary_aio`."""
    response, call = getattr(stub, op.method).with_call(op.request, timeout=timeout)
    return response, call.initial_metadata()
