"""`AsyncConsumer`: a prefetching consumer over DequeueBatchStream (the default) or DequeueStream (`batched=False`).

This file is also the source of the synchronous `doq_client.consumer.Consumer` (threads),
which `clients/python/unasync.py` writes from it: edit this one. Where tasks and threads
differ in more than `await`, `doq_client._consumer_io` has an `*_aio` / `*_sync` pair; the
state and rules both share are `doq_client._consumer_core.ConsumerBase`.

Messages arrive in frames of up to `max_batch` (default 500: a frame carries what one or
more of the stream's dequeues leased, each committed before the frame is sent) and are handed out one at a time (`next()`, iteration) or a frame at
a time (`batches()`). DequeueBatchStream frames come in columns (the stream asks for them:
no protobuf object per message; a `Message`'s `pb` is then built on first use), or as
`Message`s from a server that predates them.

The server keeps at most `prefetch` (>= 1) messages outstanding on the stream: each
message is leased when the server sends it, and each ack or nack in the stream returns
its credit (`auto_credit`). What `ack` means:

- `ack=False` (at-least-once, the default): the application acks (`ack(msg)`) or nacks
  (`nack(msg)`) each message it was given, in the same stream. A message not acked within
  the visibility timeout is delivered again. Acks in the stream are not confirmed one by
  one: an ack lost with the connection means a redelivery, never a loss.
- `ack=True` (ack on hand-over): the consumer acks each message itself when it hands it
  to the application (`next()`, iteration, `batches()`); the application must not ack.
  A message the application was given is removed once that ack is committed: if the
  process dies before (the acks travel in the next request frame), it is delivered again
  when its lease ends. A message the application was not given is never lost.

Either way `close()` hands back, at once, every message the application was not given:
those received but not handed out, and those still arriving, are *released* (a nack that
undoes the delivery: the attempt is not counted and the message is ready again at once).
Close sends pending acks, nacks and releases, half-closes the stream, releases with unary
calls whatever the server had sent before it saw the half-close, and waits up to
`close_grace_s` for the server to settle everything before cancelling the stream. After a
crash (no close), unacked messages come back when their leases end
(`visibility_timeout_ms`).

Acks, nacks, releases and credits are coalesced into request frames: acks go out once
`prefetch // 4` of them are pending, when the consumer is about to wait for messages while
the server is short of credits (at least half of `prefetch` received and not settled in a
frame sent), or `ACK_INTERVAL_S` after the first of them, whichever comes first (so the
server never waits long for a credit, and a consumer acking each message sends a frame per
many acks, also when messages arrive one at a time); nacks and releases go out at once,
with whatever is pending. With `ack=True` the consumer's own
acks follow the same rule. Iterate messages with `for msg in consumer` (or `async for`),
or whole frames with `batches()`.

Failover: when the stream fails with a failover error (the node is not the leader, went
away, or the connection broke; see `doq_client.retry`), the consumer opens it again on the
leader, within the client's `FailoverPolicy.timeout_s` (then `next()` raises the error).
Messages received but not yet handed out are dropped: they are leased on the old stream
and come back when their leases end. Messages the application holds keep their lease
ids: acking or nacking one of them (and the acks and nacks not yet sent when the stream
failed) goes by a unary AckBatch / Nack with its lease id to the leader, as the new
stream's credits do not cover it; each stream tags the messages it hands out, so a message
of an old stream is recognised by its tag (lease ids are random: they say nothing of
order). An ack lost with the connection means a redelivery, never a loss.

Moving to the leader: a stream opened on a follower is relayed by it to the leader, and
its initial metadata names the leader (`doq-leader-grpc`, read once per stream, with its
first frame). The consumer then makes the leader the client's target and, before handing
out anything of that stream, ends it as `close()` would (its messages released: ready at
once, the attempt not counted; pending settlements sent) and opens the next one on the
leader, which delivers the released messages again. Leases belong to the cluster, so
messages held from earlier streams are settled as after a failover.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc

from doq_client._consumer_core import (
    ACK_INTERVAL_S,
    ConsumerBase,
    MsgOrId,
    Received,
    Settlements,
    frame_messages,
    release_request,
    settlement_ops,
    stream_ended,
)
from doq_client._consumer_io import (
    AioWake,
    Calls,
    NoLock,
    drain_aio,
    join_aio,
    read_aio,
    release_aio,
    settle_aio,
)
from doq_client._handle import AsyncClient, client_on
from doq_client.errors import DoqClientError, from_rpc_error
from doq_client.retry import NO_RETRY, Attempts, is_failover
from doq_client.types import Message
from doq_proto.v1 import doq_pb2 as pb

__all__ = ["ACK_INTERVAL_S", "AsyncConsumer"]


class AsyncConsumer(ConsumerBase):
    """asyncio consumer on an `AsyncDoqClient` (or one `grpc.aio.Channel`, reopened on that
    channel only). Use `async with` and `async for`.

    `prefetch` (>= 1): messages outstanding on the stream (received and not yet acked or
    nacked; with ack=True, not yet handed out); `batched` (default): DequeueBatchStream
    with up to `max_batch` messages per frame (False: DequeueStream, one message per
    frame); `visibility_timeout_ms`: lease length (0 = the
    queue's setting); `close_grace_s`: how long `close()` waits for the server to finish.
    """

    def __init__(
        self,
        client: AsyncClient | grpc.aio.Channel,
        queue: str,
        *,
        prefetch: int = 100,
        ack: bool = False,
        batched: bool = True,
        max_batch: int = 500,
        visibility_timeout_ms: int = 0,
        close_grace_s: float = 5.0,
    ) -> None:
        super().__init__(
            queue,
            prefetch=prefetch,
            ack=ack,
            batched=batched,
            max_batch=max_batch,
            visibility_timeout_ms=visibility_timeout_ms,
            close_grace_s=close_grace_s,
        )
        self._client: AsyncClient = client_on(client, "async")
        self._lock = NoLock()
        self._wake = AioWake()  # the current stream's: a new one for each stream
        self._moved = asyncio.Event()  # set when a move has ended the stream it left
        self._call: Any = None
        self._calls: Calls = set()  # unary settlements in progress

    async def __aenter__(self) -> AsyncConsumer:
        self._ensure_started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ensure_started(self) -> None:
        if self._call is None:
            self._open()

    def _open(self) -> None:
        self._addr, stub = self._client.router.pick()
        method = stub.DequeueBatchStream if self.batched else stub.DequeueStream
        self._call = method(self._requests(self._gen, self._wake))

    def _wakeup(self) -> None:
        self._wake.set()

    def _next_stream(self) -> None:
        """The next stream gets a wake-up of its own; the old one's request iterator is
        woken to see it was replaced (`_gen`) and end."""
        with self._lock:
            old, self._wake = self._wake, AioWake()
        old.set()

    def _settle_by_call(self, s: Settlements) -> None:
        for op in settlement_ops(self.queue, s):
            settle_aio(self._calls, functools.partial(self._client._call, op))

    async def _requests(self, gen: int, wake: AioWake) -> AsyncIterator[pb.DequeueStreamRequest]:
        """The stream's requests: what is pending, when it is due (see the module docstring);
        ends (half-close) once ending, or at once when a newer stream replaced this one."""
        yield self._first
        deadline: float | None = None  # when the pending acks go out at the latest
        while True:
            timeout: float | None = None
            with self._lock:
                if self._gen != gen:
                    return
                req: pb.DequeueStreamRequest | None = None
                if self._pending:
                    now = time.monotonic()
                    if self._urgent or self._ending or (deadline is not None and now >= deadline):
                        req = self._took()
                        deadline = None
                    else:
                        deadline = deadline if deadline is not None else now + ACK_INTERVAL_S
                        timeout = deadline - now
                elif self._ending:
                    self._half_closed = True
                    return
            if req is not None:
                yield req
                continue
            await wake.wait(timeout)

    async def _fill(self) -> bool:
        """Read one frame into the buffer; False at the end of the stream (closing).
        Reopens the stream after a failover error, moves it to the leader its first frame
        names (see the module docstring)."""
        self._ensure_started()
        if self._pending and not self._urgent:
            with self._lock:
                self._before_wait()
        while True:
            try:
                resp = await read_aio(self._call)
            except grpc.RpcError as e:
                err = from_rpc_error(e)
            else:
                if resp is not None:
                    self._tries = None
                    msgs = frame_messages(resp, self.batched)
                    if self._tag is None and msgs:  # the stream's first frame
                        if self._client.router.follow(self._addr, await self._call.initial_metadata()):
                            await self._move(msgs)
                            if self._closing:  # closed while moving (from elsewhere)
                                return False
                            continue
                        self._first_frame(msgs)
                    self._received_n += len(msgs)
                    self._buffer.extend(msgs)
                    return True
                if self._closing:
                    return False
                err = stream_ended()
            if self._closing or not is_failover(err):
                raise err
            await self._reconnect(err)
            if self._closing:  # closed while reconnecting (from elsewhere)
                return False

    async def _reconnect(self, err: DoqClientError) -> None:
        tries = self._tries = self._tries or Attempts(NO_RETRY, self._client.failover, True)
        delay = tries.next_delay(err, await self._client._redirect(err, self._addr))
        if delay is None:
            self._tries = None
            raise err
        self._call.cancel()
        with self._lock:
            orphans = self._restart()
        self._next_stream()
        await asyncio.sleep(delay)
        if not self._closing:
            self._open()
        self._settle_by_call(orphans)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Message]:
        while True:
            msg = await self.next()
            if msg is None:
                return
            yield msg

    async def next(self) -> Message | None:
        """The next message, waiting for one; None when the stream ended or is closing."""
        while not self._buffer:
            if self._closing or not await self._fill():
                return None
        m = self._buffer.popleft()
        if self.auto_ack:
            with self._lock:
                self._handed_one(m)
        return Message(m, self._tag)

    async def batches(self) -> AsyncIterator[list[Message]]:
        """Yield messages a received frame at a time."""
        while True:
            if not self._buffer and (self._closing or not await self._fill()):
                return
            got = list(self._buffer)
            self._buffer.clear()
            if self.auto_ack:
                with self._lock:
                    self._handed(got)
            tag = self._tag
            yield [Message(m, tag) for m in got]

    def ack(self, *messages: MsgOrId) -> None:
        """Acknowledge messages (or ids) through the stream; returns at once."""
        with self._lock:  # as ack_many (not calling it: one call less per message)
            old = self._add_ack(messages)
        if old is not None:
            self._settle_by_call(old)

    def ack_many(self, messages: Iterable[MsgOrId]) -> None:
        with self._lock:
            old = self._add_ack(messages)
        if old is not None:
            self._settle_by_call(old)

    def nack(self, message: MsgOrId, *, delay_ms: int = 0, priority: int | None = None) -> None:
        """Return a message to the queue through the stream (after `delay_ms`, re-prioritised)."""
        with self._lock:
            old = self._add_nack(message, delay_ms, priority)
        if old is not None:
            self._settle_by_call(old)

    async def _move(self, msgs: Sequence[Received]) -> None:
        """`msgs`, the current stream's first frame, came through a follower that named the
        leader (now the client's target): nothing of this stream was handed out, so release
        it all and end the stream (`_end_stream`), then open the next one on the leader."""
        with self._lock:
            self._buffer.extend(msgs)
            self._ending = True
            self._moved = asyncio.Event()
        try:
            await self._end_stream()
        finally:
            self._moved.set()
        with self._lock:
            if self._closing:
                return
            self._ending = self._half_closed = False
            self._gen += 1  # a request iterator of the old stream still running stops
            self._settled_n = self._received_n  # the next stream starts with all its credits
        self._next_stream()
        self._open()

    async def close(self) -> None:
        """Hand back every message not given to the application, send pending settlements,
        end the stream (see the module docstring). Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._call is None:
                return
            moving = self._ending  # a move (elsewhere) is ending the stream; it opens no other
            self._ending = True
        if moving:
            await self._moved.wait()
        else:
            await self._end_stream()
        await join_aio(self._calls, self.close_grace_s)

    async def _end_stream(self) -> None:
        """End the current stream (`_ending` set): release what was received and not handed
        out, send pending settlements and releases, half-close; release what still arrives
        (in the stream, or after the half-close by unary calls: `release_aio`) until the
        server ends it, or `close_grace_s` passed (then it is cancelled)."""
        with self._lock:
            self._release_buffer()
        self._wakeup()
        late: list[Received] = []  # arrived after the half-close
        await drain_aio(self._call, functools.partial(self._drained, late), self.close_grace_s)
        if late:
            try:
                stub = self._client.router.stub(self._addr)
            except ValueError:  # the client was closed: their leases end instead
                return
            requests = [release_request(self.queue, m) for m in late]
            await release_aio(self._calls, stub, requests, self.close_grace_s)

    def _drained(self, late: list[Received], resp: Any) -> None:
        """A frame of a stream being ended: release its messages in the stream, or by unary
        calls (`late`) if its requests ended already."""
        got = frame_messages(resp, self.batched)
        with self._lock:
            if self._half_closed:
                late.extend(got)
                return
            self._release(got)
        self._wakeup()
