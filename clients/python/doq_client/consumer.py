"""Prefetching consumers over DequeueStream (`batched=False`) or DequeueBatchStream.

The server keeps at most `prefetch` messages outstanding on the stream:
- `ack=False` (at-least-once, default): each message is leased; `ack(msg)` / `nack(msg)`
  travel in the same stream and give the credit back (`auto_credit`), so `prefetch` is
  the maximum of unacknowledged messages. A message not acked within the visibility
  timeout is delivered again. Acks in the stream are not confirmed one by one: an ack
  that is lost (connection failure) means a redelivery, never a loss.
- `ack=True` (at-most-once): messages are removed on delivery; credits are returned as
  the application takes messages from the consumer.

Acks, nacks and credits are coalesced: whatever is pending when the stream can write goes
into one request frame. `close()` nacks messages received but not yet handed out (ack=False),
sends what is pending, half-closes the stream and waits up to `close_grace_s` for the server
to finish before cancelling. Iterate messages with `for msg in consumer` (or `async for`),
or whole frames with `batches()`.
"""

from __future__ import annotations

import asyncio
import queue as queue_mod
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import grpc

from doq_client.errors import from_rpc_error
from doq_client.types import Message, nack_request
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

_MsgOrId = Message | int


def _ids(items: Iterable[_MsgOrId]) -> list[int]:
    return [m if isinstance(m, int) else m.id for m in items]


class _Settlements:
    """Pending acks, nacks and credits, merged into one `DequeueStreamRequest`."""

    __slots__ = ("acks", "nacks", "credits")

    def __init__(self) -> None:
        self.acks: list[int] = []
        self.nacks: list[pb.NackRequest] = []
        self.credits = 0

    def __bool__(self) -> bool:
        return bool(self.acks or self.nacks or self.credits)

    def take(self) -> pb.DequeueStreamRequest:
        req = pb.DequeueStreamRequest(ack_ids=self.acks, nacks=self.nacks, credits=self.credits)
        self.acks, self.nacks, self.credits = [], [], 0
        return req


