"""gRPC follower forwarding: a follower relays doq.v1.DOQ calls to the leader.

`LeaderForwarder` is a grpc.aio server interceptor. On a node that is not the leader, a
call of `doq.v1.DOQ` (unary or stream) is answered by a proxy handler that relays it to
the leader's gRPC address (from the node's `cluster_status()`), so a client pointed at any
node just works. The proxy works on raw bytes (nothing is parsed or re-encoded) and relays:

- request metadata (plus `doq-forwarded-by: <this node id>`), the deadline, and the
  client's cancellation (a cancelled call cancels the leader's call, so a cancelled long
  poll takes nothing);
- every request and response message, in both directions, as they come (a bidirectional
  stream is two pumps: gRPC's request writer and the response loop);
- the leader's initial metadata plus `doq-leader-grpc: <leader HOST:PORT>` (on every
  forwarded answer, also an error), its status code, details and trailing metadata
  as they are (`doq-reason`, `doq-retryable`, `doq-leader`, `doq-leader-grpc`).

Served locally instead: on the leader; `grpc.health.v1`, reflection and any other
service; the reads `GetQueue`, `ListQueues`, `Get`, `Peek`, `GetRedrive`, `ListGroups` (linearizable on a follower through
ReadIndex) and `ListServers` (this node's view of the cluster); when no leader is known
(the node then answers NOT_LEADER or UNAVAILABLE itself). A forwarded call that reaches a
node that is not the leader is answered NOT_LEADER (with the leader hint), never forwarded
again, so two nodes with stale views never bounce a call. The leader unreachable (the
connection fails, no `doq-reason`): UNAVAILABLE, reason LEADER_UNREACHABLE: retryable when
the channel never connected (gRPC's "failed to connect to all addresses": nothing was
sent), not retryable otherwise (the call may have reached the leader: outcome unknown).

One channel per leader address, kept until `close()`. Metrics: each relayed call counts
once in `doq_grpc_forwarded_calls_total{method}` and is in
`doq_grpc_forwarded_calls_in_progress` until it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from doq.errors import DoqError, NotLeader, OutcomeUnknown, Unavailable
from doq.node.base import Node
from doq.node.cluster import ClusterStatus
from doq.service import metrics
from doq.service.grpc_server import _abort as abort_with_error  # the one error -> status mapping
from doq.service.grpc_server import leader_grpc_addr

SERVICE_PREFIX = "/doq.v1.DOQ/"
LOCAL_METHODS = frozenset(SERVICE_PREFIX + m for m in (
    "GetQueue", "ListQueues", "Get", "Peek", "GetRedrive", "ListGroups", "ListServers"))
"""Methods a follower serves itself (reads and its own view of the cluster)."""
FORWARDED_BY = "doq-forwarded-by"
_CONNECT_FAILED = "failed to connect to all addresses"  # grpc-core: the call was never sent
"""Request metadata on a forwarded call: the id of the node that forwarded it."""
LEADER_GRPC = "doq-leader-grpc"
"""Initial metadata on a forwarded call's answer: the leader's gRPC HOST:PORT."""
_NOT_RELAYED = frozenset({"user-agent", "content-type", "te", "host", FORWARDED_BY})

Metadata = tuple[tuple[str, str | bytes], ...]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def _relayed(metadata: Sequence[Any]) -> list[tuple[str, str | bytes]]:
    """The client's metadata minus pseudo headers, grpc-* and transport headers."""
    return [(k, v) for k, v in metadata
            if k not in _NOT_RELAYED and not k.startswith((":", "grpc-"))]


