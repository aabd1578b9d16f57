"""`AsyncProducer`: many enqueues in flight on one EnqueueBatchStream / EnqueueStream (a task).

This file is also the source of the synchronous `doq_client.producer.Producer` (threads),
which `clients/python/unasync.py` writes from it: edit this one. Where tasks and threads
differ in more than `await`, `doq_client._producer_io` has an `*_aio` / `*_sync` pair; the
state and rules both share are `doq_client._producer_core.ProducerCore`.

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
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from doq_client._handle import AsyncClient, client_on
from doq_client._ledger import Chunk, Outcome, Refused
from doq_client._producer_core import (
    DEFAULT_MAX_FRAME_BYTES,
    ProducerCore,
    broken,
    open_stream,
    stream_closed,
)
from doq_client._producer_io import (
    AioSignal,
    CANCELLED_aio,
    NoLock,
    join_aio,
    spawn_aio,
    wait_for_aio,
)
from doq_client.errors import Cancelled, DoqClientError, from_rpc_error
from doq_client.retry import NO_RETRY, Attempts, is_failover
from doq_client.types import Content, EnqueueResult
from doq_proto.v1 import doq_pb2 as pb


class AsyncProducer(ProducerCore):
    """asyncio producer over a stream of an `AsyncDoqClient` (or of one `grpc.aio.Channel`,
    retried on that channel only); use it in one event loop.

    A task reads responses (and reconnects); `enqueue` waits only while the window is full.
    """

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
        self._lock = NoLock()
        self._results = AioSignal(self._lock)  # results: window space, flush
        self._send = AioSignal(self._lock)  # the request iterator: something to send
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
        """Submit one message; the returned future's result is its `EnqueueResult`."""
        return await self._submit(self._message(queue, content, group, priority, metadata, dedup_id, delay_ms))

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
        with self._lock:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closing:
                    raise RuntimeError("producer is closed")
                if self._inflight == 0 or self._inflight + n <= self.window:
                    break
                await self._results.wait()
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            chunk.future = fut
            self._inflight += n
            wake = not self._outbox
            self._outbox.append(chunk)
            self._queued += n
            if self._runner is None:
                self._runner = spawn_aio(self._run, "doq-producer")
            if wake or self._queued >= self.batch:
                self._send.notify()
            return fut

    # -- lifecycle ---------------------------------------------------------------------
    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted message has its result; False on timeout."""
        with self._lock:
            return await wait_for_aio(self._results, self._flushed, timeout_s)

    def _flushed(self) -> bool:
        return self._inflight == 0

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then end the stream and wait for its reader to end. Idempotent."""
        try:
            await self.flush(timeout_s)
        finally:
            with self._lock:
                self._closing = True
                self._wake_all()
                runner = self._runner
            await join_aio(runner, timeout_s)

    def _wake_all(self) -> None:  # holds the lock
        self._results.notify_all()
        self._send.notify_all()

    # -- the stream --------------------------------------------------------------------
    async def _run(self) -> None:
        """The stream's reader; whatever ends it, no future is left pending."""
        try:
            await self._stream()
        except CANCELLED_aio:
            with self._lock:
                self._fail_all(Cancelled("producer cancelled", code=grpc.StatusCode.CANCELLED))
                self._runner = None
                self._wake_all()
            raise
        except Exception as e:  # e.g. the client was closed: never leave a future pending
            with self._lock:
                self._fail_all(broken(e))
                self._runner = None
                self._wake_all()

    async def _stream(self) -> None:
        """Open the stream on the current target and read its responses; after a failover
        error, send what has no result again on the leader; when the stream's initial
        metadata names another leader, move to it (see the module docstring). Ends (its
        runner cleared under the lock, so the next submit starts another) once nothing
        is pending, or after failing everything."""
        on_resp = self._ledger.on_batch if self.batch else self._ledger.on_single
        tries: Attempts | None = None
        while True:
            addr = self._client.router.current
            call = open_stream(self._client.router.channel(addr), self.batch)(self._requests(self._gen))
            err: DoqClientError | None = None
            moving = False
            try:
                if self._client.router.follow(addr, await call.initial_metadata()):
                    moving = True  # a follower relays this stream: end it, reopen on the leader
                    with self._lock:
                        self._gen += 1
                        self._send.notify_all()
                async for resp in call:
                    with self._lock:
                        on_resp(resp)
                        self._results.notify_all()  # window space, flush (once per response)
                        if self._outbox:
                            self._send.notify()  # a frame slot is free
                    tries = None
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            except Refused as r:
                err = r.err
                call.cancel()
            with self._lock:
                self._gen += 1
                self._wake_all()
                if not self._pending():
                    self._runner = None  # closed, or idle: the next submit starts a stream
                    return
                if moving and err is None and not self._ledger:
                    continue  # every frame sent was answered: the rest goes to the leader
                err = err or stream_closed()
                if not is_failover(err):
                    self._fail_all(err)
                    self._runner = None
                    self._wake_all()
                    return
            tries = tries or Attempts(NO_RETRY, self._client.failover, True)
            delay = tries.next_delay(err, await self._client._redirect(err, addr))
            with self._lock:
                if delay is None:
                    self._fail_all(err)
                    self._runner = None
                    self._wake_all()
                    return
                self._requeue(err)
                self._wake_all()
            await asyncio.sleep(delay)

    async def _requests(self, gen: int) -> AsyncIterator[bytes]:
        """The stream's requests: frames as the outbox's head may go out, until the stream
        is replaced (`gen`), or closed with nothing left to send."""
        while True:
            with self._lock:
                while True:
                    if self._gen != gen:
                        return
                    if self._outbox:
                        if self._sendable():
                            break
                    elif self._closing or self._error is not None:
                        return
                    await self._send.wait()
                frame = self._take()
            for request in frame:
                yield request

    def _resolve(self, chunk: Chunk) -> None:  # holds the lock; the caller wakes the waiters
        self._inflight -= chunk.n
        self._settle(chunk)
