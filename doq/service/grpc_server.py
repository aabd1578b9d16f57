"""gRPC adapter: doq.v1.DOQ over the `QueueService` facade (grpc.aio, same event loop).

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

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from doq.auth.grpc_keys import KeyRpcs
from doq.auth.held import Held, require_lease, require_leases
from doq.errors import DoqError, InvalidArgument
from doq.node.base import Node, wait_for_result
from doq.queues.commands import Ack, Dequeue, Nack
from doq.queues.model import EnqueueColumnsResult, EnqueueResult, MessageView
from doq.service import convert as cv
from doq.service import limits as v
from doq.service import metrics
from doq.service.api import QueueService, StandingPoll

log = logging.getLogger(__name__)
M = metrics.GRPC

T = TypeVar("T")
R = TypeVar("R")
STREAM_WINDOW = 8192  # responses in flight per EnqueueStream before we stop reading
BATCH_STREAM_WINDOW = 64  # frames in flight per EnqueueBatchStream before we stop reading
PUSH_BATCH = 64  # messages per dequeue on DequeueStream (max_batch 0)
FRAME_BATCH = 100  # messages per frame on DequeueBatchStream (max_batch 0)
LONG_POLL_MS = 10_000
OWN_DEQUEUES = 8  # dequeues a leasing stream with prefetch proposes itself, in flight at once


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


async def _read_into(requests: AsyncIterator[R], put: Callable[[Any], Awaitable[None]],
                     convert: Callable[[R], Any]) -> None:
    """Reader task of a pipelined stream: `put(convert(r))` for each request, then `put(None)`.

    Cancelled (by the writer, which reads no more), it ends at once without the end mark:
    waiting to put it into a full queue nobody drains would keep the task forever.
    """
    try:
        async for r in requests:
            await put(convert(r))
    except asyncio.CancelledError:
        raise
    except BaseException:
        await put(None)
        raise
    await put(None)


def _refused(fut: asyncio.Future[object]) -> bool:
    """A done dequeue future that failed or was refused by the machine."""
    return fut.cancelled() or fut.exception() is not None or isinstance(fut.result(), DoqError)


async def _finish(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has ended (its own errors are not raised here)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a reader error was already reported or is moot


class DequeueSession:
    """One DequeueStream / DequeueBatchStream call; each state is a method.

    - `open` reads and checks the first request (queue, mode, prefetch).
    - `settle` handles one later request: proposes its acks, nacks and releases without
      waiting (pipelined) and adds credits (`auto_credit`: one per ack or nack, returned as
      soon as the request arrives, so the next dequeue shares a commit with the ack).
      `read_requests` (the reader task) settles every request until the client half-closes.
    - `pump` dequeues as credits allow (no limit with prefetch 0) and yields non-empty
      frames until the half-close; a frame dequeued in lease mode after the half-close is
      released (`release`), not sent. In lease mode the session waits as a `StandingPoll`,
      so each enqueue arriving while it has credits leases for it in its own commit.
    - `drain` waits for every proposed settlement; `close` ends the reader task.
    A refused request (`error`) stops the session like a half-close; the call then ends
    with that status.
    """

    def __init__(self, api: QueueService, first: pb.DequeueStreamRequest, batch_default: int) -> None:
        self.api = api
        self.queue = first.queue_name
        self.ack = first.ack
        self.visibility_timeout_ms = first.visibility_timeout_ms
        self.auto_credit = first.auto_credit
        self.credit_mode = first.prefetch > 0
        self.credits = first.prefetch
        self.max_batch = max(1, min(first.max_batch or batch_default, api.limits.max_batch_messages))
        self.columns = first.columns  # DequeueBatchStream: frames in MessageBatch.columns
        self.wake = asyncio.Event()  # credits arrived or the client half-closed
        self.half_closed = asyncio.Event()
        self.error: DoqError | None = None
        self.settles: set[asyncio.Future[object]] = set()
        self._reader: asyncio.Task[None] | None = None
        self.held = Held()  # what this stream delivered: it settles only those

    @classmethod
    async def open(
        cls, api: QueueService, requests: AsyncIterator[pb.DequeueStreamRequest], batch_default: int
    ) -> DequeueSession | None:
        """The session named by the first request; None if the client sent none. Raises DoqError."""
        try:
            first = await anext(aiter(requests))
        except StopAsyncIteration:
            return None
        v.check_queue_name(first.queue_name)
        v.check_visibility_timeout_ms(first.visibility_timeout_ms)
        await api.get_queue(first.queue_name)
        return cls(api, first, batch_default)

    def start(self, requests: AsyncIterator[pb.DequeueStreamRequest]) -> None:
        self._reader = asyncio.create_task(self.read_requests(requests), name=f"doq.DequeueSession:{self.queue}")

    # -- settle ---------------------------------------------------------------------------
    def add_credits(self, n: int) -> None:
        if n > 0:
            self.credits += n
            self.wake.set()

    def settle(self, req: pb.DequeueStreamRequest) -> None:
        """Propose this request's acks, nacks and releases without waiting; add its credits.

        Raises InvalidArgument (INVALID_LEASE_IDS) before proposing anything if
        `ack_lease_ids` is neither empty nor as long as `ack_ids`; the node may refuse
        (Overloaded, Unavailable).
        """
        returned = 0
        if req.ack_ids or req.ack_lease_ids:
            ids, lease_ids = list(req.ack_ids), list(req.ack_lease_ids)
            v.check_lease_ids(ids, lease_ids)
            lease_ids = self.held.acks(ids, lease_ids)
            self._track(self.api.node.propose_nowait(Ack(self.queue, ids, lease_ids)))
            returned += len(ids)
        for n in req.nacks:
            prio = n.priority if n.HasField("priority") else None
            self._track(self.api.node.propose_nowait(
                Nack(self.queue, n.id, self.held.take(n.id, n.lease_id), n.delay_ms, prio, n.release)))
            returned += 1
        self.add_credits((returned if self.auto_credit else 0) + req.credits)

    async def read_requests(self, requests: AsyncIterator[pb.DequeueStreamRequest]) -> None:
        """The reader task: settle each request until the client half-closes (or one is refused)."""
        try:
            async for req in requests:
                self.settle(req)
        except DoqError as e:
            log.debug("dequeue stream on %s: request refused: %s", self.queue, e)
            self.error = e
        finally:
            self.half_closed.set()
            self.wake.set()

    def _track(self, fut: asyncio.Future[object]) -> None:
        self.settles.add(fut)
        fut.add_done_callback(self._settled)

    def _settled(self, fut: asyncio.Future[object]) -> None:
        self.settles.discard(fut)
        if fut.cancelled():
            return
        res = fut.exception() or fut.result()
        if isinstance(res, list):
            M.acked.inc(res.count(None))
        if isinstance(res, BaseException) or (isinstance(res, list) and any(res)):
            log.debug("stream ack/nack on %s failed: %s", self.queue, res)

    # -- pump -----------------------------------------------------------------------------
    def pump(self) -> AsyncGenerator[list[MessageView], None]:
        """Dequeue as credits allow and yield each non-empty frame, until the half-close."""
        return self._removals() if self.ack else self._leases()

    def _room(self, inflight: deque[tuple[asyncio.Future[object], int]]) -> int:
        """Messages the stream may be given now: its credits less what the dequeues in
        flight may still return (`max_batch` at most)."""
        if not self.credit_mode:
            return self.max_batch
        return max(0, min(self.credits - sum(k for _, k in inflight), self.max_batch))

    async def _leases(self) -> AsyncGenerator[list[MessageView], None]:
        """Lease mode. The stream's `StandingPoll` stays parked while it has room, also
        while earlier dequeues commit and frames are sent, so each enqueue arriving
        meanwhile leases for it in the enqueue's own log entry; when the queue already
        has more deliverable than the stream's own dequeues in flight ask for, the stream
        proposes dequeues itself, as many as its room allows (at most `OWN_DEQUEUES` in
        flight; one without prefetch), so that the next commit carries the stream's next
        dequeue while one commits and its frame is sent. Frames follow in the order of
        those dequeues (the log's); the results of dequeues committed by the time a frame
        is made go out together in it (up to `max_batch` messages: after a busy moment,
        one send rather than one per enqueue). A frame dequeued after the half-close, or
        left when the frames stop being taken (the call ends), is released, not sent."""
        polls = self.api.long_polls
        state = self.api.node.state
        sp = StandingPoll(self.visibility_timeout_ms, self.wake)
        inflight = sp.early  # dequeues in flight, oldest first: early ones and our own
        own: dict[asyncio.Future[object], int] = {}  # those this stream proposed itself: size
        own_n = 0  # messages they may return
        depth = OWN_DEQUEUES if self.credit_mode else 1
        starved = False  # its last came back empty: `deliverable` is only an upper bound (a
        # fair queue's group limit), so try again only when a commit wakes the poll
        ready: list[MessageView] | None = None
        try:
            while True:
                if self.half_closed.is_set():
                    polls.sit(self.queue, sp)
                else:
                    room = self._room(inflight)
                    while (room > 0 and len(own) < depth and (sp.claim or not starved)
                           and state.deliverable(self.queue) > own_n):
                        fut = self.api.node.propose_nowait(
                            Dequeue(self.queue, room, False, self.visibility_timeout_ms))
                        inflight.append((fut, room))
                        own[fut] = room
                        own_n += room
                        room = self._room(inflight)
                    if not own:
                        polls.release_standing(self.queue, sp)
                    sp.wanted = room
                    if sp.wanted > 0:
                        polls.stand(self.queue, sp)
                    else:
                        polls.sit(self.queue, sp)
                if ready is not None:
                    msgs, ready = ready, None
                    yield msgs
                    continue
                if inflight:
                    fut = inflight[0][0]
                    if not fut.done():  # woken by the result itself, frames first
                        await wait_for_result(fut)
                    taken: list[MessageView] = []
                    while inflight and inflight[0][0].done():  # this one and those in behind it
                        fut, most = inflight[0]
                        if taken and (len(taken) + most > self.max_batch or _refused(fut)):
                            break  # the next frame's (an error is raised after this frame)
                        inflight.popleft()
                        result = fut.result()
                        if fut in own:
                            own_n -= own.pop(fut)
                            starved = not result
                            polls.release_standing(self.queue, sp)
                        if isinstance(result, DoqError):
                            raise result
                        assert isinstance(result, list)
                        taken += result
                    if not taken:
                        continue
                    if self.half_closed.is_set():
                        self.release(taken)  # the client stopped taking: hand them back, unsent
                        continue
                    M.dequeued.inc(len(taken))
                    if self.credit_mode:
                        self.credits -= len(taken)
                    self.held.record(taken)
                    ready = taken
                    continue
                if self.half_closed.is_set():
                    return
                self.wake.clear()
                await self.wake.wait()
        finally:
            polls.sit(self.queue, sp)
            polls.release_standing(self.queue, sp)
            if ready:
                self.release(ready)
            if inflight:  # a proposed dequeue ends with its commit: release what it leased
                futs = [f for f, _ in inflight]
                inflight.clear()
                await asyncio.wait(futs)
                for f in futs:
                    if not f.cancelled() and f.exception() is None and isinstance(r := f.result(), list) and r:
                        self.release(r)

    async def _removals(self) -> AsyncGenerator[list[MessageView], None]:
        """Ack mode: one removing long poll at a time, the next after a frame was taken."""
        while not self.half_closed.is_set():
            if self.credit_mode and self.credits <= 0:
                self.wake.clear()
                await self.wake.wait()
                continue
            want = min(self.credits, self.max_batch) if self.credit_mode else self.max_batch
            msgs = await self.api.dequeue(
                self.queue,
                max_messages=want,
                ack=True,
                wait_ms=LONG_POLL_MS,
                visibility_timeout_ms=self.visibility_timeout_ms,
                stop_waiting=self.half_closed,
            )
            if not msgs:
                continue
            M.dequeued.inc(len(msgs))
            if self.credit_mode:
                self.credits -= len(msgs)
            yield msgs

    def release(self, msgs: list[MessageView]) -> None:
        """Undo the delivery of leased messages that will not be sent (see `Nack.release`)."""
        try:
            for m in msgs:
                self._track(self.api.node.propose_nowait(Nack(self.queue, m.id, m.lease_id, release=True)))
        except DoqError as e:  # refused by the node: the leases will expire instead
            log.warning("could not release %d messages of %s: %s", len(msgs), self.queue, e)

    # -- end ------------------------------------------------------------------------------
    async def drain(self) -> None:
        """Wait until every proposed ack, nack and release is settled. Cancelled (the call
        ends), it leaves them be: a proposal whose future is cancelled before the node
        takes it is dropped, and the client sent these acks before it gave up waiting."""
        if self.settles:
            await asyncio.wait(list(self.settles))

    async def close(self) -> None:
        """End the reader task (the client may not have half-closed)."""
        if self._reader is not None:
            await _finish(self._reader)


class DOQServicer(KeyRpcs, pb_grpc.DOQServicer):
    def __init__(self, api: QueueService) -> None:
        self.node = api.node
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
        if request.HasField("columns"):
            res = await self._columns_nowait(request)
            if isinstance(res, DoqError):
                raise res
            assert isinstance(res, EnqueueColumnsResult)
            response, fresh = cv.enqueue_columns_to_pb(res)
        else:
            results = await self.api.enqueue_many([(r.queue_name, cv.item_from_pb(r)) for r in request.messages])
            response, fresh = cv.enqueue_batch_to_pb(results)
        M.enqueued.inc(fresh)
        return response

    def _columns_nowait(self, r: pb.EnqueueBatchRequest) -> asyncio.Future[object]:
        """Propose a `columns` frame; the future's result is its result or the DoqError
        refusing it whole (a frame with `messages` too is refused)."""
        if r.messages:
            fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            fut.set_result(InvalidArgument("a frame carries messages or columns, not both",
                                           reason="INVALID_COLUMNS"))
            return fut
        return self.api.enqueue_columns_nowait(cv.columns_from_pb(r.columns))

    def _enqueue_one_nowait(self, r: pb.EnqueueRequest) -> asyncio.Future[object]:
        """Validate and queue one enqueue without a task; errors come back in the future."""
        try:
            v.check_queue_name(r.queue_name)
            item = v.check_item(cv.item_from_pb(r), self.api.limits)
            return self.api.enqueue_nowait(r.queue_name, item)
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
        task = asyncio.create_task(
            _read_into(request_iterator, inflight.put, self._enqueue_one_nowait), name="doq.EnqueueStream.reader"
        )
        try:
            while (fut := await inflight.get()) is not None:
                yield await self._single_enqueue_response(fut)
            await task
        finally:
            await _finish(task)

    async def EnqueueBatchStream(
        self, request_iterator: AsyncIterator[pb.EnqueueBatchRequest], context: Any
    ) -> AsyncIterator[pb.EnqueueBatchResponse]:
        """Pipelined batches: one response per request frame, in order (each frame all or
        nothing). A `columns` frame is proposed as it arrives, without a task."""
        inflight: asyncio.Queue[tuple[int, asyncio.Future[Any], bool] | None] = asyncio.Queue(
            BATCH_STREAM_WINDOW
        )

        started: set[asyncio.Task[Any]] = set()  # message frames not answered yet

        def start_frame(r: pb.EnqueueBatchRequest) -> tuple[int, asyncio.Future[Any], bool]:
            if r.HasField("columns"):
                return len(r.columns.contents), self._columns_nowait(r), True
            items = [(m.queue_name, cv.item_from_pb(m)) for m in r.messages]
            frame = asyncio.create_task(self.api.enqueue_many(items))
            started.add(frame)
            frame.add_done_callback(started.discard)
            return len(items), frame, False

        task = asyncio.create_task(
            _read_into(request_iterator, inflight.put, start_frame), name="doq.EnqueueBatchStream.reader"
        )
        try:
            while (entry := await inflight.get()) is not None:
                count, frame, columns = entry
                try:
                    results = await frame
                except DoqError as e:  # the whole frame failed: one error per item
                    if columns:
                        yield cv.enqueue_columns_to_pb(e)[0]
                        continue
                    err = cv.enqueue_result_to_pb(e)
                    yield pb.EnqueueBatchResponse(results=[err] * count)
                    continue
                if columns:
                    response, fresh = cv.enqueue_columns_to_pb(results)
                else:
                    response, fresh = cv.enqueue_batch_to_pb(results)
                M.enqueued.inc(fresh)
                yield response
            await task
        finally:
            await _finish(task)
            for frame in list(started):  # frames nobody will answer: they end with the call
                await _finish(frame)

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
        response = pb.DequeueResponse()
        cv.add_messages(response.messages, msgs)
        return response

    async def _dequeue_frames(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any, batch_default: int
    ) -> AsyncGenerator[tuple[DequeueSession, list[MessageView]], None]:
        """Shared engine of DequeueStream and DequeueBatchStream (see `DequeueSession`):
        each frame's messages, with the session."""
        try:
            session = await DequeueSession.open(self.api, request_iterator, batch_default)
        except DoqError as e:
            await _abort(context, e, self.api.node)
            return
        if session is None:
            return
        session.start(request_iterator)
        try:
            async with contextlib.aclosing(session.pump()) as frames:  # its end runs here, not at GC
                async for msgs in frames:
                    yield session, msgs
            await session.drain()
        except DoqError as e:
            await _abort(context, e, self.api.node)
        finally:
            await session.close()
        if session.error is not None:
            await _abort(context, session.error, self.api.node)

    async def DequeueStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.Message]:
        async with contextlib.aclosing(self._dequeue_frames(request_iterator, context, PUSH_BATCH)) as frames:
            async for _, msgs in frames:
                for m in msgs:
                    yield cv.message_to_pb(m)

    async def DequeueBatchStream(
        self, request_iterator: AsyncIterator[pb.DequeueStreamRequest], context: Any
    ) -> AsyncIterator[pb.MessageBatch]:
        async with contextlib.aclosing(self._dequeue_frames(request_iterator, context, FRAME_BATCH)) as frames:
            async for session, msgs in frames:
                frame = pb.MessageBatch()
                if session.columns:
                    cv.add_columns(frame.columns, msgs)
                else:
                    cv.add_messages(frame.messages, msgs)
                yield frame

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
        require_lease(request.lease_id)
        await self.api.ack(request.queue_name, request.id, request.lease_id)
        M.acked.inc()
        return pb.AckResponse(success=True)

    @_unary
    async def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> pb.AckBatchResponse:
        require_leases(request.ids, request.lease_ids)
        results = await self.api.ack_many(request.queue_name, list(request.ids), list(request.lease_ids))
        M.acked.inc(sum(1 for r in results if r is None))
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
        )
        return pb.NackResponse(success=True)

    @_unary
    async def Touch(self, request: pb.TouchRequest, context: Any) -> pb.TouchResponse:
        require_lease(request.lease_id)
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


def grpc_frame_limit(max_message_bytes: int) -> int:
    """The largest gRPC message (bytes) a node sends or receives for `max_message_bytes`."""
    return max(max_message_bytes * 2 + 64 * 1024, 64 * 1024 * 1024)


def build_server(
    api: QueueService, addr: str, *, max_message_bytes: int,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """Create (not start) the gRPC server with reflection and health; returns it and the bound port."""
    frame_limit = grpc_frame_limit(max_message_bytes)
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", frame_limit),
            ("grpc.max_send_message_length", frame_limit),
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
