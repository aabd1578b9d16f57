"""What the sync and asyncio producers share: their state and rules, without I/O or waits.

`ProducerCore` keeps a producer's chunks (what one submit call holds) from submission to
result: the outbox (not yet sent), the ledger (sent, waiting for answers, `_ledger`), the
window count, and the rules of the module doc of `doq_client.producer`: when the outbox's
head may go out (`_sendable`), how a frame is taken (`_take`), what goes back after a
stream failure (`_requeue`), how everything fails at once (`_fail_all`), how a chunk's
future is settled (`_settle`). The producers (`doq_client.aio_producer.AsyncProducer`,
and `doq_client.producer.Producer` generated from it) add the stream, the waits and, for
threads, the lock they call these under.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from doq_client import stages
from doq_client._ledger import (
    Chunk,
    Frame,
    Ledger,
    Stamper,
    batch_frame,
    columns_frame,
    take_frame,
)
from doq_client.errors import DoqClientError, Internal, Unavailable
from doq_client.types import Content, enqueue_request, to_bytes
from doq_proto.v1 import doq_pb2 as pb

_STREAM = "/doq.v1.DOQ/EnqueueStream"
_BATCH_STREAM = "/doq.v1.DOQ/EnqueueBatchStream"
DEFAULT_BATCH = 1000  # messages per frame at most (coalescing producers)
DEFAULT_MAX_FRAME_BYTES = 4 << 20  # message contents per frame at most (a frame has >= 1 chunk)
FRAMES_IN_FLIGHT = 4  # unanswered frames before messages wait to be coalesced...
FEW_IN_FLIGHT = 32  # ...unless they carry fewer unanswered messages than this
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1  # a priority's range (EnqueueRequest.priority: int64)


def open_stream(channel: Any, batch: int) -> Any:
    """The stream method; requests go out as the bytes the ledger keeps (no serializer)."""
    if batch:
        return channel.stream_stream(
            _BATCH_STREAM, response_deserializer=pb.EnqueueBatchResponse.FromString
        )
    return channel.stream_stream(_STREAM, response_deserializer=pb.EnqueueResponse.FromString)


def stream_closed() -> DoqClientError:
    return Unavailable(
        "the enqueue stream ended before this message was acknowledged", retryable=True
    )


def broken(e: Exception) -> DoqClientError:
    return Internal(f"the producer's stream failed: {e!r}", code=grpc.StatusCode.INTERNAL)


def _fail(chunk: Chunk, err: DoqClientError, resolve: Callable[[Chunk], None]) -> None:
    chunk.outcomes.extend([err] * chunk.left())
    resolve(chunk)


class ProducerCore:
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
        """One message as a chunk (columns when coalescing; validated like `enqueue_request`).
        A group of ASCII text and an int64 priority (what `enqueue_request` would accept)
        go straight into the columns, with no `EnqueueRequest` built and read back."""
        keyed = bool(group or priority)
        if (not self.batch or type(queue) is not str or metadata or delay_ms
                or keyed and not (type(group) is str and type(priority) is int and group.isascii()
                                  and _I64_MIN <= priority <= _I64_MAX)):
            req = enqueue_request(queue, content, group=group, priority=priority, metadata=metadata,
                                  dedup_id=dedup_id, delay_ms=delay_ms)
            return self._requests_chunk([req], True)
        body = content if type(content) is bytes else to_bytes(content)
        did = dedup_id or self._stamper.next_id()
        return Chunk.one(queue, body, did, group, priority)

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
            if stages.observer is not None:
                stages.observer.frame_taken([c for chunk in chunks for c in chunk.contents])
            self._queued -= size
            if chunks[0].queue is not None:
                data, frame = columns_frame(chunks)
            else:
                data, frame = batch_frame(chunks), Frame(size, False, None)
            self._ledger.sent(chunks, frame)
            return [data]
        chunk = self._outbox.popleft()
        if stages.observer is not None:
            stages.observer.frame_taken(chunk.contents)
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


