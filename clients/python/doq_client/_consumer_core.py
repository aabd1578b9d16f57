"""What the sync and asyncio consumers share: their state and rules, without I/O.

`ConsumerBase` holds a consumer's state (what was received and not handed out, the
settlements pending for the stream, the stream's generation and tag) and the rules that
decide when a request frame goes out and how a settlement of a message from a failed
stream is sent instead (`doq_client.aio_consumer`'s docstring says what they mean for a
user). The consumer (`doq_client.aio_consumer.AsyncConsumer`, and
`doq_client.consumer.Consumer` generated from it) adds the stream, the lock, the waits and
the unary calls (`doq_client._consumer_io`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from doq_client import _ops, stages
from doq_client.errors import DoqClientError, Unavailable, invalid_argument
from doq_client.retry import Attempts
from doq_client.types import Message, MessageRow, build, nack_request, rows_from_columns
from doq_proto.v1 import doq_pb2 as pb

MsgOrId = Message | int
Received = pb.Message | MessageRow  # a message of a received frame
_U64 = 2**64
_ACKS_PER_CALL = 1000  # ids per unary AckBatch of settlements after a failover
ACK_INTERVAL_S = 0.01  # longest an ack waits to be coalesced with others


class Settlements:
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


def stream_ended() -> DoqClientError:
    return Unavailable("the dequeue stream ended before the consumer closed it", retryable=True)


def settlement_ops(queue: str, s: Settlements) -> list[_ops.Op[Any]]:
    """Unary calls that carry settlements meant for a stream that failed."""
    ops: list[_ops.Op[Any]] = [
        _ops.ack_batch(queue, s.acks[i : i + _ACKS_PER_CALL], s.lease_ids[i : i + _ACKS_PER_CALL])
        for i in range(0, len(s.acks), _ACKS_PER_CALL)
    ]
    ops.extend(_ops.nack_pb(n) for n in s.nacks)
    return ops


def release_request(queue: str, m: Received) -> pb.NackRequest:
    return pb.NackRequest(queue_name=queue, id=m.id, lease_id=m.lease_id, release=True)


def frame_messages(resp: Any, batched: bool) -> Sequence[Received]:
    """The messages of a received frame (a batch frame in columns or in messages)."""
    if not batched:
        return (resp,)
    msgs = rows_from_columns(resp.columns) if resp.HasField("columns") else resp.messages
    if stages.observer is not None:
        stages.observer.frame_received(msgs)
    return msgs


class ConsumerBase:
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
            columns=batched,  # frames in columns: no protobuf object per message
        )
        self._pending = Settlements()
        self._ack_due = 0  # acks pending since the last request frame
        self._ack_step = max(1, prefetch // 4)
        # messages received on the current stream / settled by request frames taken for it
        # (each written by one thread): the server's credits are prefetch - the difference
        self._received_n = 0
        self._settled_n = 0
        self._urgent = False  # send what is pending now (see the module docstring)
        self._buffer: deque[Received] = deque()  # received, not handed out yet
        self._closing = False
        self._ending = False  # end the current stream: send what is pending, then half-close
        self._half_closed = False  # the current stream's requests have ended
        self._gen = 0  # stream generation: the request iterator of an older one stops
        self._addr = ""  # where the current stream goes
        self._tries: Attempts | None = None  # the failover in progress
        # The current stream's tag, given to every Message it hands out (None: it has
        # delivered nothing yet); a held message with another tag came from an earlier stream
        # (or from elsewhere) and is settled by a unary call. Lease ids say nothing of order.
        self._tag: object | None = None

    def _wakeup(self) -> None:
        raise NotImplementedError

    def _settle_by_call(self, s: Settlements) -> None:
        """Send settlements of messages from a failed stream by unary calls."""
        raise NotImplementedError

    def _first_frame(self, msgs: Sequence[Received]) -> None:
        """The current stream's first frame is handed out: it gets its tag."""
        self._tag = object()

    def _restart(self) -> Settlements:
        """The stream failed: drop what it sent and was not handed out (their leases end),
        stop its request iterator, and return the settlements it did not send."""
        orphans, self._pending = self._pending, Settlements()
        self._buffer.clear()
        self._ack_due = 0
        self._urgent = False
        self._tag = None
        self._gen += 1
        self._settled_n = self._received_n
        return orphans

    def _acks_added(self, n: int, first: bool) -> None:
        """`n` acks were queued (`first`: nothing was pending): wake the sender when they
        make a batch (`_ack_step`), or so that it starts the interval (`ACK_INTERVAL_S`)."""
        self._ack_due += n
        if self._ack_due >= self._ack_step:
            self._urgent = True
            self._wakeup()
        elif first:
            self._wakeup()

    def _took(self) -> pb.DequeueStreamRequest:
        """The request frame of everything pending (the sender holds the lock)."""
        self._ack_due = 0
        self._urgent = False
        p = self._pending
        self._settled_n += len(p.acks) + len(p.nacks)  # a credit back for each (auto_credit)
        return p.take()

    def _handed_one(self, m: Received) -> None:
        """ack=True: the application was given `m`; ack it (in a coming frame)."""
        p = self._pending
        first = not p
        p.acks.append(m.id)
        p.lease_ids.append(m.lease_id)
        self._acks_added(1, first)

    def _handed(self, msgs: list[Received]) -> None:
        """ack=True: the application was given `msgs` (a frame); ack them."""
        p = self._pending
        first = not p
        p.acks.extend(m.id for m in msgs)
        p.lease_ids.extend(m.lease_id for m in msgs)
        self._acks_added(len(msgs), first)

    def _before_wait(self) -> None:
        """About to wait for messages: send the acks still held back if the server is short
        of credits (see the module docstring); else they wait for their batch or interval."""
        if self._pending and not self._urgent and (self._received_n - self._settled_n) * 2 >= self.prefetch:
            self._urgent = True
            self._wakeup()

    def _check_open(self) -> None:
        if self.auto_ack:
            raise ValueError("an ack=True consumer acks each message as it hands it out")
        if self._closing and self._half_closed:
            raise ValueError("the consumer is closed: settle with the client's ack/nack calls")

    def _add_ack(self, items: Iterable[MsgOrId]) -> Settlements | None:
        """Queue acks: a Message's with its lease id, a bare id's with 0 (any lease).
        A bad id refuses the whole call (nothing is queued). Returns the acks of messages
        from a failed stream (to send by a unary call), or None."""
        if self.auto_ack or self._closing:  # (inline: once per ack call)
            self._check_open()
        tag = self._tag
        if type(items) is tuple and len(items) == 1:  # `ack(msg)`, the common case: inline
            m = items[0]
            if type(m) is Message and m.stream_tag is tag and tag is not None:
                p = self._pending
                first = not (p.acks or p.nacks)
                p.acks.append(m.id)
                p.lease_ids.append(m.lease_id)
                self._ack_due += 1
                if self._ack_due >= self._ack_step:
                    self._urgent = True
                    self._wakeup()
                elif first:
                    self._wakeup()
                return None
        ids: list[int] = []
        lease_ids: list[int] = []
        old: Settlements | None = None
        for m in items:
            if isinstance(m, Message):
                if m.stream_tag is not tag or tag is None:
                    old = old or Settlements()
                    old.acks.append(m.id)
                    old.lease_ids.append(m.lease_id)
                    continue
                ids.append(m.id)
                lease_ids.append(m.lease_id)
            elif type(m) is int and 0 <= m < _U64:
                ids.append(m)
                lease_ids.append(0)
            else:
                raise invalid_argument(
                    f"a message id must be an integer within 0..{_U64 - 1}, not {m!r}", "INVALID_ID"
                )
        if ids:
            first = not self._pending
            self._pending.acks.extend(ids)
            self._pending.lease_ids.extend(lease_ids)
            self._acks_added(len(ids), first)
        return old

    def _add_nack(self, msg: MsgOrId, delay_ms: int, priority: int | None) -> Settlements | None:
        """Queue a nack; returns it instead if the message came from a failed stream."""
        self._check_open()
        lease_id = 0 if isinstance(msg, int) else msg.lease_id
        mid = msg if isinstance(msg, int) else msg.id
        req = nack_request(self.queue, mid, lease_id=lease_id, delay_ms=delay_ms, priority=priority)
        if isinstance(msg, Message) and (msg.stream_tag is not self._tag or self._tag is None):
            old = Settlements()
            old.nacks.append(req)
            return old
        self._pending.nacks.append(req)
        self._urgent = True
        self._wakeup()
        return None

    def _release(self, msgs: Iterable[Received]) -> None:
        """Queue releases of messages the application will not be given (in-stream)."""
        self._pending.nacks.extend(release_request(self.queue, m) for m in msgs)
        self._urgent = True

    def _release_buffer(self) -> None:
        """On close: release what was received but never handed out."""
        self._release(self._buffer)
        self._buffer.clear()
