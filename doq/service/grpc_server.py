"""gRPC adapter: doq.v1.DOQ over the `QueueService` facade (grpc.aio, same event loop).

It only translates: each handler builds the call's `Caller` (`grpc_caller`), maps the
request to the facade's typed arguments (`doq.service.convert`), calls one facade method
or stream and maps its result or error back. Queue semantics (stream sessions, long
polls, leases, limits, metrics) live in the service.

Errors are mapped by `doq.errors.STATUS_TABLE`; the status details carry the stable reason
in trailing metadata (`doq-reason`, `doq-retryable`, `doq-leader`: the leader's node id) and,
when the error names a leader whose gRPC address this node knows, `doq-leader-grpc` (that
address, HOST:PORT, from the node's `cluster_status()`), so a client can reconnect to the
leader without asking. Inside enqueue streams a failure is answered in the responses
instead of ending the stream (a failing request of EnqueueStream in its own response; a
refused frame of EnqueueBatchStream in each of its results, or in `error` for a `columns`
frame; their `Error.leader_hint` is
the node id only, `ListServers` maps ids to addresses); EnqueueBatch is all or nothing and
fails with the status of the message that refused it. A dequeue stream has no per-request
response, so a refused request (e.g. a mismatched `ack_lease_ids`) ends it with that status.

Every task a stream starts ends with its call (also when the call is cancelled).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from doq.auth.grpc_keys import KeyRpcs
from doq.errors import DoqError
from doq.node.base import Node
from doq.queues.model import EnqueueColumnsResult, MessageView
from doq.service import convert as cv
from doq.service import grpc_redrive
from doq.service.api import (
    DEFAULT_PEEK_LIMIT,
    MAX_PEEK_WINDOW,
    FrameOutcome,
    QueueService,
    peek_state,
)
from doq.service.door import Caller, current_principal
from doq.service.grpc_decode import UndecodableRequests
from doq.service.held import require_lease, require_leases
from doq.service.limits import Limits
from doq.service.sessions import Settlement

log = logging.getLogger(__name__)

T = TypeVar("T")
PUSH_BATCH = 64  # messages per dequeue on DequeueStream (max_batch 0)
FRAME_BATCH = 100  # messages per frame on DequeueBatchStream (max_batch 0)
_ANONYMOUS = Caller("grpc")


def grpc_caller(context: grpc.aio.ServicerContext | None = None) -> Caller:
    """The `Caller` of the current gRPC call: every handler builds it here, once (the
    principal is what the authentication interceptor put in `current_principal`)."""
    principal = current_principal.get()
    return _ANONYMOUS if principal is None else Caller("grpc", principal)


def leader_grpc_addr(node: Node, leader_id: str) -> str:
    """The gRPC address of member `leader_id` as `node` knows it ("" if unknown)."""
    if not leader_id:
        return ""
    for m in node.cluster_status().members:
        if m.node_id == leader_id:
            return m.addrs.grpc_addr
    return ""


async def _abort(context: grpc.aio.ServicerContext, err: DoqError, node: Node) -> None:
    """End the call with `err`'s status and doq trailers (see the module docstring)."""
    md = [
        ("doq-reason", err.reason),
        ("doq-retryable", "true" if err.retryable else "false"),
        ("doq-leader", err.leader_hint),
    ]
    if addr := leader_grpc_addr(node, err.leader_hint):
        md.append(("doq-leader-grpc", addr))
    context.set_trailing_metadata(tuple(md))
    await context.abort(cv.grpc_code(err), err.message)


def _unary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Map DoqError raised by a unary handler to its gRPC status."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await fn(self, request, context)
        except DoqError as e:
            await _abort(context, e, self.api.node)
            raise AssertionError("unreachable") from e

    return wrapper


def _frame_to_pb(out: FrameOutcome) -> pb.EnqueueBatchResponse:
    """The response to one frame of EnqueueBatchStream."""
    res = out.result
    if out.columns:
        return cv.enqueue_columns_to_pb(res if isinstance(res, (DoqError, EnqueueColumnsResult))
                                        else EnqueueColumnsResult([]))[0]
    if isinstance(res, DoqError):  # the whole frame failed: one error per item
        return pb.EnqueueBatchResponse(results=[cv.enqueue_result_to_pb(res)] * out.size)
    if isinstance(res, EnqueueColumnsResult):
        raise TypeError("a messages frame answered with columns")
    return cv.enqueue_batch_to_pb(res)[0]


