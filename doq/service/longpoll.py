"""The long-poll waiting room: dequeues parked until a commit can serve them.

`LongPolls` keeps, per queue, a FIFO of parked waiters (`dequeue` calls with `wait_ms`)
and standing polls (`StandingPoll`: leasing streams with free credits). A commit wakes
only as many of them as it can serve; an enqueue proposes the dequeues of the oldest
leasing waiters in its own log entry (`arrive`). Owned by the service facade; adapters
never touch it.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections import deque
from collections.abc import Callable

from doq.errors import DoqError, QueueNotFound
from doq.queues import commands as c
from doq.queues.model import MessageView


async def _wait_any(event: asyncio.Event, other: asyncio.Event | None, timeout_s: float) -> bool:
    """Wait for `event` (True) or for `other`/the timeout (False).

    A cancel always propagates, even if `event` was set meanwhile (`asyncio.wait_for` of
    Python 3.11 would swallow it and report the event, so a cancelled long poll would go on
    to take a message nobody receives)."""
    waits = [asyncio.ensure_future(event.wait())]
    if other is not None:
        waits.append(asyncio.ensure_future(other.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return event.is_set() and not (other is not None and other.is_set())


class _Waiter:
    __slots__ = ("wanted", "woken", "cmd", "early")

    def __init__(self, wanted: int, cmd: c.Dequeue | None = None) -> None:
        self.wanted = wanted
        self.woken = asyncio.Event()
        self.cmd = cmd  # the dequeue this waiter will propose (see `LongPolls.arrive`)
        self.early: asyncio.Future[object] | None = None  # that dequeue, proposed by `arrive`


class StandingPoll:
    """The long poll of a leasing stream (`DequeueStream` without ack): parked, once
    `LongPolls.stand` put it in its queue's FIFO, for as long as it has room (`wanted`:
    messages it may be given now, the stream's free credits), also while dequeues it
    proposed earlier are committing, so every enqueue arriving meanwhile can lease for it
    in its own log entry (see `LongPolls.arrive`). Its owner takes those dequeues from
    `early` (oldest first, with the most messages each may return) and is told of them,
    and of a `wake` (then `claim` > 0, held until `LongPolls.release_standing`), by
    `signal`."""

    __slots__ = ("wanted", "visibility_timeout_ms", "signal", "early", "claim", "parked")

    def __init__(self, visibility_timeout_ms: int, signal: asyncio.Event) -> None:
        self.wanted = 0
        self.visibility_timeout_ms = visibility_timeout_ms
        self.signal = signal
        self.early: deque[tuple[asyncio.Future[object], int]] = deque()
        self.claim = 0  # messages `wake` counted on it to take (0: not woken)
        self.parked = False


class LongPolls:
    """Parked long polls, per queue in FIFO order, woken only as many as can be served.

    `wake(queue)` (run after every applied batch) wakes parked waiters, oldest first,
    until their `wanted` counts cover what the queue can deliver, less what waiters woken
    earlier are still about to take (their claim, held until they `release`). A queue
    that disappeared wakes all its waiters (they then see QueueNotFound).

    `arrive(queue, n, propose)` (run right after an enqueue of `n` messages to `queue` was
    proposed) has the oldest leasing waiters (those that gave their `cmd`, a Dequeue
    without ack) covering `n` propose their dequeue at once, so it goes into the same log
    entry as the enqueue, right after it: the messages are leased by the commit that
    stores them (one commit from enqueue to delivery, not two). The waiter then takes that
    dequeue's result (`early`); an empty one (the enqueue failed, or its messages are
    delayed) just parks it again. Removing dequeues (ack) are never proposed early: their
    caller may go away before the result, and a removal cannot be undone; leases can be:
    what the early dequeue of a cancelled waiter leases is released (`release_leases`).

    A `StandingPoll` (a leasing stream) waits in the same FIFO but is not taken out by an
    early dequeue: `arrive` proposes one of at most min(`wanted`, what is left of `n`)
    messages for it, lowers its `wanted` by as much and moves it to the back (out of the
    FIFO once `wanted` is 0), so a stream whose earlier dequeues are still committing
    leases the next message too in the commit that stores it. `wake` takes it out like a
    waiter, with a claim of its `wanted`.
    """

    def __init__(self, deliverable: Callable[[str], int],
                 release_leases: Callable[[str, list[MessageView]], None] | None = None) -> None:
        self._deliverable = deliverable  # raises QueueNotFound
        self._release_leases = release_leases
        self._parked: dict[str, deque[_Waiter | StandingPoll]] = {}
        self._claimed: dict[str, int] = {}

    def waiting(self, queue: str | None = None) -> int:
        """How many long polls are parked (on `queue`, or on any queue), not yet woken."""
        if queue is not None:
            return len(self._parked.get(queue, ()))
        return sum(len(w) for w in self._parked.values())

    async def wait(self, queue: str, wanted: int, timeout_s: float, stop: asyncio.Event | None,
                   cmd: c.Dequeue | None = None) -> _Waiter | None:
        """Park until woken (returns the waiter: the caller holds a claim and must
        `release` it after its dequeue, and must take the result of its `early` dequeue if
        set), or None on timeout / `stop` (a waiter whose dequeue `arrive` proposed is
        returned even then: what it leased or removed must reach its caller)."""
        w = _Waiter(wanted, cmd)
        self._parked.setdefault(queue, deque()).append(w)
        woken = returned = False
        try:
            woken = await _wait_any(w.woken, stop, timeout_s)
            returned = True
        finally:
            if not w.woken.is_set():
                waiters = self._parked.get(queue)
                if waiters is not None:
                    waiters.remove(w)
                    if not waiters:
                        del self._parked[queue]
            elif not woken and (w.early is None or not returned):
                if w.early is not None:  # cancelled: hand back what its early dequeue leases
                    w.early.add_done_callback(functools.partial(self._orphaned, queue))
                self.release(queue, w)  # woken, but the timeout, the stop or a cancel won: pass it on
        return w if woken or w.early is not None else None

    def _orphaned(self, queue: str, early: asyncio.Future[object]) -> None:
        """The early dequeue of a waiter that went away is done: release what it leased."""
        if early.cancelled() or early.exception() is not None or self._release_leases is None:
            return
        msgs = early.result()
        if isinstance(msgs, list) and msgs:
            self._release_leases(queue, msgs)

    def arrive(self, queue: str, n: int, propose: Callable[[c.Dequeue], asyncio.Future[object]]) -> None:
        """An enqueue of `n` messages to `queue` was just proposed (see the class doc)."""
        waiters = self._parked.get(queue)
        if not waiters:
            return
        claimed = self._claimed.get(queue, 0)
        while waiters and n > 0:
            w = waiters[0]
            if type(w) is StandingPoll:
                k = min(w.wanted, n)
                try:
                    fut = propose(c.Dequeue(queue, k, False, w.visibility_timeout_ms, secrets.randbits(64) or 1))
                except DoqError:  # refused: the stream sees it with its next dequeue
                    break
                waiters.popleft()
                w.early.append((fut, k))
                w.wanted -= k
                n -= k
                if w.wanted > 0:
                    waiters.append(w)  # still parked, behind the others
                else:
                    w.parked = False
                w.signal.set()
                continue
            assert isinstance(w, _Waiter)
            if w.cmd is None or w.woken.is_set():
                break
            try:
                w.early = propose(w.cmd)
            except DoqError:  # refused (not the leader, overloaded): the waiter will see it
                break
            waiters.popleft()
            w.woken.set()
            n -= w.wanted
            claimed += w.wanted
        if claimed:
            self._claimed[queue] = claimed
        if not waiters:
            del self._parked[queue]

    def release(self, queue: str, w: _Waiter | None) -> None:
        """A woken waiter has dequeued (or gave up): drop its claim, wake others if needed."""
        if w is None:
            return
        left = self._claimed.get(queue, 0) - w.wanted
        if left > 0:
            self._claimed[queue] = left
        else:
            self._claimed.pop(queue, None)
        self.wake(queue)

    def stand(self, queue: str, sp: StandingPoll) -> None:
        """Park `sp` (at the back of the FIFO) if it has room and is not parked or woken."""
        if sp.wanted > 0 and not sp.parked and not sp.claim:
            self._parked.setdefault(queue, deque()).append(sp)
            sp.parked = True

    def sit(self, queue: str, sp: StandingPoll) -> None:
        """Take `sp` out of the FIFO (no room left, or the stream ends)."""
        if sp.parked:
            sp.parked = False
            waiters = self._parked.get(queue)
            if waiters is not None:
                waiters.remove(sp)
                if not waiters:
                    del self._parked[queue]

    def release_standing(self, queue: str, sp: StandingPoll) -> None:
        """`sp`, woken, has dequeued (or will not): drop its claim, wake others if needed."""
        if not sp.claim:
            return
        left = self._claimed.get(queue, 0) - sp.claim
        sp.claim = 0
        if left > 0:
            self._claimed[queue] = left
        else:
            self._claimed.pop(queue, None)
        self.wake(queue)

    def wake_all(self) -> None:
        for queue in list(self._parked):
            self.wake(queue)

    def wake(self, queue: str) -> None:
        waiters = self._parked.get(queue)
        if not waiters:
            return
        try:
            free = self._deliverable(queue) - self._claimed.get(queue, 0)
        except QueueNotFound:
            free = 2**63
        claimed = self._claimed.get(queue, 0)
        while waiters and free > 0:
            w = waiters.popleft()
            if type(w) is StandingPoll:
                w.parked = False
                w.claim = w.wanted
                w.signal.set()
            else:
                assert isinstance(w, _Waiter)
                w.woken.set()
            free -= w.wanted
            claimed += w.wanted
        if claimed:
            self._claimed[queue] = claimed
        if not waiters:
            del self._parked[queue]