class LeaderForwarder(grpc.aio.ServerInterceptor):
    """See the module docstring. `max_message_bytes` bounds the proxied messages as the
    server bounds its own."""

    def __init__(self, node: Node, *, max_message_bytes: int = 64 * 1024 * 1024,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.node = node
        self._credentials = credentials  # a secure node: TLS to the leader, verified by the cluster CA
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # a leader that stops answering fails the relayed calls within ~3 s (as the
            # clients' own keepalive does), so the callers can move on to the new leader
            ("grpc.keepalive_time_ms", 1_000),
            ("grpc.keepalive_timeout_ms", 2_000),
            ("grpc.http2.ping_timeout_ms", 2_000),  # gRPC's default: 1 minute
            ("grpc.http2.max_pings_without_data", 0),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._proxies: dict[tuple[str, str], grpc.RpcMethodHandler] = {}
        self._retired: list[grpc.aio.Channel] = []

    def set_credentials(self, credentials: grpc.ChannelCredentials) -> None:
        """Verify the leader with new credentials (a new trust bundle) from the next call
        on: new channels; calls under way finish on the old ones (closed at `close`)."""
        self._credentials = credentials
        self._retired.extend(self._channels.values())
        self._channels, self._proxies = {}, {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if self.node.is_leader or not method.startswith(SERVICE_PREFIX) or method in LOCAL_METHODS:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        status = self.node.cluster_status()
        target = leader_grpc_addr(self.node, status.leader_id)
        if not target or status.leader_id == status.node_id:
            return handler  # no leader known: the node answers NOT_LEADER / UNAVAILABLE itself
        metadata: Sequence[Any] = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        if any(k == FORWARDED_BY for k, _ in metadata):
            return _refusing(handler, self.node, NotLeader(
                f"forwarded call reached {status.node_id}, which is not the leader",
                leader_hint=status.leader_id))
        proxy = self._proxies.get((target, method))
        if proxy is None:
            proxy = _Proxy(self, method, target, status).handler(handler)
            self._proxies[(target, method)] = proxy
        return proxy

    def channel(self, target: str) -> grpc.aio.Channel:
        """The cached channel to `target` (created on first use)."""
        ch = self._channels.get(target)
        if ch is None:
            ch = self._channels[target] = (
                grpc.aio.secure_channel(target, self._credentials, options=self._options) if self._credentials
                else grpc.aio.insecure_channel(target, options=self._options))
        return ch

    async def close(self) -> None:
        """Close every channel (in-flight forwarded calls are cancelled)."""
        channels, self._channels, self._proxies = [*self._channels.values(), *self._retired], {}, {}
        self._retired = []
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)


class _Proxy:
    """Relays calls of one method to the leader at `target`, as raw bytes."""

    __slots__ = ("node", "channel", "method", "target", "node_id", "leader_id", "counted")

    def __init__(self, fw: LeaderForwarder, method: str, target: str, status: ClusterStatus) -> None:
        self.node, self.channel = fw.node, fw.channel(target)
        self.method, self.target = method, target
        self.node_id, self.leader_id = status.node_id, status.leader_id
        self.counted = metrics.GRPC_FORWARDED.labels(method.removeprefix(SERVICE_PREFIX))

    def handler(self, local: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A handler of the same kind as `local`, with no (de)serialization."""
        ch = self.channel
        if local.request_streaming and local.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self._streamed(ch.stream_stream(self.method)))
        if local.request_streaming:
            return grpc.stream_unary_rpc_method_handler(self._unary(ch.stream_unary(self.method)))
        if local.response_streaming:
            return grpc.unary_stream_rpc_method_handler(self._streamed(ch.unary_stream(self.method)))
        return grpc.unary_unary_rpc_method_handler(self._unary(ch.unary_unary(self.method)))

    def _start(self, multicallable: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Open the call on the leader (counted; the caller ends it with `_end`)."""
        metadata = _relayed(context.invocation_metadata() or ())
        metadata.append((FORWARDED_BY, self.node_id))
        call = multicallable(request, metadata=metadata, timeout=context.time_remaining())
        self.counted.inc()
        metrics.GRPC_FORWARDING.inc()
        return call

    @staticmethod
    def _end(call: Any) -> None:
        call.cancel()  # a no-op once done; ends the leader's call if we were cancelled
        metrics.GRPC_FORWARDING.dec()

    async def _send_initial(self, context: grpc.aio.ServicerContext, upstream: Sequence[Any]) -> None:
        await context.send_initial_metadata((*_relayed_initial(upstream), (LEADER_GRPC, self.target)))

    def _unary(self, multicallable: Any) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def relay(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            call = self._start(multicallable, request, context)
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as e:
                await self._relay_error(context, e)
                raise AssertionError("unreachable") from e
            finally:
                self._end(call)
            await self._send_initial(context, await call.initial_metadata())
            context.set_trailing_metadata(_relayed_answer(await call.trailing_metadata()))
            return response

        return relay

    def _streamed(self, multicallable: Any) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        async def relay(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            call = self._start(multicallable, request, context)
            try:
                await self._send_initial(context, await call.initial_metadata())
                async for response in call:  # raises AioRpcError if the leader fails the call
                    yield response
                context.set_trailing_metadata(_relayed_answer(await call.trailing_metadata()))
            except grpc.aio.AioRpcError as e:
                await self._relay_error(context, e)
            finally:
                self._end(call)

        return relay

    async def _relay_error(self, context: grpc.aio.ServicerContext, e: grpc.aio.AioRpcError) -> None:
        """End the call as the leader ended it; a transport failure (no `doq-reason`) is
        UNAVAILABLE / LEADER_UNREACHABLE."""
        trailing = e.trailing_metadata() or ()
        if e.code() == grpc.StatusCode.UNAVAILABLE and not any(k == "doq-reason" for k, _ in trailing):
            err: DoqError
            if _CONNECT_FAILED in (e.details() or ""):  # never connected: nothing was sent
                err = Unavailable(f"this node is not the leader and the leader at {self.target} did not "
                                  f"answer: {e.details()}", reason="LEADER_UNREACHABLE", leader_hint=self.leader_id)
            else:  # the request may have reached the leader: outcome unknown
                err = OutcomeUnknown(f"this node is not the leader and the leader at {self.target} did not "
                                     f"answer (the call may have been applied): {e.details()}",
                                     reason="LEADER_UNREACHABLE", leader_hint=self.leader_id)
            await _send_initial_quietly(context, ((LEADER_GRPC, self.target),))
            await abort_with_error(context, err, self.node)
        await _send_initial_quietly(context, (*_relayed_initial(e.initial_metadata() or ()),
                                              (LEADER_GRPC, self.target)))
        await context.abort(e.code(), e.details() or "", _relayed_answer(trailing))


def _relayed_answer(metadata: Sequence[Any]) -> Metadata:
    """The leader's answer metadata minus pseudo headers and grpc-*."""
    return tuple((k, v) for k, v in metadata if not k.startswith((":", "grpc-")))


def _relayed_initial(metadata: Sequence[Any]) -> Metadata:
    """The leader's initial metadata, without a `doq-leader-grpc` (this node adds its own)."""
    return tuple((k, v) for k, v in _relayed_answer(metadata) if k != LEADER_GRPC)


async def _send_initial_quietly(context: grpc.aio.ServicerContext, metadata: Metadata) -> None:
    """Send initial metadata unless it was sent already (a stream that failed midway)."""
    try:
        await context.send_initial_metadata(metadata)
    except grpc.aio.UsageError:
        pass


def _refusing(local: grpc.RpcMethodHandler, node: Node, err: DoqError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `local` that ends the call with `err`, reading nothing."""
    if local.response_streaming:
        async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            await abort_with_error(context, err, node)
            yield b""  # unreachable: makes this an async generator

        factory = (grpc.stream_stream_rpc_method_handler if local.request_streaming
                   else grpc.unary_stream_rpc_method_handler)
        return factory(refuse_stream)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> bytes:
        await abort_with_error(context, err, node)
        raise AssertionError("unreachable")

    factory = grpc.stream_unary_rpc_method_handler if local.request_streaming else grpc.unary_unary_rpc_method_handler
    return factory(refuse)