class _ConsumerBase:
    def __init__(
        self,
        queue: str,
        *,
        prefetch: int,
        ack: bool,
        batched: bool,
        max_batch: int,
        visibility_timeout_ms: int,
        close_grace_s: float,
    ) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        self.queue = queue
        self.prefetch = prefetch
        self.auto_ack = ack
        self.batched = batched
        self.close_grace_s = close_grace_s
        self._first = pb.DequeueStreamRequest(
            queue_name=queue,
            ack=ack,
            prefetch=prefetch,
            visibility_timeout_ms=visibility_timeout_ms,
            max_batch=max_batch,
            auto_credit=not ack,
        )
        self._pending = _Settlements()
        self._credit_due = 0
        self._credit_step = max(1, prefetch // 4)
        self._buffer: deque[pb.Message] = deque()  # received, not handed out yet
        self._closing = False

    def _took(self, n: int) -> None:
        """The application took `n` messages: in ack=True mode their credits go back."""
        if self.auto_ack:
            self._credit_due += n
            if self._credit_due >= self._credit_step:
                self._pending.credits += self._credit_due
                self._credit_due = 0
                self._wakeup()

    def _wakeup(self) -> None:
        raise NotImplementedError

    def _add_ack(self, items: Iterable[_MsgOrId]) -> None:
        if self.auto_ack:
            raise ValueError("messages of an ack=True consumer are already removed")
        self._pending.acks.extend(_ids(items))
        self._wakeup()

    def _add_nack(self, msg: _MsgOrId, delay_ms: int, priority: int | None) -> None:
        if self.auto_ack:
            raise ValueError("messages of an ack=True consumer are already removed")
        lease_id = 0 if isinstance(msg, int) else msg.lease_id
        mid = msg if isinstance(msg, int) else msg.id
        self._pending.nacks.append(
            nack_request(self.queue, mid, lease_id=lease_id, delay_ms=delay_ms, priority=priority)
        )
        self._wakeup()

    def _release_buffer(self) -> None:
        """On close: give back messages received but never handed to the application."""
        if not self.auto_ack:
            for m in self._buffer:
                self._pending.nacks.append(nack_request(self.queue, m.id, lease_id=m.lease_id))
        self._buffer.clear()


class AsyncConsumer(_ConsumerBase):
    """asyncio consumer on a `grpc.aio.Channel`. Use `async with` and `async for`.

    `prefetch`: messages outstanding (unacked, or with ack=True untaken); `batched`: use
    DequeueBatchStream with up to `max_batch` messages per frame; `visibility_timeout_ms`:
    lease length (0 = the queue's setting).
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        queue: str,
        *,
        prefetch: int = 100,
        ack: bool = False,
        batched: bool = False,
        max_batch: int = 100,
        visibility_timeout_ms: int = 0,
        close_grace_s: float = 0.5,
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
        self._stub = pb_grpc.DOQStub(channel)
        self._wake = asyncio.Event()
        self._call: Any = None

    async def __aenter__(self) -> AsyncConsumer:
        self._ensure_started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ensure_started(self) -> None:
        if self._call is None:
            method = self._stub.DequeueBatchStream if self.batched else self._stub.DequeueStream
            self._call = method(self._requests())

    def _wakeup(self) -> None:
        self._wake.set()

    async def _requests(self) -> AsyncIterator[pb.DequeueStreamRequest]:
        yield self._first
        while True:
            while not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
            yield self._pending.take()

    async def _fill(self) -> bool:
        """Read one frame into the buffer; False at the end of the stream."""
        self._ensure_started()
        try:
            resp = await self._call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if resp is grpc.aio.EOF:
            return False
        if self.batched:
            self._buffer.extend(resp.messages)
        else:
            self._buffer.append(resp)
        return True

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Message]:
        while True:
            msg = await self.next()
            if msg is None:
                return
            yield msg

    async def next(self) -> Message | None:
        """The next message, waiting for one; None when the stream ended."""
        while not self._buffer:
            if self._closing or not await self._fill():
                return None
        self._took(1)
        return Message(self._buffer.popleft())

    async def batches(self) -> AsyncIterator[list[Message]]:
        """Yield messages a received frame at a time."""
        while True:
            if not self._buffer and (self._closing or not await self._fill()):
                return
            out = [Message(m) for m in self._buffer]
            self._buffer.clear()
            self._took(len(out))
            yield out

    def ack(self, *messages: _MsgOrId) -> None:
        """Acknowledge messages (or ids) through the stream; returns at once."""
        self._add_ack(messages)

    def ack_many(self, messages: Iterable[_MsgOrId]) -> None:
        self._add_ack(messages)

    def nack(self, message: _MsgOrId, *, delay_ms: int = 0, priority: int | None = None) -> None:
        """Return a message to the queue through the stream (after `delay_ms`, re-prioritised)."""
        self._add_nack(message, delay_ms, priority)

    async def close(self) -> None:
        """Release unread messages, send pending settlements, end the stream. Idempotent."""
        if self._closing or self._call is None:
            self._closing = True
            return
        self._release_buffer()
        self._closing = True
        self._wake.set()
        call = self._call

        async def drain() -> None:
            while await call.read() is not grpc.aio.EOF:
                pass

        try:
            await asyncio.wait_for(drain(), self.close_grace_s)
        except (TimeoutError, grpc.RpcError, asyncio.CancelledError):
            pass
        finally:
            call.cancel()


class Consumer(_ConsumerBase):
    """Synchronous consumer on a `grpc.Channel`; iterate it in one thread.

    `ack`/`nack` may be called from any thread. Parameters as for `AsyncConsumer`.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        queue: str,
        *,
        prefetch: int = 100,
        ack: bool = False,
        batched: bool = False,
        max_batch: int = 100,
        visibility_timeout_ms: int = 0,
        close_grace_s: float = 0.5,
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
        self._stub = pb_grpc.DOQStub(channel)
        self._lock = threading.Lock()
        self._signal: queue_mod.SimpleQueue[None] = queue_mod.SimpleQueue()
        self._call: Any = None
        self._responses: Iterator[Any] | None = None

    def __enter__(self) -> Consumer:
        self._ensure_started()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_started(self) -> None:
        if self._call is None:
            method = self._stub.DequeueBatchStream if self.batched else self._stub.DequeueStream
            self._call = method(self._requests())
            self._responses = iter(self._call)

    def _wakeup(self) -> None:
        self._signal.put(None)

    def _add_ack(self, items: Iterable[_MsgOrId]) -> None:
        with self._lock:
            super()._add_ack(items)

    def _add_nack(self, msg: _MsgOrId, delay_ms: int, priority: int | None) -> None:
        with self._lock:
            super()._add_nack(msg, delay_ms, priority)

    def _requests(self) -> Iterator[pb.DequeueStreamRequest]:
        yield self._first
        while True:
            self._signal.get()
            with self._lock:
                if self._pending:
                    req: pb.DequeueStreamRequest | None = self._pending.take()
                elif self._closing:
                    return
                else:
                    req = None
            if req is not None:
                yield req

    def _fill(self) -> bool:
        self._ensure_started()
        assert self._responses is not None
        try:
            resp = next(self._responses)
        except StopIteration:
            return False
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if self.batched:
            self._buffer.extend(resp.messages)
        else:
            self._buffer.append(resp)
        return True

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.next()
            if msg is None:
                return
            yield msg

    def next(self) -> Message | None:
        """The next message, blocking until one arrives; None when the stream ended."""
        while not self._buffer:
            if self._closing or not self._fill():
                return None
        with self._lock:
            self._took(1)
        return Message(self._buffer.popleft())

    def batches(self) -> Iterator[list[Message]]:
        """Yield messages a received frame at a time."""
        while True:
            if not self._buffer and (self._closing or not self._fill()):
                return
            out = [Message(m) for m in self._buffer]
            self._buffer.clear()
            with self._lock:
                self._took(len(out))
            yield out

    def ack(self, *messages: _MsgOrId) -> None:
        """Acknowledge messages (or ids) through the stream; returns at once."""
        self._add_ack(messages)

    def ack_many(self, messages: Iterable[_MsgOrId]) -> None:
        self._add_ack(messages)

    def nack(self, message: _MsgOrId, *, delay_ms: int = 0, priority: int | None = None) -> None:
        """Return a message to the queue through the stream (after `delay_ms`, re-prioritised)."""
        self._add_nack(message, delay_ms, priority)

    def close(self) -> None:
        """Release unread messages, send pending settlements, end the stream. Idempotent."""
        if self._closing or self._call is None:
            self._closing = True
            return
        with self._lock:
            self._release_buffer()
            self._closing = True
        self._wakeup()
        call = self._call
        timer = threading.Timer(self.close_grace_s, call.cancel)
        timer.daemon = True
        timer.start()
        deadline = time.monotonic() + self.close_grace_s + 1
        try:
            assert self._responses is not None
            for _ in self._responses:
                if time.monotonic() > deadline:
                    break
        except grpc.RpcError:
            pass
        finally:
            timer.cancel()
            call.cancel()
