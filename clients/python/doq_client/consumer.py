"""Prefetching consumers over DequeueStream (`batched=False`) or DequeueBatchStream.

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

Acks, nacks, releases and credits are coalesced: whatever is pending when the stream can
write goes into one request frame (with `ack=True`, the consumer's own acks are sent every
`prefetch // 4` messages and before it waits for more). Iterate messages with
`for msg in consumer` (or `async for`), or whole frames with `batches()`.
"""

from __future__ import annotations

import asyncio
import queue as queue_mod
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import grpc

from doq_client.errors import from_rpc_error, invalid_argument
from doq_client.types import Message, build, nack_request
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

_MsgOrId = Message | int
_U64 = 2**64


class _Settlements:
    """Pending acks (one lease id each, 0 = any), nacks and releases, merged into one
    `DequeueStreamRequest`."""

    __slots__ = ("acks", "lease_ids", "nacks")

    def __init__(self) -> None:
        self.acks: list[int] = []
        self.lease_ids: list[int] = []
        self.nacks: list[pb.NackRequest] = []

    def __bool__(self) -> bool:
        return bool(self.acks or self.nacks)

    def take(self) -> pb.DequeueStreamRequest:
        req = pb.DequeueStreamRequest(ack_ids=self.acks, ack_lease_ids=self.lease_ids, nacks=self.nacks)
        self.acks, self.lease_ids, self.nacks = [], [], []
        return req


def _release_request(queue: str, m: pb.Message) -> pb.NackRequest:
    return pb.NackRequest(queue_name=queue, id=m.id, lease_id=m.lease_id, release=True)


