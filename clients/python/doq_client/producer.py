"""Pipelined producers: many enqueues in flight on one EnqueueBatchStream / EnqueueStream.

By default the producer coalesces: the messages submitted one `enqueue` at a time are
packed into frames of up to `batch` messages (default 1000) and `max_frame_bytes`, the
messages of one queue as one columnar frame (`EnqueueBatchRequest.columns`: per message a
few list entries on the client, one C call per column on the server). A frame goes out at
once while fewer than `FRAMES_IN_FLIGHT` frames, or fewer than `FEW_IN_FLIGHT` messages,
wait for their answers (at a low rate, waiting to coalesce would only delay messages);
otherwise the messages wait (at most until an answer arrives or `batch` messages are
waiting), so frames grow with the load and a lone message is never held back. Each message stands
alone: an invalid one fails by itself; results keep submission order. `batch=0` sends
one message per frame on `EnqueueStream` (the seed's style). At most `window` messages are
unacknowledged at once: submitting more blocks (sync) or waits (async).

Every submit returns a future: `enqueue`/`send` -> `EnqueueResult` (an item's error is the
future's exception), `enqueue_many` -> a list of `EnqueueResult | DoqClientError`, in
order (requests for several queues go in one `messages` frame, all or nothing: the batch
rule). Each future resolves exactly once. A future resolved with a result means the
message is durably stored. `flush()` waits for all pending results; `close()` flushes and
ends the stream.

Failover: the producer stamps every message that has no `dedup_id` with one of its own
(`auto_dedup=True`: a random per-producer prefix and a sequence number) and keeps every
message until its result arrives. When the stream fails with a failover error (the node
is not the leader, went away, or the connection broke; see `doq_client.retry`), it
reopens the stream on the leader and sends again, in order, every message without a
result; a message that was stored before the failure is found by its dedup id and answers
with its original id (`duplicate=True`), so nothing is stored twice within the queue's
dedup window. Messages without a dedup id (`auto_dedup=False`) are sent again only if they
had not been sent; the others fail with the stream's error (they may have been stored).
If no leader answers within the client's `FailoverPolicy.timeout_s`, or the stream fails
otherwise, every pending future fails with that error and the producer refuses new work.

Moving to the leader: a stream opened on a follower is relayed by it to the leader, and
its initial metadata names the leader (`doq-leader-grpc`, read once per stream, when the
first answer comes). The producer then makes the leader the client's target, sends no
more frames on that stream and half-closes it; the server answers every frame already
sent, then ends the stream; the producer opens the next one on the leader with what
waited meanwhile. Nothing is sent twice, so this holds with `auto_dedup=False` too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from doq_client._future import LazyFuture
from doq_client._handle import AsyncClient, SyncClient, client_on
from doq_client._ledger import (
    Chunk,
    Frame,
    Ledger,
    Outcome,
    Refused,
    Stamper,
    batch_frame,
    columns_frame,
    take_frame,
)
from doq_client.errors import Cancelled, DoqClientError, Internal, Unavailable, from_rpc_error
from doq_client.retry import NO_RETRY, Attempts, is_failover
from doq_client.types import Content, EnqueueResult, enqueue_request, to_bytes
from doq_proto.v1 import doq_pb2 as pb

_STREAM = "/doq.v1.DOQ/EnqueueStream"
_BATCH_STREAM = "/doq.v1.DOQ/EnqueueBatchStream"
DEFAULT_BATCH = 1000  # messages per frame at most (coalescing producers)
DEFAULT_MAX_FRAME_BYTES = 4 << 20  # message contents per frame at most (a frame has >= 1 chunk)
FRAMES_IN_FLIGHT = 4  # unanswered frames before messages wait to be coalesced...
FEW_IN_FLIGHT = 32  # ...unless they carry fewer unanswered messages than this


def _open(channel: Any, batch: int) -> Any:
    """The stream method; requests go out as the bytes the ledger keeps (no serializer)."""
    if batch:
        return channel.stream_stream(
            _BATCH_STREAM, response_deserializer=pb.EnqueueBatchResponse.FromString
        )
    return channel.stream_stream(_STREAM, response_deserializer=pb.EnqueueResponse.FromString)


def _stream_closed() -> DoqClientError:
    return Unavailable(
        "the enqueue stream ended before this message was acknowledged", retryable=True
    )


def _broken(e: Exception) -> DoqClientError:
    return Internal(f"the producer's stream failed: {e!r}", code=grpc.StatusCode.INTERNAL)


def _fail(chunk: Chunk, err: DoqClientError, resolve: Callable[[Chunk], None]) -> None:
    chunk.outcomes.extend([err] * chunk.left())
    resolve(chunk)


class _Base:
    """State and rules shared by both producers (the caller holds the sync producer's lock)."""

    def __init__(self, window: int, batch: int | None, auto_dedup: bool, max_frame_bytes: int) -> None:
        batch = DEFAULT_BATCH if batch is None else batch
        if window < 1 or batch < 0 or max_frame_bytes < 1:
            raise ValueError("window and max_frame_bytes must be >= 1, batch >= 0")
        self.window = window
        self.batch = batch
        self.max_frame_bytes = max_frame_bytes
        self._stamper = Stamper(auto_dedup)
        self._inflight = 0
        self._outbox: deque[Chunk] = deque()
        self._queued = 0  # messages in the outbox
        self._ledger = Ledger(self._resolve)
        self._gen = 0  # stream generation: a request iterator of an older one stops
        self._closing = False
        self._error: DoqClientError | None = None

    def _resolve(self, chunk: Chunk) -> None:
        raise NotImplementedError

    def _pending(self) -> bool:
        return bool(self._ledger) or bool(self._outbox)

    # -- chunks: what one submit call holds -------------------------------------------
    def _message(self, queue: str, content: Content, group: str, priority: int,
                 metadata: Mapping[str, str] | None, dedup_id: str, delay_ms: int) -> Chunk:
        """One message as a chunk (columns when coalescing; validated like `enqueue_request`)."""
        if not self.batch or type(queue) is not str or group or priority or metadata or delay_ms:
            req = enqueue_request(queue, content, group=group, priority=priority, metadata=metadata,
                                  dedup_id=dedup_id, delay_ms=delay_ms)
            return self._requests_chunk([req], True)
        body = content if type(content) is bytes else to_bytes(content)
        did = dedup_id or self._stamper.next_id()
        return Chunk.one(queue, body, did)

    def _requests_chunk(self, requests: Sequence[pb.EnqueueRequest], single: bool) -> Chunk:
        """Prebuilt requests as a chunk: columns when coalescing and they name one queue."""
        if self.batch:
            chunk = self._stamper.columns(requests, None, single)
            if chunk is not None:
                return chunk
        wire, safe = self._stamper.encode(requests)
        return Chunk(wire, None, single, safe)

    # -- frames -------------------------------------------------------------------------
    def _sendable(self) -> bool:
        """Whether the outbox's head may go out now (see the module docstring)."""
        ledger = self._ledger
        return (not self.batch or ledger.frames < FRAMES_IN_FLIGHT or ledger.messages < FEW_IN_FLIGHT
                or self._queued >= self.batch)

    def _take(self) -> list[Any]:
        """Move the next frame's chunks from the outbox to the ledger; its request(s)."""
        if self.batch:
            chunks, size = take_frame(self._outbox, self.batch, self.max_frame_bytes)
            self._queued -= size
            if chunks[0].queue is not None:
                data, frame = columns_frame(chunks)
            else:
                data, frame = batch_frame(chunks), Frame(size, False, None)
            self._ledger.sent(chunks, frame)
            return [data]
        chunk = self._outbox.popleft()
        self._queued -= chunk.n - len(chunk.outcomes)
        self._ledger.sent([chunk], None)
        return chunk.unanswered()

    def _requeue(self, err: DoqClientError) -> None:
        """After a stream failure: chunks without all their results go back to the front of
        the outbox, in order, if they may be sent again (`Chunk.safe`); the others fail
        with `err` (they may have been stored)."""
        again = []
        for c in self._ledger.take_all():
            if c.safe:
                again.append(c)
            else:
                _fail(c, err, self._resolve)
        self._outbox.extendleft(reversed(again))
        self._queued += sum(c.left() for c in again)

    def _fail_all(self, err: DoqClientError) -> None:
        """Every pending future fails with `err`; the producer refuses new work."""
        left = self._ledger.take_all() + list(self._outbox)
        self._outbox.clear()
        self._queued = 0
        if left:
            self._error = err
        for c in left:
            _fail(c, err, self._resolve)

    @staticmethod
    def _settle(chunk: Chunk) -> None:
        fut = chunk.future
        if fut.done():
            return
        if not chunk.single:
            fut.set_result(chunk.outcomes)
        elif isinstance(o := chunk.outcomes[0], DoqClientError):
            fut.set_exception(o)
        else:
            fut.set_result(o)


class AsyncProducer(_Base):
    """asyncio producer over a stream of an `AsyncDoqClient` (or of one `grpc.aio.Channel`,
    retried on that channel only); use it in one event loop."""

    def __init__(
        self,
        client: AsyncClient | grpc.aio.Channel,
        *,
        window: int = 1024,
        batch: int | None = None,
        auto_dedup: bool = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        super().__init__(window, batch, auto_dedup, max_frame_bytes)
        self._client: AsyncClient = client_on(client, "async")
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- submit ------------------------------------------------------------------------
    async def enqueue(
        self,
        queue: str,
        content: Content,
        *,
        group: str = "",
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        dedup_id: str = "",
        delay_ms: int = 0,
    ) -> asyncio.Future[EnqueueResult]:
        """Submit one message; await the returned future for its `EnqueueResult`."""
        chunk = self._message(queue, content, group, priority, metadata, dedup_id, delay_ms)
        return await self._submit(chunk)

    async def send(self, request: pb.EnqueueRequest) -> asyncio.Future[EnqueueResult]:
        """Submit a prebuilt `EnqueueRequest` (see `doq_client.enqueue_request`); it is not changed."""
        return await self._submit(self._requests_chunk([request], True))

    async def enqueue_many(
        self, requests: Sequence[pb.EnqueueRequest]
    ) -> asyncio.Future[list[Outcome]]:
        """Submit several requests together (one frame); one outcome each."""
        if not requests:
            raise ValueError("enqueue_many needs at least one request")
        return await self._submit(self._requests_chunk(requests, False))

    async def _submit(self, chunk: Chunk) -> asyncio.Future[Any]:
        n = chunk.n
        while True:
            if self._error is not None:
                raise self._error
            if self._closing:
                raise RuntimeError("producer is closed")
            if self._inflight == 0 or self._inflight + n <= self.window:
                break
            self._space.clear()
            await self._space.wait()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        chunk.future = fut
        self._inflight += n
        self._idle.clear()
        wake = not self._outbox
        self._outbox.append(chunk)
        self._queued += n
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())
        if wake or self._queued >= self.batch:
            self._wake.set()
        return fut

    # -- lifecycle ---------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait until every submitted message has its result."""
        await self._idle.wait()

    async def close(self) -> None:
        """Flush, then end the stream. Idempotent."""
        if self._closing:
            return
        try:
            await self.flush()
        finally:
            self._closing = True
            self._wake.set()
            if self._runner is not None:
                await asyncio.gather(self._runner, return_exceptions=True)

    # -- the stream --------------------------------------------------------------------
    async def _run(self) -> None:
        """Open the stream on the current target and read its responses; after a failover
        error, send what has no result again on the leader; when the stream's initial
        metadata names another leader, move to it (see the module docstring)."""
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        tries: Attempts | None = None
        try:
            while True:
                addr = self._client.router.current
                call = _open(self._client.router.channel(addr), self.batch)(self._requests(self._gen))
                err: DoqClientError | None = None
                moving = False
                try:
                    if self._client.router.follow(addr, await call.initial_metadata()):
                        moving = True  # a follower relays this stream: end it, reopen on the leader
                        self._gen += 1
                        self._wake.set()
                    async for resp in call:
                        on_resp(resp)
                        if self._outbox:
                            self._wake.set()  # a frame slot is free
                        tries = None
                except grpc.RpcError as e:
                    err = from_rpc_error(e)
                except Refused as r:
                    err = r.err
                    call.cancel()
                self._gen += 1
                self._wake.set()
                if not self._pending():
                    return  # closed, or idle: the next submit opens a stream again
                if moving and err is None and not self._ledger:
                    continue  # every frame sent was answered: the rest goes to the leader
                if err is None:
                    err = _stream_closed()
                if not is_failover(err):
                    self._fail_all(err)
                    return
                tries = tries or Attempts(NO_RETRY, self._client.failover, True)
                delay = tries.next_delay(err, await self._client._redirect(err, addr))
                if delay is None:
                    self._fail_all(err)
                    return
                self._requeue(err)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self._fail_all(Cancelled("producer cancelled", code=grpc.StatusCode.CANCELLED))
            raise
        except Exception as e:  # e.g. the client was closed: never leave a future pending
            self._fail_all(_broken(e))
        finally:
            self._runner = None
            self._wake.set()
            self._space.set()

    async def _requests(self, gen: int) -> AsyncIterator[bytes]:
        while True:
            if self._gen != gen:
                return
            if self._outbox and self._sendable():
                for request in self._take():
                    yield request
                continue
            if not self._outbox and (self._closing or self._error is not None):
                return
            self._wake.clear()
            await self._wake.wait()

    def _resolve(self, chunk: Chunk) -> None:
        self._inflight -= chunk.n
        if self._inflight < self.window:
            self._space.set()
        if self._inflight == 0:
            self._idle.set()
        self._settle(chunk)


class Producer(_Base):
    """Thread-safe synchronous producer over a stream of a `DoqClient` (or of one
    `grpc.Channel`, retried on that channel only).

    A background thread reads responses (and reconnects); `enqueue` blocks only while the
    window is full.
    """

    def __init__(
        self,
        client: SyncClient | grpc.Channel,
        *,
        window: int = 1024,
        batch: int | None = None,
        auto_dedup: bool = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        super().__init__(window, batch, auto_dedup, max_frame_bytes)
        self._client: SyncClient = client_on(client, "sync")
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # results: window space, flush
        self._send = threading.Condition(lock)  # the request iterator: something to send
        self._runner: threading.Thread | None = None

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(
        self,
        queue: str,
        content: Content,
        *,
        group: str = "",
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        dedup_id: str = "",
        delay_ms: int = 0,
    ) -> concurrent.futures.Future[EnqueueResult]:
        """Submit one message; `.result()` of the returned future is its `EnqueueResult`."""
        return self._submit(self._message(queue, content, group, priority, metadata, dedup_id, delay_ms))

    def send(self, request: pb.EnqueueRequest) -> concurrent.futures.Future[EnqueueResult]:
        """Submit a prebuilt `EnqueueRequest`; it is not changed."""
        return self._submit(self._requests_chunk([request], True))

    def enqueue_many(
        self, requests: Sequence[pb.EnqueueRequest]
    ) -> concurrent.futures.Future[list[Outcome]]:
        """Submit several requests together (one frame); one outcome each."""
        if not requests:
            raise ValueError("enqueue_many needs at least one request")
        return self._submit(self._requests_chunk(requests, False))

    def _submit(self, chunk: Chunk) -> concurrent.futures.Future[Any]:
        n = chunk.n
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closing:
                    raise RuntimeError("producer is closed")
                if self._inflight == 0 or self._inflight + n <= self.window:
                    break
                self._cond.wait()
            fut: concurrent.futures.Future[Any] = LazyFuture()
            chunk.future = fut
            self._inflight += n
            wake = not self._outbox
            self._outbox.append(chunk)
            self._queued += n
            if self._runner is None:
                self._runner = threading.Thread(target=self._run, name="doq-producer", daemon=True)
                self._runner.start()
            if wake or self._queued >= self.batch:
                self._send.notify()
            return fut

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted message has its result; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then end the stream and join the reader thread. Idempotent."""
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closing = True
                self._wake_all()
                runner = self._runner
            if runner is not None and runner is not threading.current_thread():
                runner.join(timeout_s)

    def _wake_all(self) -> None:  # holds the lock
        self._cond.notify_all()
        self._send.notify_all()

    def _run(self) -> None:
        """The stream thread; see `AsyncProducer._run`."""
        try:
            self._stream()
        except Exception as e:  # e.g. the client was closed: never leave a future pending
            with self._cond:
                self._fail_all(_broken(e))
                self._runner = None
                self._wake_all()

    def _stream(self) -> None:
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        tries: Attempts | None = None
        while True:
            addr = self._client.router.current
            call = _open(self._client.router.channel(addr), self.batch)(self._requests(self._gen))
            err: DoqClientError | None = None
            moving = False
            try:
                if self._client.router.follow(addr, call.initial_metadata()):
                    moving = True  # see AsyncProducer._run
                    with self._cond:
                        self._gen += 1
                        self._send.notify_all()
                for resp in call:
                    with self._cond:
                        on_resp(resp)
                        self._cond.notify_all()  # window space, flush (once per response)
                        if self._outbox:
                            self._send.notify()  # a frame slot is free
                    tries = None
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            except Refused as r:
                err = r.err
                call.cancel()
            with self._cond:
                self._gen += 1
                self._wake_all()
                if not self._pending():
                    self._runner = None  # closed, or idle: the next submit starts a stream
                    return
                if moving and err is None and not self._ledger:
                    continue  # every frame sent was answered: the rest goes to the leader
                err = err or _stream_closed()
                if not is_failover(err):
                    self._fail_all(err)
                    self._runner = None
                    self._wake_all()
                    return
            tries = tries or Attempts(NO_RETRY, self._client.failover, True)
            delay = tries.next_delay(err, self._client._redirect(err, addr))
            with self._cond:
                if delay is None:
                    self._fail_all(err)
                    self._runner = None
                    self._wake_all()
                    return
                self._requeue(err)
                self._wake_all()
            time.sleep(delay)

    def _requests(self, gen: int) -> Iterator[bytes]:
        while True:
            with self._cond:
                while True:
                    if self._gen != gen:
                        return
                    if self._outbox:
                        if self._sendable():
                            break
                    elif self._closing or self._error is not None:
                        return
                    self._send.wait()
                frame = self._take()
            yield from frame

    def _resolve(self, chunk: Chunk) -> None:  # holds the lock; the caller wakes the waiters
        self._inflight -= chunk.n
        self._settle(chunk)
