"""Pipelined producers: many enqueues in flight on one EnqueueStream / EnqueueBatchStream.

`batch=0` sends one message per frame on `EnqueueStream`; `batch=N` packs up to N queued
messages into each `EnqueueBatchStream` frame (whatever is waiting when the stream is
ready to write; nothing is held back waiting for a frame to fill). A frame is all or
nothing (the batch rule): one invalid message fails every message of its frame with its
error; with `batch=0` an invalid message fails alone. At most `window`
messages are unacknowledged at once: submitting more blocks (sync) or waits (async).

Every submit returns a future: `enqueue`/`send` -> `EnqueueResult` (an item's error is the
future's exception), `enqueue_many` -> a list of `EnqueueResult | DoqClientError`, in
order. Each future resolves exactly once. A future resolved with a result means the
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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from doq_client._ledger import Chunk, Ledger, Outcome, Refused, Stamper, batch_frame, take_frame
from doq_client.errors import Cancelled, DoqClientError, Internal, Unavailable, from_rpc_error
from doq_client.retry import NO_RETRY, Attempts, is_failover
from doq_client.types import Content, EnqueueResult, enqueue_request
from doq_proto.v1 import doq_pb2 as pb

if TYPE_CHECKING:
    from doq_client.aio import AsyncDoqClient
    from doq_client.client import DoqClient

_STREAM = "/doq.v1.DOQ/EnqueueStream"
_BATCH_STREAM = "/doq.v1.DOQ/EnqueueBatchStream"


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
    chunk.outcomes.extend([err] * (len(chunk.wire) - len(chunk.outcomes)))
    resolve(chunk)


class _Base:
    """State and rules shared by both producers (the caller holds the sync producer's lock)."""

    def __init__(self, window: int, batch: int, auto_dedup: bool) -> None:
        if window < 1 or batch < 0:
            raise ValueError("window must be >= 1 and batch >= 0")
        self.window = window
        self.batch = batch
        self._stamper = Stamper(auto_dedup)
        self._inflight = 0
        self._outbox: deque[Chunk] = deque()
        self._ledger = Ledger(self._resolve)
        self._gen = 0  # stream generation: a request iterator of an older one stops
        self._closing = False
        self._error: DoqClientError | None = None

    def _resolve(self, chunk: Chunk) -> None:
        raise NotImplementedError

    def _pending(self) -> bool:
        return bool(self._ledger) or bool(self._outbox)

    def _take(self) -> list[Any]:
        """Move the next frame's chunks from the outbox to the ledger; its request(s)."""
        if self.batch:
            chunks, size = take_frame(self._outbox, self.batch)
            self._ledger.sent(chunks, size)
            return [batch_frame(chunks)]
        chunk = self._outbox.popleft()
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

    def _fail_all(self, err: DoqClientError) -> None:
        """Every pending future fails with `err`; the producer refuses new work."""
        left = self._ledger.take_all() + list(self._outbox)
        self._outbox.clear()
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
        client: AsyncDoqClient | grpc.aio.Channel,
        *,
        window: int = 1024,
        batch: int = 0,
        auto_dedup: bool = True,
    ) -> None:
        super().__init__(window, batch, auto_dedup)
        from doq_client.aio import AsyncDoqClient

        self._client = client if isinstance(client, AsyncDoqClient) else AsyncDoqClient(channel=client)
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
        req = enqueue_request(
            queue,
            content,
            group=group,
            priority=priority,
            metadata=metadata,
            dedup_id=dedup_id,
            delay_ms=delay_ms,
        )
        return await self._submit([req], True)

    async def send(self, request: pb.EnqueueRequest) -> asyncio.Future[EnqueueResult]:
        """Submit a prebuilt `EnqueueRequest` (see `doq_client.enqueue_request`); it is not changed."""
        return await self._submit([request], True)

    async def enqueue_many(
        self, requests: Sequence[pb.EnqueueRequest]
    ) -> asyncio.Future[list[Outcome]]:
        """Submit several requests together (one frame in batch mode); one outcome each."""
        if not requests:
            raise ValueError("enqueue_many needs at least one request")
        return await self._submit(requests, False)

    async def _submit(
        self, requests: Sequence[pb.EnqueueRequest], single: bool
    ) -> asyncio.Future[Any]:
        n = len(requests)
        while True:
            if self._error is not None:
                raise self._error
            if self._closing:
                raise RuntimeError("producer is closed")
            if self._inflight == 0 or self._inflight + n <= self.window:
                break
            self._space.clear()
            await self._space.wait()
        wire, safe = self._stamper.encode(requests)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight += n
        self._idle.clear()
        self._outbox.append(Chunk(wire, fut, single, safe))
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())
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
        error, send what has no result again on the leader (see the module docstring)."""
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        tries: Attempts | None = None
        try:
            while True:
                addr = self._client.router.current
                call = _open(self._client.router.channel(addr), self.batch)(self._requests(self._gen))
                err: DoqClientError | None = None
                try:
                    async for resp in call:
                        on_resp(resp)
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
            if not self._outbox:
                if self._closing or self._error is not None:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            for request in self._take():
                yield request

    def _resolve(self, chunk: Chunk) -> None:
        self._inflight -= len(chunk.wire)
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
        client: DoqClient | grpc.Channel,
        *,
        window: int = 1024,
        batch: int = 0,
        auto_dedup: bool = True,
    ) -> None:
        super().__init__(window, batch, auto_dedup)
        from doq_client.client import DoqClient

        self._client = client if isinstance(client, DoqClient) else DoqClient(channel=client)
        self._cond = threading.Condition()
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
        req = enqueue_request(
            queue,
            content,
            group=group,
            priority=priority,
            metadata=metadata,
            dedup_id=dedup_id,
            delay_ms=delay_ms,
        )
        return self._submit([req], True)

    def send(self, request: pb.EnqueueRequest) -> concurrent.futures.Future[EnqueueResult]:
        """Submit a prebuilt `EnqueueRequest`; it is not changed."""
        return self._submit([request], True)

    def enqueue_many(
        self, requests: Sequence[pb.EnqueueRequest]
    ) -> concurrent.futures.Future[list[Outcome]]:
        """Submit several requests together (one frame in batch mode); one outcome each."""
        if not requests:
            raise ValueError("enqueue_many needs at least one request")
        return self._submit(requests, False)

    def _submit(
        self, requests: Sequence[pb.EnqueueRequest], single: bool
    ) -> concurrent.futures.Future[Any]:
        n = len(requests)
        wire, safe = self._stamper.encode(requests)
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closing:
                    raise RuntimeError("producer is closed")
                if self._inflight == 0 or self._inflight + n <= self.window:
                    break
                self._cond.wait()
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._inflight += n
            self._outbox.append(Chunk(wire, fut, single, safe))
            if self._runner is None:
                self._runner = threading.Thread(target=self._run, name="doq-producer", daemon=True)
                self._runner.start()
            self._cond.notify_all()
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
                self._cond.notify_all()
                runner = self._runner
            if runner is not None and runner is not threading.current_thread():
                runner.join(timeout_s)

    def _run(self) -> None:
        """The stream thread; see `AsyncProducer._run`."""
        try:
            self._stream()
        except Exception as e:  # e.g. the client was closed: never leave a future pending
            with self._cond:
                self._fail_all(_broken(e))
                self._runner = None

    def _stream(self) -> None:
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        tries: Attempts | None = None
        while True:
            addr = self._client.router.current
            call = _open(self._client.router.channel(addr), self.batch)(self._requests(self._gen))
            err: DoqClientError | None = None
            try:
                for resp in call:
                    with self._cond:
                        on_resp(resp)
                    tries = None
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            except Refused as r:
                err = r.err
                call.cancel()
            with self._cond:
                self._gen += 1
                self._cond.notify_all()
                if not self._pending():
                    self._runner = None  # closed, or idle: the next submit starts a stream
                    return
                err = err or _stream_closed()
                if not is_failover(err):
                    self._fail_all(err)
                    self._runner = None
                    return
            tries = tries or Attempts(NO_RETRY, self._client.failover, True)
            delay = tries.next_delay(err, self._client._redirect(err, addr))
            with self._cond:
                if delay is None:
                    self._fail_all(err)
                    self._runner = None
                    return
                self._requeue(err)
            time.sleep(delay)

    def _requests(self, gen: int) -> Iterator[bytes]:
        while True:
            with self._cond:
                while not self._outbox:
                    if self._gen != gen or self._closing or self._error is not None:
                        return
                    self._cond.wait()
                if self._gen != gen:
                    return
                frame = self._take()
            yield from frame

    def _resolve(self, chunk: Chunk) -> None:  # holds self._cond
        self._inflight -= len(chunk.wire)
        self._cond.notify_all()
        self._settle(chunk)