def _frame_messages(resp: Any, batched: bool) -> Sequence[pb.Message]:
    return resp.messages if batched else (resp,)


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
        if prefetch < 1:  # beyond uint32: `build` below refuses it
            raise invalid_argument(f"prefetch must be an integer within 1..{2**32 - 1}, not {prefetch}")
        self.queue = queue
        self.prefetch = prefetch
        self.auto_ack = ack
        self.batched = batched
        self.close_grace_s = close_grace_s
        # On the wire the stream always leases (ack=False), so that what was not handed
        # to the application can be released; ack=True acks at hand-over (see above).
        self._first = build(
            pb.DequeueStreamRequest,
            queue_name=queue,
            ack=False,
            prefetch=prefetch,
            visibility_timeout_ms=visibility_timeout_ms,
            max_batch=max_batch,
            auto_credit=True,
        )
        self._pending = _Settlements()
        self._auto_due = 0  # hand-over acks pending since the last wakeup
        self._auto_step = max(1, prefetch // 4)
        self._buffer: deque[pb.Message] = deque()  # received, not handed out yet
        self._closing = False
        self._half_closed = False  # the request stream has ended: settle by unary calls

    def _wakeup(self) -> None:
        raise NotImplementedError

    def _handed_one(self, m: pb.Message) -> None:
        """ack=True: the application was given `m`; ack it (in a coming frame)."""
        p = self._pending
        p.acks.append(m.id)
        p.lease_ids.append(m.lease_id)
        self._auto_due += 1
        if self._auto_due >= self._auto_step:
            self._auto_due = 0
            self._wakeup()

    def _handed(self, msgs: list[pb.Message]) -> None:
        """ack=True: the application was given `msgs` (a frame); ack them."""
        p = self._pending
        p.acks.extend(m.id for m in msgs)
        p.lease_ids.extend(m.lease_id for m in msgs)
        self._auto_due += len(msgs)
        if self._auto_due >= self._auto_step:
            self._auto_due = 0
            self._wakeup()

    def _before_wait(self) -> None:
        """About to wait for messages: send the hand-over acks still held back."""
        if self._auto_due:
            self._auto_due = 0
            self._wakeup()

    def _check_open(self) -> None:
        if self.auto_ack:
            raise ValueError("an ack=True consumer acks each message as it hands it out")
        if self._half_closed:
            raise ValueError("the consumer is closed: settle with the client's ack/nack calls")

    def _add_ack(self, items: Iterable[_MsgOrId]) -> None:
        """Queue acks: a Message's with its lease id, a bare id's with 0 (any lease).
        A bad id refuses the whole call (nothing is queued)."""
        self._check_open()
        ids: list[int] = []
        lease_ids: list[int] = []
        for m in items:
            if isinstance(m, Message):
                ids.append(m.id)
                lease_ids.append(m.lease_id)
            elif type(m) is int and 0 <= m < _U64:
                ids.append(m)
                lease_ids.append(0)
            else:
                raise invalid_argument(
                    f"a message id must be an integer within 0..{_U64 - 1}, not {m!r}", "INVALID_ID"
                )
        self._pending.acks.extend(ids)
        self._pending.lease_ids.extend(lease_ids)
        self._wakeup()

    def _add_nack(self, msg: _MsgOrId, delay_ms: int, priority: int | None) -> None:
        self._check_open()
        lease_id = 0 if isinstance(msg, int) else msg.lease_id
        mid = msg if isinstance(msg, int) else msg.id
        self._pending.nacks.append(
            nack_request(self.queue, mid, lease_id=lease_id, delay_ms=delay_ms, priority=priority)
        )
        self._wakeup()

    def _release(self, msgs: Iterable[pb.Message]) -> None:
        """Queue releases of messages the application will not be given (in-stream)."""
        self._pending.nacks.extend(_release_request(self.queue, m) for m in msgs)

    def _release_buffer(self) -> None:
        """On close: release what was received but never handed out."""
        self._release(self._buffer)
        self._buffer.clear()


class AsyncConsumer(_ConsumerBase):
    """asyncio consumer on a `grpc.aio.Channel`. Use `async with` and `async for`.

    `prefetch` (>= 1): messages outstanding on the stream (received and not yet acked or
    nacked; with ack=True, not yet handed out); `batched`: use DequeueBatchStream with up
    to `max_batch` messages per frame; `visibility_timeout_ms`: lease length (0 = the
    queue's setting); `close_grace_s`: how long `close()` waits for the server to finish.
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
            if self._pending:
                yield self._pending.take()
            elif self._closing:
                self._half_closed = True
                return
            else:
                self._wake.clear()
                await self._wake.wait()

    async def _fill(self) -> bool:
        """Read one frame into the buffer; False at the end of the stream."""
        self._ensure_started()
        self._before_wait()
        try:
            resp = await self._call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if resp is grpc.aio.EOF:
            return False
        self._buffer.extend(_frame_messages(resp, self.batched))
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
        """The next message, waiting for one; None when the stream ended or is closing."""
        while not self._buffer:
            if self._closing or not await self._fill():
                return None
        m = self._buffer.popleft()
        if self.auto_ack:
            self._handed_one(m)
        return Message(m)

    async def batches(self) -> AsyncIterator[list[Message]]:
        """Yield messages a received frame at a time."""
        while True:
            if not self._buffer and (self._closing or not await self._fill()):
                return
            got = list(self._buffer)
            self._buffer.clear()
            if self.auto_ack:
                self._handed(got)
            yield [Message(m) for m in got]

    def ack(self, *messages: _MsgOrId) -> None:
        """Acknowledge messages (or ids) through the stream; returns at once."""
        self._add_ack(messages)

    def ack_many(self, messages: Iterable[_MsgOrId]) -> None:
        self._add_ack(messages)

    def nack(self, message: _MsgOrId, *, delay_ms: int = 0, priority: int | None = None) -> None:
        """Return a message to the queue through the stream (after `delay_ms`, re-prioritised)."""
        self._add_nack(message, delay_ms, priority)

    async def close(self) -> None:
        """Hand back every message not given to the application, send pending settlements,
        end the stream (see the module docstring). Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._call is None:
            return
        self._release_buffer()
        self._wake.set()
        call = self._call
        late: list[pb.Message] = []  # arrived after the half-close

        async def drain() -> None:
            while (resp := await call.read()) is not grpc.aio.EOF:
                got = _frame_messages(resp, self.batched)
                if self._half_closed:
                    late.extend(got)
                else:
                    self._release(got)
                    self._wake.set()

        try:
            await asyncio.wait_for(drain(), self.close_grace_s)
        except (TimeoutError, grpc.RpcError):
            pass
        finally:
            call.cancel()
        if late:
            reqs = [_release_request(self.queue, m) for m in late]
            await asyncio.gather(
                *(self._stub.Nack(r, timeout=self.close_grace_s) for r in reqs), return_exceptions=True
            )


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
        """Runs in a gRPC thread: sends what is pending; ends (half-close) once closing."""
        yield self._first
        while True:
            with self._lock:
                if self._pending:
                    req: pb.DequeueStreamRequest | None = self._pending.take()
                elif self._closing:
                    self._half_closed = True
                    return
                else:
                    req = None
            if req is None:
                self._signal.get()
            else:
                yield req

    def _fill(self) -> bool:
        self._ensure_started()
        assert self._responses is not None
        if self._auto_due:
            with self._lock:
                self._before_wait()
        try:
            resp = next(self._responses)
        except StopIteration:
            return False
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        self._buffer.extend(_frame_messages(resp, self.batched))
        return True

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.next()
            if msg is None:
                return
            yield msg

    def next(self) -> Message | None:
        """The next message, blocking until one arrives; None when the stream ended or is closing."""
        while not self._buffer:
            if self._closing or not self._fill():
                return None
        m = self._buffer.popleft()
        if self.auto_ack:
            with self._lock:
                self._handed_one(m)
        return Message(m)

    def batches(self) -> Iterator[list[Message]]:
        """Yield messages a received frame at a time."""
        while True:
            if not self._buffer and (self._closing or not self._fill()):
                return
            got = list(self._buffer)
            self._buffer.clear()
            if self.auto_ack:
                with self._lock:
                    self._handed(got)
            yield [Message(m) for m in got]

    def ack(self, *messages: _MsgOrId) -> None:
        """Acknowledge messages (or ids) through the stream; returns at once."""
        self._add_ack(messages)

    def ack_many(self, messages: Iterable[_MsgOrId]) -> None:
        self._add_ack(messages)

    def nack(self, message: _MsgOrId, *, delay_ms: int = 0, priority: int | None = None) -> None:
        """Return a message to the queue through the stream (after `delay_ms`, re-prioritised)."""
        self._add_nack(message, delay_ms, priority)

    def close(self) -> None:
        """Hand back every message not given to the application, send pending settlements,
        end the stream (see the module docstring). Idempotent; call it from the thread that
        iterates."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._call is None:
                return
            self._release_buffer()
        self._wakeup()
        call = self._call
        assert self._responses is not None
        late: list[pb.Message] = []  # arrived after the half-close
        timer = threading.Timer(self.close_grace_s, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            for resp in self._responses:
                got = _frame_messages(resp, self.batched)
                with self._lock:
                    if self._half_closed:
                        late.extend(got)
                        continue
                    self._release(got)
                self._wakeup()
        except grpc.RpcError:
            pass
        finally:
            timer.cancel()
            call.cancel()
        futures = [self._stub.Nack.future(_release_request(self.queue, m), timeout=self.close_grace_s) for m in late]
        for f in futures:
            try:
                f.result()
            except grpc.RpcError:
                pass  # e.g. its lease already ended: it is back in the queue anyway
