"""Dequeue stream sessions: the queue semantics of DequeueStream / DequeueBatchStream.

Transport-free: a session takes typed requests (`StreamOpen`, `Settlement`) and yields
typed frames of messages (producer streams: `doq.service.pipeline`); the gRPC adapter only maps protobuf to them and back.
Everything a session holds for its client is bounded by the door's `Limits` (see
`doq.service.limits.Limits`): a request beyond a bound is refused (INVALID_ARGUMENT), and
at the bound of what is in flight the session stops reading the client's requests, so
the transport's flow control holds the client back.

Every task a session starts ends with it (also when the call is cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from doq.errors import DoqError, InvalidArgument
from doq.node.base import Node, wait_for_result
from doq.queues.commands import Ack, Dequeue, Nack
from doq.queues.model import MessageView
from doq.service import limits as v
from doq.service import outcomes
from doq.service.door import INTERNAL, Action, Caller, Door
from doq.service.held import NO_LEASE, Held
from doq.service.leases import Leases
from doq.service.longpoll import LongPolls, StandingPoll
from doq.service.pipeline import finish


class SessionHost(Protocol):
    """What a dequeue session uses of its facade (`doq.service.api.QueueService`)."""

    node: Node
    door: Door
    leases: Leases
    long_polls: LongPolls

    @property
    def limits(self) -> v.Limits: ...

    async def take(
        self, queue: str, max_messages: int, *, ack: bool, wait_ms: int, visibility_timeout_ms: int,
        stop_waiting: asyncio.Event | None,
    ) -> list[MessageView]: ...

log = logging.getLogger(__name__)

LONG_POLL_MS = 10_000
OWN_DEQUEUES = 8  # dequeues a leasing stream with prefetch proposes itself, in flight at once


@dataclass(frozen=True, slots=True)
class StreamOpen:
    """The first request of a dequeue stream: the queue and the mode.

    `prefetch` 0 is push mode (no credits: bounded by the transport's flow control);
    `max_batch` 0 takes the stream kind's default."""

    queue: str
    ack: bool = False
    prefetch: int = 0
    max_batch: int = 0
    visibility_timeout_ms: int = 0
    auto_credit: bool = False
    columns: bool = False


@dataclass(frozen=True, slots=True)
class NackItem:
    id: int
    lease_id: int = 0
    delay_ms: int = 0
    priority: int | None = None
    release: bool = False


@dataclass(slots=True)
class Settlement:
    """A later request of a dequeue stream: acks (with their leases: none, or one per
    id), nacks and releases, and explicit credits."""

    ack_ids: list[int] = field(default_factory=list)
    ack_lease_ids: list[int] = field(default_factory=list)
    nacks: list[NackItem] = field(default_factory=list)
    credits: int = 0


def _refused(fut: asyncio.Future[object]) -> bool:
    """A done dequeue future that failed or was refused by the machine."""
    return fut.cancelled() or fut.exception() is not None or isinstance(fut.result(), DoqError)


class DequeueSession:
    """One DequeueStream / DequeueBatchStream call; each state is a method.

    - `open` checks the first request (queue, mode, prefetch, max_batch) against the
      limits and the queue's existence.
    - `settle` handles one later request: acks and nacks of messages the state holds are
      proposed without waiting (pipelined); those of messages it knows are gone are
      dropped without a log entry (see `doq.service.leases`); credits are added
      (`auto_credit`: one per ack or nack, returned as soon as the request arrives, so the
      next dequeue shares a commit with the ack; never beyond `prefetch`).
      `read_requests` (the reader task) settles every request until the client
      half-closes, and stops reading while `max_stream_pending_acks` settlements are
      proposed and not committed (the client is held by flow control meanwhile).
    - `pump` dequeues as credits allow (no limit with prefetch 0) and yields non-empty
      frames until the half-close; a frame dequeued in lease mode after the half-close is
      released (`release`), not sent. In lease mode the session waits as a `StandingPoll`,
      so each enqueue arriving while it has credits leases for it in its own commit.
    - `drain` waits for every proposed settlement; `close` ends the reader task.
    A refused request (`error`) stops the session like a half-close; the call then ends
    with that status.
    """

    def __init__(self, api: SessionHost, first: StreamOpen, batch_default: int,
                 caller: Caller | None = None) -> None:
        self.api = api
        self.limits = api.limits
        self.counters = (caller or INTERNAL).counters
        self.queue = first.queue
        self.ack = first.ack
        self.visibility_timeout_ms = first.visibility_timeout_ms
        self.auto_credit = first.auto_credit
        self.credit_mode = first.prefetch > 0
        self.prefetch = first.prefetch
        self.credits = first.prefetch
        self.max_batch = max(1, min(first.max_batch or batch_default, self.limits.max_batch_messages))
        self.columns = first.columns  # DequeueBatchStream: frames in MessageBatch.columns
        self.wake = asyncio.Event()  # credits arrived or the client half-closed
        self.half_closed = asyncio.Event()
        self.error: DoqError | None = None
        self.settles: dict[asyncio.Future[object], int] = {}  # proposed settlement: ids in it
        self.pending = 0  # ids in `settles`
        self._below_bound = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.dropped = 0  # settlements of messages known to be gone, answered without an entry
        self.held = Held()  # what this stream delivered: it settles only those (doq.service.held)

    @staticmethod
    def check_open(first: StreamOpen, limits: v.Limits) -> None:
        """Raises InvalidArgument if the first request is beyond the node's limits."""
        v.check_queue_name(first.queue)
        v.check_visibility_timeout_ms(first.visibility_timeout_ms)
        if first.prefetch > limits.max_stream_prefetch:
            raise InvalidArgument(
                f"prefetch {first.prefetch} exceeds this node's limit of {limits.max_stream_prefetch}",
                reason="INVALID_PREFETCH")
        if first.max_batch > limits.max_batch_messages:
            raise InvalidArgument(
                f"max_batch {first.max_batch} exceeds this node's limit of {limits.max_batch_messages}",
                reason="INVALID_MAX_BATCH")

    @classmethod
    async def open(cls, api: SessionHost, first: StreamOpen, batch_default: int,
                   caller: Caller | None = None) -> DequeueSession:
        """The session of `first`, admitted by the door as a DEQUEUE of its queue and
        checked (the queue must exist). Raises DoqError."""
        api.door.admit(caller or INTERNAL, Action.DEQUEUE, first.queue)
        cls.check_open(first, api.limits)
        await api.node.read_barrier()
        api.node.state.get_queue(first.queue)  # raises QueueNotFound
        return cls(api, first, batch_default, caller)

    def start(self, requests: AsyncIterator[Settlement]) -> None:
        self._reader = asyncio.create_task(self.read_requests(requests), name=f"doq.DequeueSession:{self.queue}")

    # -- settle ---------------------------------------------------------------------------
    def add_credits(self, n: int) -> None:
        if n > 0:
            self.credits += n
            self.wake.set()

    def settle(self, req: Settlement) -> list[int]:
        """Propose this request's acks and nacks without waiting; add its credits. Returns
        the ack ids the state had not assigned yet: the caller settles them after a read
        barrier (`settle_unborn`).

        Raises InvalidArgument before proposing anything if `ack_lease_ids` is neither
        empty nor as long as `ack_ids` (INVALID_LEASE_IDS), if the request carries more
        acks and nacks than `max_batch_messages` (BATCH_TOO_LARGE) or explicit credits
        that would give the stream more than `max_stream_prefetch` free (INVALID_CREDITS);
        the node may refuse (Overloaded, Unavailable).
        """
        ids, lease_ids, nacks = req.ack_ids, req.ack_lease_ids, req.nacks
        returned = len(ids) + len(nacks)
        if returned > self.limits.max_batch_messages:
            raise InvalidArgument(
                f"{returned} acks and nacks in one request exceed the limit of {self.limits.max_batch_messages}",
                reason="BATCH_TOO_LARGE")
        if ids or lease_ids:
            v.check_lease_ids(ids, lease_ids)
        extra = self.credits + req.credits - self.limits.max_stream_prefetch
        if req.credits and extra > 0:
            raise InvalidArgument(
                f"{req.credits} credits would give the stream {extra} more than this node's limit of "
                f"{self.limits.max_stream_prefetch}", reason="INVALID_CREDITS")
        unborn: list[int] = []
        if ids:
            held = self.held.acks(ids, lease_ids)  # NO_LEASE: not delivered by this stream
            keep = [p for p, lease in enumerate(held) if lease != NO_LEASE]
            self.dropped += len(ids) - len(keep)
            if keep:
                unborn = self._propose_acks([ids[p] for p in keep], [held[p] for p in keep])
        for n in nacks:
            self._propose_nack(n)
        if self.auto_credit and returned:
            returned = min(returned, max(0, self.prefetch - self.credits))
        else:
            returned = 0
        self.add_credits(returned + req.credits)
        return unborn

    def _propose_acks(self, ids: list[int], lease_ids: list[int]) -> list[int]:
        present, gone, unborn = self.api.leases.split(self.queue, ids)
        if len(present) == len(ids):
            self._track(self.api.node.propose_nowait(Ack(self.queue, ids, lease_ids)), len(ids))
            return []
        self.dropped += len(gone)
        if present:
            self._track(self.api.node.propose_nowait(Ack(
                self.queue, [ids[p] for p in present], [lease_ids[p] for p in present] if lease_ids else [])),
                len(present))
        return [ids[p] for p in unborn]

    def _propose_nack(self, n: NackItem) -> None:
        lease_id = self.held.take(n.id, n.lease_id)
        present, _, _ = self.api.leases.split(self.queue, [n.id])
        if not present or lease_id == NO_LEASE:  # gone, or not this stream's delivery
            self.dropped += 1
            return
        self._track(self.api.node.propose_nowait(
            Nack(self.queue, n.id, lease_id, n.delay_ms, n.priority, n.release)), 1)

    async def settle_unborn(self, ids: list[int]) -> None:
        """Acks of ids the state had not assigned when they arrived: proposed if the state
        holds them after a read barrier, else dropped (they never existed)."""
        known = await self.api.leases.known_after_barrier(self.queue, ids)
        self.dropped += len(ids) - len(known)
        if known:
            self._track(self.api.node.propose_nowait(Ack(self.queue, [ids[p] for p in known], [])), len(known))

    async def read_requests(self, requests: AsyncIterator[Settlement]) -> None:
        """The reader task: settle each request until the client half-closes (or one is
        refused); no request is read while `max_stream_pending_acks` are pending."""
        bound = self.limits.max_stream_pending_acks
        try:
            async for req in requests:
                unborn = self.settle(req)
                if unborn:
                    await self.settle_unborn(unborn)
                while self.pending >= bound:
                    self._below_bound.clear()
                    await self._below_bound.wait()
        except DoqError as e:
            log.debug("dequeue stream on %s: request refused: %s", self.queue, e)
            self.error = e
        finally:
            self.half_closed.set()
            self.wake.set()

    def _track(self, fut: asyncio.Future[object], n: int) -> None:
        self.settles[fut] = n
        self.pending += n
        fut.add_done_callback(self._settled)

    def _settled(self, fut: asyncio.Future[object]) -> None:
        self.pending -= self.settles.pop(fut, 0)
        if self.pending < self.limits.max_stream_pending_acks:
            self._below_bound.set()
        if fut.cancelled():
            return
        res = fut.exception() or fut.result()
        if isinstance(res, list):
            self.counters.acked.inc(res.count(None))
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
                        taken += self.api.leases.unexpired(self.queue, outcomes.messages(result))
                    if not taken:
                        continue
                    if self.half_closed.is_set():
                        self.release(taken)  # the client stopped taking: hand them back, unsent
                        continue
                    self.counters.dequeued.inc(len(taken))
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
            msgs = await self.api.take(
                self.queue, want, ack=True, wait_ms=LONG_POLL_MS,
                visibility_timeout_ms=self.visibility_timeout_ms, stop_waiting=self.half_closed,
            )
            if not msgs:
                continue
            self.counters.dequeued.inc(len(msgs))
            self.counters.acked.inc(len(msgs))
            if self.credit_mode:
                self.credits -= len(msgs)
            yield msgs

    def release(self, msgs: list[MessageView]) -> None:
        """Undo the delivery of leased messages that will not be sent (see `Nack.release`)."""
        futs = self.api.leases.release(self.queue, msgs)
        for fut in futs:
            self._track(fut, 1)
        if len(futs) < len(msgs):  # refused by the node: the leases will expire instead
            log.warning("could not release %d messages of %s", len(msgs) - len(futs), self.queue)

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
            await finish(self._reader)

    async def frames(self, requests: AsyncIterator[Settlement]) -> AsyncGenerator[list[MessageView], None]:
        """The whole stream: start reading `requests`, yield each frame, drain and close;
        raises the DoqError that ended it (a refused request included) after the frames."""
        self.start(requests)
        try:
            frames = self.pump()
            try:
                async for msgs in frames:
                    yield msgs
            finally:
                await frames.aclose()  # its end runs here, not at GC
            await self.drain()
        finally:
            await self.close()
        if self.error is not None:
            raise self.error
