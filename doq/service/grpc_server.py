"""gRPC adapter: doq.v1.DOQ over the `QueueService` facade (grpc.aio, same event loop).

Errors are mapped by `doq.errors.STATUS_TABLE`; the status details carry the stable reason
in trailing metadata (`doq-reason`, `doq-retryable`, `doq-leader`). Inside streams and
batches a failing item gets an `Error` in its own response instead of ending the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from doq.errors import DoqError
from doq.queues.commands import Ack, Enqueue, Nack
from doq.queues.model import EnqueueResult, MessageView
from doq.service import convert as cv
from doq.service import limits as v
from doq.service import metrics
from doq.service.api import QueueService

log = logging.getLogger(__name__)
M = metrics.GRPC

T = TypeVar("T")
STREAM_WINDOW = 8192  # responses in flight per EnqueueStream before we stop reading
PUSH_BATCH = 64  # messages dequeued at a time in push mode (no credits)
LONG_POLL_MS = 10_000


async def _abort(context: grpc.aio.ServicerContext, err: DoqError) -> None:
    context.set_trailing_metadata(
        (
            ("doq-reason", err.reason),
            ("doq-retryable", "true" if err.retryable else "false"),
            ("doq-leader", err.leader_hint),
        )
    )
    await context.abort(cv.grpc_code(err), err.message)


def _unary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Map DoqError raised by a unary handler to its gRPC status."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await fn(self, request, context)
        except DoqError as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    return wrapper


class DOQServicer(pb_grpc.DOQServicer):
    def __init__(self, api: QueueService) -> None:
        self.api = api

    # -- queues ---------------------------------------------------------------------------
    @_unary
    async def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> pb.CreateQueueResponse:
        q = await self.api.create_queue(request.name, request.type, cv.settings_from_pb(request.settings))
        return pb.CreateQueueResponse(success=True, queue=cv.queue_to_pb(q))

    @_unary
    async def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> pb.UpdateQueueResponse:
        q = await self.api.update_queue(request.name, cv.settings_from_pb(request.settings))
        return pb.UpdateQueueResponse(success=True, queue=cv.queue_to_pb(q))

    @_unary
    async def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> pb.DeleteQueueResponse:
        await self.api.delete_queue(request.name)
        return pb.DeleteQueueResponse(success=True)

    @_unary
    async def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> pb.GetQueueResponse:
        return pb.GetQueueResponse(queue=cv.queue_to_pb(await self.api.get_queue(request.name)))

    @_unary
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesResponse:
        return pb.ListQueuesResponse(queues=[cv.queue_to_pb(q) for q in await self.api.list_queues()])

    @_unary
    async def PurgeQueue(self, request: pb.PurgeQueueRequest, context: Any) -> pb.PurgeQueueResponse:
        return pb.PurgeQueueResponse(purged=await self.api.purge_queue(request.name))

    # -- enqueue --------------------------------------------------------------------------
    @_unary
    async def Enqueue(self, request: pb.EnqueueRequest, context: Any) -> pb.EnqueueResponse:
        res = await self.api.enqueue(request.queue_name, cv.item_from_pb(request))
        if not res.duplicate:
            M.enqueued.inc()
        return cv.enqueue_result_to_pb(res)

    @_unary
    async def EnqueueBatch(self, request: pb.EnqueueBatchRequest, context: Any) -> pb.EnqueueBatchResponse:
        results = await self.api.enqueue_many([(r.queue_name, cv.item_from_pb(r)) for r in request.messages])
        response, fresh = cv.enqueue_batch_to_pb(results)
        M.enqueued.inc(fresh)
        return response

    def _enqueue_one_nowait(self, r: pb.EnqueueRequest) -> asyncio.Future[object]:
        """Validate and queue one enqueue without a task; errors come back in the future."""
        try:
            v.check_queue_name(r.queue_name)
            item = v.check_item(cv.item_from_pb(r), self.api.limits)
            return self.api.node.propose_nowait(Enqueue(r.queue_name, [item]))
        except DoqError as e:
            fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            fut.set_result(e)
            return fut

    @staticmethod
    async def _single_enqueue_response(fut: asyncio.Future[object]) -> pb.EnqueueResponse:
        try:
            res = await fut
        except DoqError as e:
            return cv.enqueue_result_to_pb(e)
        if isinstance(res, list):
            res = res[0]
        if isinstance(res, EnqueueResult) and not res.duplicate:
            M.enqueued.inc()
        return cv.enqueue_result_to_pb(res)  # type: ignore[arg-type]

    async def EnqueueStream(
        self, request_iterator: AsyncIterator[pb.EnqueueRequest], context: Any
    ) -> AsyncIterator[pb.EnqueueResponse]:
        """Pipelined: requests are proposed as they arrive; responses follow in order."""
        inflight: asyncio.Queue[asyncio.Future[object] | None] = asyncio.Queue(STREAM_WINDOW)

        async def reader() -> None:
            try:
                async for r in request_iterator:
                    await inflight.put(self._enqueue_one_nowait(r))
            finally:
                await inflight.put(None)

        task = asyncio.create_task(reader())
        try:
            while (fut := await inflight.get()) is not None:
                yield await self._single_enqueue_response(fut)
            await task
        finally:
            task.cancel()

    async def EnqueueBatchStream(
        self, request_iterator: AsyncIterator[pb.EnqueueBatchRequest], context: Any
    ) -> AsyncIterator[pb.EnqueueBatchResponse]:
        """Pipelined batches: one response per request frame, in order."""
        inflight: asyncio.Queue[tuple[int, asyncio.Future[Any]] | None] = asyncio.Queue(64)

        async def reader() -> None:
            try:
                async for r in request_iterator:
                    items = [(m.queue_name, cv.item_from_pb(m)) for m in r.messages]
                    await inflight.put((len(items), asyncio.ensure_future(self.api.enqueue_many(items))))
            finally:
                await inflight.put(None)

        task = asyncio.create_task(reader())
        try:
            while (entry := await inflight.get()) is not None:
                count, fut = entry
                try:
                    results = await fut
                except DoqError as e:  # the whole frame failed: one error per item
                    err = cv.enqueue_result_to_pb(e)
                    yield pb.EnqueueBatchResponse(results=[err] * count)
                    continue
                response, fresh = cv.enqueue_batch_to_pb(results)
                M.enqueued.inc(fresh)
                yield response
            await task
        finally:
            task.cancel()

    # -- dequeue --------------------------------------------------------------------------
    @_unary
    async def Dequeue(self, request: pb.DequeueRequest, context: Any) -> pb.DequeueResponse:
        msgs = await self.api.dequeue(
            request.queue_name,
            max_messages=request.max_messages or 1,
            ack=request.ack,
            wait_ms=request.wait_ms,
            visibility_timeout_ms=request.visibility_timeout_ms,
        )
        M.dequeued.inc(len(msgs))
        if request.ack:
            M.acked.inc(len(msgs))
        return pb.DequeueResponse(messages=[cv.message_to_pb(m) for m in msgs])

    async def _dequeue_frames(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any, batch_default: int
    ) -> AsyncIterator[list[MessageView]]:
        """Shared engine of DequeueStream and DequeueBatchStream.

        The first request names the queue. With `prefetch` > 0 the server sends at most
        that many messages until the client returns credits (explicitly, or by acking or
        nacking in the stream when `auto_credit` is set: the credit returns as soon as the
        ack arrives, so the next dequeue shares a commit with the ack); with prefetch 0 it
        pushes as fast as the client reads (gRPC flow control bounds it). When the client
        half-closes, the server settles the acks/nacks it received and ends the stream.
        """
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        try:
            queue = v.check_queue_name(first.queue_name)
            v.check_visibility_timeout_ms(first.visibility_timeout_ms)
            await self.api.get_queue(queue)
        except DoqError as e:
            await _abort(context, e)
            return
        credit_mode = first.prefetch > 0
        credits = first.prefetch
        wake = asyncio.Event()  # credits arrived or the client half-closed
        max_batch = max(1, min(first.max_batch or batch_default, self.api.limits.max_batch_messages))
        settles: set[asyncio.Future[object]] = set()

        def add_credits(n: int) -> None:
            nonlocal credits
            if n > 0:
                credits += n
                wake.set()

        def track(fut: asyncio.Future[object]) -> None:
            settles.add(fut)
            fut.add_done_callback(_settled)

        def _settled(fut: asyncio.Future[object]) -> None:
            settles.discard(fut)
            if fut.cancelled():
                return
            res = fut.exception() or fut.result()
            if isinstance(res, list):
                M.acked.inc(sum(1 for r in res if r is None))
            if isinstance(res, BaseException) or (isinstance(res, list) and any(res)):
                log.debug("stream ack/nack on %s failed: %s", queue, res)

        def settle(req: pb.DequeueStreamRequest) -> None:
            """Propose this request's acks/nacks without waiting (pipelined)."""
            if req.ack_ids:
                lease_ids = list(req.ack_lease_ids)
                if lease_ids and len(lease_ids) != len(req.ack_ids):
                    lease_ids = []
                track(self.api.node.propose_nowait(Ack(queue, list(req.ack_ids), lease_ids)))
                if first.auto_credit:
                    add_credits(len(req.ack_ids))
            for n in req.nacks:
                prio = n.priority if n.HasField("priority") else None
                track(self.api.node.propose_nowait(Nack(queue, n.id, n.lease_id, n.delay_ms, prio)))
                if first.auto_credit:
                    add_credits(1)
            add_credits(req.credits)

        half_closed = asyncio.Event()

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    try:
                        settle(req)
                    except DoqError as e:  # overloaded or shutting down: the stream ends
                        log.debug("stream settle refused: %s", e)
                        break
            finally:
                half_closed.set()
                wake.set()

        task = asyncio.create_task(reader())
        try:
            while not half_closed.is_set():
                if credit_mode and credits <= 0:
                    wake.clear()
                    await wake.wait()
                    continue
                want = min(credits, max_batch) if credit_mode else max_batch
                try:
                    msgs = await self.api.dequeue(
                        queue,
                        max_messages=want,
                        ack=first.ack,
                        wait_ms=LONG_POLL_MS,
                        visibility_timeout_ms=first.visibility_timeout_ms,
                        stop_waiting=half_closed,
                    )
                except DoqError as e:
                    await _abort(context, e)
                    return
                if msgs:
                    if credit_mode:
                        credits -= len(msgs)
                    M.dequeued.inc(len(msgs))
                    yield msgs
            if settles:
                await asyncio.gather(*list(settles), return_exceptions=True)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def DequeueStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.Message]:
        async for msgs in self._dequeue_frames(request_iterator, context, PUSH_BATCH):
            for m in msgs:
                yield cv.message_to_pb(m)

    async def DequeueBatchStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.MessageBatch]:
        async for msgs in self._dequeue_frames(request_iterator, context, 100):
            yield pb.MessageBatch(messages=[cv.message_to_pb(m) for m in msgs])

    # -- single messages ------------------------------------------------------------------
    @_unary
    async def Get(self, request: pb.GetRequest, context: Any) -> pb.Message:
        return cv.message_to_pb(await self.api.get_message(request.queue_name, request.id))

    @_unary
    async def Delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteResponse:
        await self.api.delete_message(request.queue_name, request.id)
        return pb.DeleteResponse(success=True)

    @_unary
    async def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        await self.api.ack(request.queue_name, request.id, request.lease_id)
        M.acked.inc()
        return pb.AckResponse(success=True)

    @_unary
    async def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> pb.AckBatchResponse:
        results = await self.api.ack_many(request.queue_name, list(request.ids))
        M.acked.inc(sum(1 for r in results if r is None))
        return pb.AckBatchResponse(
            results=[
                pb.AckResult(id=i, success=True) if r is None else pb.AckResult(id=i, success=False, error=cv.error_to_pb(r))
                for i, r in zip(request.ids, results, strict=True)
            ]
        )

    @_unary
    async def Nack(self, request: pb.NackRequest, context: Any) -> pb.NackResponse:
        await self.api.nack(
            request.queue_name,
            request.id,
            lease_id=request.lease_id,
            delay_ms=request.delay_ms,
            priority=request.priority if request.HasField("priority") else None,
        )
        return pb.NackResponse(success=True)

    @_unary
    async def Touch(self, request: pb.TouchRequest, context: Any) -> pb.TouchResponse:
        until = await self.api.touch(
            request.queue_name, request.id, lease_id=request.lease_id, visibility_timeout_ms=request.visibility_timeout_ms
        )
        return pb.TouchResponse(success=True, lease_expires_at_ms=until)

    @_unary
    async def UpdatePriority(self, request: pb.UpdatePriorityRequest, context: Any) -> pb.UpdatePriorityResponse:
        m = await self.api.update_priority(request.queue_name, request.id, request.priority)
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


def build_server(api: QueueService, addr: str, *, max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
    """Create (not start) the gRPC server with reflection and health; returns it and the bound port."""
    frame_limit = max_message_bytes * 2 + 64 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max(frame_limit, 64 * 1024 * 1024)),
            ("grpc.max_send_message_length", max(frame_limit, 64 * 1024 * 1024)),
            ("grpc.so_reuseport", 0),
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
    port = server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot bind gRPC address {addr}")
    server.health_servicer = health_servicer  # type: ignore[attr-defined]
    return server, port


async def set_serving(server: grpc.aio.Server, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    hs = server.health_servicer  # type: ignore[attr-defined]
    await hs.set("", status)
    await hs.set("doq.v1.DOQ", status)