async def _settlements(requests: AsyncIterator[pb.DequeueStreamRequest]) -> AsyncIterator[Settlement]:
    """The later requests of a dequeue stream, mapped as they are read."""
    async for r in requests:
        yield cv.settlement_from_pb(r)


class DOQServicer(KeyRpcs, pb_grpc.DOQServicer):
    def __init__(self, api: QueueService) -> None:
        self.node = api.node
        self.api = api

    # -- queues ---------------------------------------------------------------------------
    @_unary
    async def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> pb.CreateQueueResponse:
        q = await self.api.create_queue(request.name, request.type, cv.settings_from_pb(request.settings),
                                        caller=grpc_caller(context))
        return pb.CreateQueueResponse(success=True, queue=cv.queue_to_pb(q))

    @_unary
    async def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> pb.UpdateQueueResponse:
        q = await self.api.update_queue(request.name, cv.settings_from_pb(request.settings),
                                        caller=grpc_caller(context))
        return pb.UpdateQueueResponse(success=True, queue=cv.queue_to_pb(q))

    @_unary
    async def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> pb.DeleteQueueResponse:
        await self.api.delete_queue(request.name, caller=grpc_caller(context))
        return pb.DeleteQueueResponse(success=True)

    @_unary
    async def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> pb.GetQueueResponse:
        q = await self.api.get_queue(request.name, caller=grpc_caller(context))
        return pb.GetQueueResponse(queue=cv.queue_to_pb(q))

    @_unary
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesResponse:
        queues, token = await self.api.list_queues_page(request.page_token, request.max_results,
                                                        caller=grpc_caller(context))
        return pb.ListQueuesResponse(queues=[cv.queue_to_pb(q) for q in queues], next_page_token=token)

    @_unary
    async def PurgeQueue(self, request: pb.PurgeQueueRequest, context: Any) -> pb.PurgeQueueResponse:
        return pb.PurgeQueueResponse(purged=await self.api.purge_queue(request.name, caller=grpc_caller(context)))

    @_unary
    async def SetGroupPolicy(self, request: pb.SetGroupPolicyRequest, context: Any) -> pb.SetGroupPolicyResponse:
        g = await self.api.set_group_policy(
            request.queue_name, request.group,
            request.weight if request.HasField("weight") else None,
            request.max_per_second if request.HasField("max_per_second") else None,
            reset=request.reset, caller=grpc_caller(context))
        return pb.SetGroupPolicyResponse(success=True, group=cv.group_to_pb(g))

    @_unary
    async def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsResponse:
        groups = await self.api.group_stats(request.queue_name, caller=grpc_caller(context))
        return pb.ListGroupsResponse(groups=[cv.group_to_pb(g) for g in groups])

    # -- redrive (doq.service.grpc_redrive) -------------------------------------------------
    @_unary
    async def StartRedrive(self, request: pb.StartRedriveRequest, context: Any) -> pb.RedriveTask:
        return await grpc_redrive.start(self.api, request, grpc_caller(context))

    @_unary
    async def CancelRedrive(self, request: pb.CancelRedriveRequest, context: Any) -> pb.RedriveTask:
        return await grpc_redrive.cancel(self.api, request, grpc_caller(context))

    @_unary
    async def GetRedrive(self, request: pb.GetRedriveRequest, context: Any) -> pb.RedriveTask:
        return await grpc_redrive.get(self.api, request, grpc_caller(context))

    # -- enqueue --------------------------------------------------------------------------
    @_unary
    async def Enqueue(self, request: pb.EnqueueRequest, context: Any) -> pb.EnqueueResponse:
        queue, item = cv.request_from_pb(request)
        return cv.enqueue_result_to_pb(await self.api.enqueue(queue, item, caller=grpc_caller(context)))

    @_unary
    async def EnqueueBatch(self, request: pb.EnqueueBatchRequest, context: Any) -> pb.EnqueueBatchResponse:
        frame = cv.frame_from_pb(request)
        caller = grpc_caller(context)
        if isinstance(frame, list):
            return cv.enqueue_batch_to_pb(await self.api.enqueue_many(frame, caller=caller))[0]
        return cv.enqueue_columns_to_pb(await self.api.enqueue_columns(frame, caller=caller))[0]

    async def EnqueueStream(
        self, request_iterator: AsyncIterator[pb.EnqueueRequest], context: Any
    ) -> AsyncIterator[pb.EnqueueResponse]:
        """Pipelined: requests are proposed as they arrive; responses follow in order."""
        to_pb = cv.enqueue_result_to_pb
        results = self.api.enqueue_stream(request_iterator, cv.request_from_pb, caller=grpc_caller(context))
        async with contextlib.aclosing(results):
            async for res in results:
                yield to_pb(res)

    async def EnqueueBatchStream(
        self, request_iterator: AsyncIterator[pb.EnqueueBatchRequest], context: Any
    ) -> AsyncIterator[pb.EnqueueBatchResponse]:
        """Pipelined batches: one response per request frame, in order (each frame all or
        nothing)."""
        outcomes = self.api.enqueue_frames(request_iterator, cv.frame_from_pb, caller=grpc_caller(context))
        async with contextlib.aclosing(outcomes):
            async for out in outcomes:
                yield _frame_to_pb(out)

    # -- dequeue --------------------------------------------------------------------------
    @_unary
    async def Dequeue(self, request: pb.DequeueRequest, context: Any) -> pb.DequeueResponse:
        msgs = await self.api.dequeue(
            request.queue_name,
            max_messages=request.max_messages or 1,
            ack=request.ack,
            wait_ms=request.wait_ms,
            visibility_timeout_ms=request.visibility_timeout_ms,
            caller=grpc_caller(context),
        )
        response = pb.DequeueResponse()
        cv.add_messages(response.messages, msgs)
        return response

    async def _dequeue_frames(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any, batch_default: int
    ) -> AsyncGenerator[tuple[bool, list[MessageView]], None]:
        """Shared by DequeueStream and DequeueBatchStream: the facade's dequeue stream over
        the first request and the later ones; each frame with the `columns` flag."""
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        opened = cv.stream_open_from_pb(first)
        frames = self.api.dequeue_stream(opened, _settlements(request_iterator), batch_default=batch_default,
                                         caller=grpc_caller(context))
        try:
            async with contextlib.aclosing(frames):
                async for msgs in frames:
                    yield opened.columns, msgs
        except DoqError as e:
            await _abort(context, e, self.api.node)

    async def DequeueStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.Message]:
        to_pb = cv.message_to_pb
        async with contextlib.aclosing(self._dequeue_frames(request_iterator, context, PUSH_BATCH)) as frames:
            async for _, msgs in frames:
                for m in msgs:
                    yield to_pb(m)

    async def DequeueBatchStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.MessageBatch]:
        async with contextlib.aclosing(self._dequeue_frames(request_iterator, context, FRAME_BATCH)) as frames:
            async for columns, msgs in frames:
                frame = pb.MessageBatch()
                if columns:
                    cv.add_columns(frame.columns, msgs)
                else:
                    cv.add_messages(frame.messages, msgs)
                yield frame

    # -- single messages ------------------------------------------------------------------
    @_unary
    async def Get(self, request: pb.GetRequest, context: Any) -> pb.Message:
        return cv.message_to_pb(await self.api.get_message(request.queue_name, request.id,
                                                           caller=grpc_caller(context)))

    @_unary
    async def Peek(self, request: pb.PeekRequest, context: Any) -> pb.PeekResponse:
        state = peek_state(request.state)
        limit = request.limit or DEFAULT_PEEK_LIMIT
        got = await self.api.peek(request.queue_name, state, request.offset, limit, caller=grpc_caller(context))
        more = len(got) == limit and request.offset + limit < MAX_PEEK_WINDOW
        return pb.PeekResponse(messages=[cv.message_to_pb(m) for m in got],
                               next_offset=request.offset + limit if more else 0)

    @_unary
    async def Delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteResponse:
        await self.api.delete_message(request.queue_name, request.id, request.lease_id, caller=grpc_caller(context))
        return pb.DeleteResponse(success=True)

    @_unary
    async def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        require_lease(request.lease_id)
        await self.api.ack(request.queue_name, request.id, request.lease_id, caller=grpc_caller(context))
        return pb.AckResponse(success=True)

    @_unary
    async def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> pb.AckBatchResponse:
        require_leases(request.ids, request.lease_ids)
        results = await self.api.ack_many(request.queue_name, list(request.ids), list(request.lease_ids),
                                          caller=grpc_caller(context))
        return pb.AckBatchResponse(
            results=[
                pb.AckResult(id=i, success=True) if r is None else pb.AckResult(id=i, success=False, error=cv.error_to_pb(r))
                for i, r in zip(request.ids, results, strict=True)
            ]
        )

    @_unary
    async def Nack(self, request: pb.NackRequest, context: Any) -> pb.NackResponse:
        require_lease(request.lease_id)
        await self.api.nack(
            request.queue_name,
            request.id,
            lease_id=request.lease_id,
            delay_ms=request.delay_ms,
            priority=request.priority if request.HasField("priority") else None,
            release=request.release,
            caller=grpc_caller(context),
        )
        return pb.NackResponse(success=True)

    @_unary
    async def Touch(self, request: pb.TouchRequest, context: Any) -> pb.TouchResponse:
        require_lease(request.lease_id)
        until = await self.api.touch(
            request.queue_name, request.id, lease_id=request.lease_id,
            visibility_timeout_ms=request.visibility_timeout_ms, caller=grpc_caller(context),
        )
        return pb.TouchResponse(success=True, lease_expires_at_ms=until)

    @_unary
    async def UpdatePriority(self, request: pb.UpdatePriorityRequest, context: Any) -> pb.UpdatePriorityResponse:
        m = await self.api.update_priority(request.queue_name, request.id, request.priority,
                                           caller=grpc_caller(context))
        return pb.UpdatePriorityResponse(success=True, message=cv.message_to_pb(m))

    @_unary
    async def ListServers(self, request: pb.ListServersRequest, context: Any) -> pb.ListServersResponse:
        status = self.api.node.cluster_status()
        return pb.ListServersResponse(
            servers=[
                pb.Server(id=m.node_id, raft_addr=m.addrs.raft_addr, grpc_addr=m.addrs.grpc_addr,
                          http_addr=m.addrs.http_addr, leader=m.node_id == status.leader_id, voter=m.role == "voter")
                for m in status.members
            ],
            leader_id=status.leader_id,
        )


