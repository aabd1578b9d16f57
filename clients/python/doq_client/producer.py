"""Pipelined producers: many enqueues in flight on one EnqueueStream / EnqueueBatchStream.

`batch=0` sends one message per frame on `EnqueueStream`; `batch=N` packs up to N queued
messages into each `EnqueueBatchStream` frame (whatever is waiting when the stream is
ready to write; nothing is held back waiting for a frame to fill). A frame is all or
nothing (the batch rule): one invalid message fails every message of its frame with its
error; with `batch=0` an invalid message fails alone. At most `window`
messages are unacknowledged at once: submitting more blocks (sync) or waits (async).

Every submit returns a future: `enqueue`/`send` -> `EnqueueResult` (an item's error is the
future's exception), `enqueue_many` -> a list of `EnqueueResult | DoqClientError`, in
order. If the stream itself fails, every pending future fails with that error and the
producer refuses new work. `flush()` waits for all pending results; `close()` flushes and
ends the stream. A future resolved with a result means the message is durably stored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import grpc

from doq_client._ledger import Chunk, Ledger, Outcome
from doq_client.errors import Cancelled, DoqClientError, Unavailable, from_rpc_error
from doq_client.types import Content, EnqueueResult, enqueue_request
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc


def _frames(outbox: deque[Chunk], batch: int) -> tuple[list[Chunk], int]:
    """Take whole chunks from the outbox for one batch frame (at least one chunk)."""
    chunks = [outbox.popleft()]
    size = len(chunks[0].requests)
    while outbox and size + len(outbox[0].requests) <= batch:
        c = outbox.popleft()
        chunks.append(c)
        size += len(c.requests)
    return chunks, size


def _batch_frame(chunks: list[Chunk]) -> pb.EnqueueBatchRequest:
    if len(chunks) == 1:
        return pb.EnqueueBatchRequest(messages=chunks[0].requests)
    return pb.EnqueueBatchRequest(messages=[r for c in chunks for r in c.requests])


def _stream_closed() -> DoqClientError:
    return Unavailable(
        "the enqueue stream ended before this message was acknowledged", retryable=True
    )


class AsyncProducer:
    """asyncio producer over one stream on a `grpc.aio.Channel` (use in one event loop)."""

    def __init__(self, channel: grpc.aio.Channel, *, window: int = 1024, batch: int = 0) -> None:
        if window < 1 or batch < 0:
            raise ValueError("window must be >= 1 and batch >= 0")
        self._stub = pb_grpc.DOQStub(channel)
        self.window = window
        self.batch = batch
        self._inflight = 0
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._outbox: deque[Chunk] = deque()
        self._wake = asyncio.Event()
        self._ledger = Ledger(self._resolve)
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._error: DoqClientError | None = None

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
        """Submit a prebuilt `EnqueueRequest` (see `doq_client.enqueue_request`)."""
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
        if self._call is None:
            self._start()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight += n
        self._idle.clear()
        self._outbox.append(Chunk(requests, fut, single))
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
            if self._reader is not None:
                await asyncio.gather(self._reader, return_exceptions=True)

    def _start(self) -> None:
        method = self._stub.EnqueueBatchStream if self.batch else self._stub.EnqueueStream
        self._call = method(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[Any]:
        outbox, ledger = self._outbox, self._ledger
        while True:
            while not outbox:
                if self._closing or self._error is not None:
                    return
                self._wake.clear()
                await self._wake.wait()
            if self.batch:
                chunks, size = _frames(outbox, self.batch)
                ledger.sent(chunks, size)
                yield _batch_frame(chunks)
            else:
                chunk = outbox.popleft()
                ledger.sent([chunk], None)
                for r in chunk.requests:
                    yield r

    async def _read(self) -> None:
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        err: DoqClientError = _stream_closed()
        try:
            async for resp in self._call:
                on_resp(resp)
        except grpc.RpcError as e:
            err = from_rpc_error(e)
        except asyncio.CancelledError:
            err = Cancelled("producer cancelled", code=grpc.StatusCode.CANCELLED)
            raise
        finally:
            left = self._ledger.fail_all() + list(self._outbox)
            self._outbox.clear()
            if left:
                self._error = err
            for chunk in left:
                chunk.outcomes = [err] * len(chunk.requests)
                self._resolve(chunk)
            self._wake.set()
            self._space.set()

    def _resolve(self, chunk: Chunk) -> None:
        self._inflight -= len(chunk.requests)
        if self._inflight < self.window:
            self._space.set()
        if self._inflight == 0:
            self._idle.set()
        fut = chunk.future
        if fut.done():
            return
        if not chunk.single:
            fut.set_result(chunk.outcomes)
        elif isinstance(o := chunk.outcomes[0], DoqClientError):
            fut.set_exception(o)
        else:
            fut.set_result(o)


class Producer:
    """Thread-safe synchronous producer over one stream on a `grpc.Channel`.

    A background thread reads responses; `enqueue` blocks only while the window is full.
    """

    def __init__(self, channel: grpc.Channel, *, window: int = 1024, batch: int = 0) -> None:
        if window < 1 or batch < 0:
            raise ValueError("window must be >= 1 and batch >= 0")
        self._stub = pb_grpc.DOQStub(channel)
        self.window = window
        self.batch = batch
        self._cond = threading.Condition()
        self._inflight = 0
        self._outbox: deque[Chunk] = deque()
        self._ledger = Ledger(self._resolve)
        self._call: Any = None
        self._reader: threading.Thread | None = None
        self._closing = False
        self._error: DoqClientError | None = None

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
        """Submit a prebuilt `EnqueueRequest`."""
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
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closing:
                    raise RuntimeError("producer is closed")
                if self._inflight == 0 or self._inflight + n <= self.window:
                    break
                self._cond.wait()
            if self._call is None:
                self._start()
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._inflight += n
            self._outbox.append(Chunk(requests, fut, single))
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
            if self._reader is not None and self._reader is not threading.current_thread():
                self._reader.join(timeout_s)

    def _start(self) -> None:  # holds self._cond
        method = self._stub.EnqueueBatchStream if self.batch else self._stub.EnqueueStream
        self._call = method(self._requests())
        self._reader = threading.Thread(target=self._read, name="doq-producer", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[Any]:
        while True:
            with self._cond:
                while not self._outbox:
                    if self._closing or self._error is not None:
                        return
                    self._cond.wait()
                if self.batch:
                    chunks, size = _frames(self._outbox, self.batch)
                    self._ledger.sent(chunks, size)
                    frame: list[Any] = [_batch_frame(chunks)]
                else:
                    chunk = self._outbox.popleft()
                    self._ledger.sent([chunk], None)
                    frame = list(chunk.requests)
            yield from frame

    def _read(self) -> None:
        err: DoqClientError = _stream_closed()
        try:
            for resp in self._call:
                with self._cond:
                    if self.batch:
                        self._ledger.on_batch(resp)
                    else:
                        self._ledger.on_single(resp)
        except grpc.RpcError as e:
            err = from_rpc_error(e)
        finally:
            with self._cond:
                left = self._ledger.fail_all() + list(self._outbox)
                self._outbox.clear()
                if left:
                    self._error = err
                for chunk in left:
                    chunk.outcomes = [err] * len(chunk.requests)
                    self._resolve(chunk)
                self._cond.notify_all()

    def _resolve(self, chunk: Chunk) -> None:  # holds self._cond
        self._inflight -= len(chunk.requests)
        self._cond.notify_all()
        fut = chunk.future
        if fut.done():
            return
        if not chunk.single:
            fut.set_result(chunk.outcomes)
        elif isinstance(o := chunk.outcomes[0], DoqClientError):
            fut.set_exception(o)
        else:
            fut.set_result(o)