def grpc_frame_limit(limits: Limits) -> int:
    """The largest gRPC message (bytes) a node sends (an answer may carry a batch of the
    largest messages), and a proxy to its leader carries either way."""
    return max(limits.max_message_bytes * 2 + 64 * 1024, 64 * 1024 * 1024, limits.body_limits()[1])


CLIENT_PING_INTERVAL_MIN_MS = 500
"""The shortest interval between a client's HTTP/2 pings the server accepts (gRPC's default,
5 minutes, would answer doq_client's 1 s keepalive with GOAWAY too_many_pings)."""


def grpc_receive_limit(limits: Limits) -> int:
    """The largest gRPC request a node takes: the HTTP gateway's batch body limit (beyond it
    the call fails RESOURCE_EXHAUSTED before it is read whole)."""
    return limits.body_limits()[1]


def build_server(
    api: QueueService, addr: str, *, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create (not start) the gRPC server with reflection and health; returns it and the
    bound port. Its message limits follow `api.limits`; undecodable requests are answered
    INVALID_ARGUMENT (`doq.service.grpc_decode`). With `credentials`, the port serves TLS only."""
    server = grpc.aio.server(
        interceptors=[UndecodableRequests(), *interceptors],
        # every call holds memory until it ends (a long poll waits up to max_wait_ms, a stream
        # lives as long as its client): --max-calls bounds them node-wide, whoever makes them
        maximum_concurrent_rpcs=api.limits.max_calls,
        options=[
            ("grpc.max_receive_message_length", grpc_receive_limit(api.limits)),
            ("grpc.max_send_message_length", grpc_frame_limit(api.limits)),
            ("grpc.so_reuseport", 0),
            # clients ping every second while they have calls open (doq_client's keepalive:
            # how they notice a node that stops answering); more often is a strike
            ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_PING_INTERVAL_MIN_MS),
            # connections are taken before any key is checked: bound them as the HTTP port's
            # (--max-connections; past it the node closes new ones), give a connection
            # --read-timeout-ms to finish its TLS and HTTP/2 handshake (gRPC's default: 120 s),
            # and close one without a call for --keep-alive-ms (at least --read-timeout-ms;
            # gRPC's default: never), so idle connections cannot hold every slot
            ("grpc.max_allowed_incoming_connections", api.limits.max_connections),
            ("grpc.server_handshake_timeout_ms", api.limits.read_timeout_ms),
            ("grpc.max_connection_idle_ms", max(api.limits.keep_alive_ms, api.limits.read_timeout_ms)),
        ]
    )
    pb_grpc.add_DOQServicer_to_server(DOQServicer(api), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        pb.DESCRIPTOR.services_by_name["DOQ"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    port = server.add_secure_port(addr, credentials) if credentials else server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot bind gRPC address {addr}")
    server.health_servicer = health_servicer  # type: ignore[attr-defined]
    return server, port


async def set_serving(server: grpc.aio.Server, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    hs = server.health_servicer  # type: ignore[attr-defined]
    await hs.set("", status)
    await hs.set("doq.v1.DOQ", status)
