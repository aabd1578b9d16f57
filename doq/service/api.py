"""The service facade: typed async methods every adapter (gRPC, HTTP, CLI) calls.

Validates input (raising `InvalidArgument`/`TooLarge` before anything is proposed, so a
bad request changes nothing), turns requests into replicated commands, proposes them
through the node and maps results back. Errors are `doq.errors.DoqError` subclasses.

Results of changes come from the apply itself (the command's result); queries read the
node's committed state (`StateStore` views). A dequeue is proposed only when the queue
has something deliverable: an empty dequeue writes nothing. Long polls park in a
per-queue FIFO (`LongPolls`) and a commit wakes only as many of them as it can serve.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from doq.errors import DoqError, InvalidArgument, QueueNotFound
from doq.node.base import Node
from doq.queues import commands as c
from doq.queues.model import (
    EnqueueColumnsResult,
    EnqueueResult,
    GroupStats,
    MessageState,
    MessageView,
    QueueInfo,
    QueueSettings,
)
from doq.service import limits as v

MAX_PEEK_LIMIT = 100  # messages per peek
MAX_PEEK_WINDOW = 10_000  # offset + limit: how deep a peek may look (its cost grows with it)


def _consume(fut: asyncio.Future[object]) -> None:
    """A done callback that retrieves an outcome nobody awaits (no "never retrieved" log)."""
    if not fut.cancelled():
        fut.exception()


def _raise_if_error(result: object) -> object:
    if isinstance(result, DoqError):
        raise result
    return result


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
                    fut = propose(c.Dequeue(queue, k, False, w.visibility_timeout_ms))
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


def batch_item_refused(pos: int, err: DoqError) -> DoqError:
    """The error refusing a whole batch because of its message `pos` (same class and reason)."""
    return type(err)(f"messages[{pos}]: {err.message}; nothing was enqueued", reason=err.reason,
                     loc=("messages", pos))


def _merge_columns(res: EnqueueColumnsResult, bad: dict[int, DoqError], n: int) -> EnqueueColumnsResult:
    """The result of `n` messages from that of the valid ones (in order) and the errors of
    the others (by position)."""
    ids: list[int] = []
    dups: list[int] = []
    deliver: list[int] = []
    errors = dict(bad)
    dup_set = set(res.duplicates)
    k = 0  # position in `res`
    for pos in range(n):
        if pos in bad:
            ids.append(0)
            deliver.append(0)
            continue
        ids.append(res.ids[k])
        deliver.append(res.deliver_at_ms[k] if res.deliver_at_ms else 0)
        if k in dup_set:
            dups.append(pos)
        if k in res.errors:
            errors[pos] = res.errors[k]
        k += 1
    return EnqueueColumnsResult(ids, dups, deliver if any(deliver) else [], errors)


class QueueService:
    """One facade over a node. Methods are coroutine-safe; many may run concurrently."""

    def __init__(self, node: Node, limits: v.Limits | None = None) -> None:
        self.node = node
        self.limits = limits or v.Limits()
        self.long_polls = LongPolls(node.state.deliverable, self._release_leases)
        node.add_apply_listener(self.long_polls.wake_all)

    # -- queues ---------------------------------------------------------------------------
    async def create_queue(
        self, name: str, type_: str = "delayed", settings: QueueSettings | None = None
    ) -> QueueInfo:
        v.check_queue_name(name)
        qtype = v.check_queue_type(type_)
        settings = v.check_settings(settings or QueueSettings())
        info = _raise_if_error(await self.node.propose(c.CreateQueue(name, qtype.value, settings)))
        assert isinstance(info, QueueInfo)
        return info

    async def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        v.check_queue_name(name)
        v.check_settings(settings)
        info = _raise_if_error(await self.node.propose(c.UpdateQueue(name, settings)))
        assert isinstance(info, QueueInfo)
        return info

    async def delete_queue(self, name: str) -> None:
        v.check_queue_name(name)
        _raise_if_error(await self.node.propose(c.DeleteQueue(name)))

    async def purge_queue(self, name: str) -> int:
        v.check_queue_name(name)
        return int(_raise_if_error(await self.node.propose(c.PurgeQueue(name))))  # type: ignore[call-overload]

    async def get_queue(self, name: str) -> QueueInfo:
        v.check_queue_name(name)
        await self.node.read_barrier()
        return self.node.state.get_queue(name)

    async def list_queues(self) -> list[QueueInfo]:
        await self.node.read_barrier()
        return self.node.state.list_queues()

    # -- messages -------------------------------------------------------------------------
    async def enqueue(self, queue: str, item: c.EnqueueItem) -> EnqueueResult:
        """Enqueue one message; returns its id (the original's if dedup_id was seen)."""
        v.check_queue_name(queue)
        v.check_item(item, self.limits)
        results = await self.enqueue_nowait(queue, item)
        results = _raise_if_error(results)
        assert isinstance(results, list)
        return _raise_if_error(results[0])  # type: ignore[return-value]

    def _release_leases(self, queue: str, msgs: list[MessageView]) -> None:
        """Undo deliveries nobody received (`Nack(release=True)`); if refused, their leases end."""
        for m in msgs:
            try:
                self.node.propose_nowait(c.Nack(queue, m.id, m.lease_id, release=True)).add_done_callback(_consume)
            except DoqError:
                return

    def enqueue_nowait(self, queue: str, item: c.EnqueueItem) -> asyncio.Future[object]:
        """Propose one (validated) message; the future's result is the command's list of
        one result. Raises what `propose_nowait` raises (NotLeader, Overloaded...)."""
        fut = self.node.propose_nowait(c.Enqueue(queue, [item]))
        self.long_polls.arrive(queue, 1, self.node.propose_nowait)
        return fut

    async def enqueue_many(
        self, requests: Sequence[tuple[str, c.EnqueueItem]]
    ) -> list[EnqueueResult | DoqError]:
        """Enqueue a batch (possibly to several queues); one result per request, in order.

        All or nothing: one invalid request refuses the whole batch, raising
        `batch_item_refused(i, its error)`. The items of one queue go in one command, so
        they succeed or fail together; a command-level failure (unknown queue, not leader,
        overload) fills the slots of that queue's items with its error.
        """
        if len(requests) > self.limits.max_batch_messages:
            raise InvalidArgument(
                f"batch of {len(requests)} messages exceeds the limit of {self.limits.max_batch_messages}",
                reason="BATCH_TOO_LARGE",
            )
        by_queue: dict[str, tuple[list[int], list[c.EnqueueItem]]] = {}
        for pos, (queue, item) in enumerate(requests):
            try:
                if queue not in by_queue:
                    v.check_queue_name(queue)
                    by_queue[queue] = ([], [])
                v.check_item(item, self.limits)
            except DoqError as e:
                raise batch_item_refused(pos, e) from None
            slots, items = by_queue[queue]
            slots.append(pos)
            items.append(item)
        out: list[EnqueueResult | DoqError | None] = [None] * len(requests)
        proposals: list[asyncio.Future[object]] = []
        for q, (_, items) in by_queue.items():
            try:
                proposals.append(self.node.propose_nowait(c.Enqueue(q, items)))
            except DoqError as e:  # refused at once (not the leader, overloaded)
                failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
                failed.set_exception(e)
                proposals.append(failed)
                continue
            self.long_polls.arrive(q, len(items), self.node.propose_nowait)
        answers = await asyncio.gather(*proposals, return_exceptions=True)
        for (slots, _), answer in zip(by_queue.values(), answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, DoqError):
                    raise answer
                for pos in slots:
                    out[pos] = answer
                continue
            assert isinstance(answer, list)
            for pos, res in zip(slots, answer, strict=True):
                out[pos] = res
        return out  # type: ignore[return-value]

    def check_columns(self, cmd: c.EnqueueColumns) -> tuple[c.EnqueueColumns, dict[int, DoqError]]:
        """Split a columnar batch into the command of its valid messages and the errors of
        the others, by position (each message stands alone). Raises for what concerns the
        whole batch: the queue name, BATCH_TOO_LARGE, INVALID_COLUMNS (a column of another
        length). Per-message checks run only when a content or dedup id may be too long or
        another column is set (else one pass over the lengths of each column)."""
        v.check_queue_name(cmd.queue)
        n = len(cmd.contents)
        if n > self.limits.max_batch_messages:
            raise InvalidArgument(
                f"batch of {n} messages exceeds the limit of {self.limits.max_batch_messages}",
                reason="BATCH_TOO_LARGE",
            )
        optional = (cmd.groups, cmd.priorities, cmd.metadata, cmd.dedup_ids, cmd.delays_ms)
        if any(col and len(col) != n for col in optional):
            raise InvalidArgument("every column must be empty or have one entry per content",
                                  reason="INVALID_COLUMNS")
        if not n or not (
            cmd.groups or cmd.priorities or cmd.metadata or cmd.delays_ms
            or max(map(len, cmd.contents)) > self.limits.max_message_bytes
            or (cmd.dedup_ids and max(map(len, cmd.dedup_ids)) * 4 > self.limits.max_dedup_id_bytes)
        ):
            return cmd, {}  # contents and dedup ids within bounds (<= 4 UTF-8 bytes a char)
        bad: dict[int, DoqError] = {}
        for pos, item in enumerate(cmd.to_items()):
            try:
                v.check_item(item, self.limits)
            except DoqError as e:
                bad[pos] = e
        if not bad:
            return cmd, {}
        keep = [i for i in range(n) if i not in bad]

        def pick(col: list[Any]) -> list[Any]:
            return [col[i] for i in keep] if col else []

        return c.EnqueueColumns(cmd.queue, pick(cmd.contents), pick(cmd.groups), pick(cmd.priorities),
                                pick(cmd.metadata), pick(cmd.dedup_ids), pick(cmd.delays_ms)), bad

    async def enqueue_columns(self, cmd: c.EnqueueColumns) -> EnqueueColumnsResult:
        """Enqueue a columnar batch (`check_columns`): the result of every message, by
        position (an invalid message fails alone). Raises DoqError for a whole-batch
        failure (see `check_columns`; the node may refuse: NotLeader, Overloaded...)."""
        res = await self.enqueue_columns_nowait(cmd)
        if isinstance(res, DoqError):
            raise res
        assert isinstance(res, EnqueueColumnsResult)
        return res

    def enqueue_columns_nowait(self, cmd: c.EnqueueColumns) -> asyncio.Future[object]:
        """`enqueue_columns` without a task when every message is valid (the common case);
        a whole-batch failure is the future's result (not raised: streams answer it)."""
        try:
            valid, bad = self.check_columns(cmd)
            fut = self.node.propose_nowait(valid) if valid.contents else None
            if fut is not None:
                self.long_polls.arrive(cmd.queue, len(valid.contents), self.node.propose_nowait)
            if not bad and fut is not None:
                return fut
        except DoqError as e:
            done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            done.set_result(e)
            return done

        async def merged() -> object:
            try:
                res = await fut if fut is not None else EnqueueColumnsResult([])
            except DoqError as e:
                return e
            if isinstance(res, DoqError):
                return res
            assert isinstance(res, EnqueueColumnsResult)
            return _merge_columns(res, bad, len(cmd.contents))

        return asyncio.ensure_future(merged())

    async def dequeue(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        ack: bool = False,
        wait_ms: int = 0,
        visibility_timeout_ms: int = 0,
        stop_waiting: asyncio.Event | None = None,
    ) -> list[MessageView]:
        """Lease (or with `ack`, remove) up to `max_messages`; wait up to `wait_ms` for one.

        Nothing is proposed while the queue has nothing deliverable: an empty answer
        changes nothing (QueueNotFound if the queue does not exist). `stop_waiting`, when
        set (the client went away, the stream half-closed), ends a long poll early with []
        and is checked right before each proposal; it never interrupts a dequeue already
        proposed, so messages it removed or leased are always returned.
        """
        v.check_queue_name(queue)
        if not 1 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgument(
                f"max_messages must be within 1..{self.limits.max_batch_messages}", reason="INVALID_MAX"
            )
        if not 0 <= wait_ms <= self.limits.max_wait_ms:
            raise InvalidArgument(f"wait_ms must be within 0..{self.limits.max_wait_ms}", reason="INVALID_WAIT")
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        cmd = c.Dequeue(queue, max_messages, ack, visibility_timeout_ms)
        deadline = time.monotonic() + wait_ms / 1000
        state = self.node.state
        polls = self.long_polls
        claim = None  # set while this call was woken to take messages
        try:
            while True:
                if claim is not None and claim.early is not None:  # proposed with an enqueue
                    early, claim.early = claim.early, None
                    result = _raise_if_error(await early)
                    assert isinstance(result, list)
                    if result:
                        return result
                if stop_waiting is not None and stop_waiting.is_set():
                    return []
                if state.deliverable(queue):
                    result = _raise_if_error(await self.node.propose(cmd))
                    assert isinstance(result, list)
                    if result or not wait_ms:
                        return result
                elif not wait_ms:
                    return []
                polls.release(queue, claim)
                claim = None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                claim = await polls.wait(queue, max_messages, remaining, stop_waiting, None if ack else cmd)
                if claim is None:
                    return []
        finally:
            polls.release(queue, claim)

    async def ack(self, queue: str, id_: int, lease_id: int = 0) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        results = _raise_if_error(await self.node.propose(c.Ack(queue, [id_], [lease_id])))
        assert isinstance(results, list)
        _raise_if_error(results[0])

    async def ack_many(self, queue: str, ids: Sequence[int], lease_ids: Sequence[int] = ()) -> list[DoqError | None]:
        """Ack a batch; one `None` (acked) or error per id, in order."""
        v.check_queue_name(queue)
        if len(ids) > self.limits.max_batch_messages:
            raise InvalidArgument("too many ids in one ack batch", reason="BATCH_TOO_LARGE")
        v.check_lease_ids(ids, lease_ids)
        for id_ in ids:
            v.check_id(id_)
        results = _raise_if_error(await self.node.propose(c.Ack(queue, list(ids), list(lease_ids))))
        assert isinstance(results, list)
        return results

    async def nack(
        self, queue: str, id_: int, *, lease_id: int = 0, delay_ms: int = 0, priority: int | None = None,
        release: bool = False,
    ) -> None:
        """Return an in-flight message; `release` undoes the delivery (see `commands.Nack`)."""
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_delay_ms(delay_ms)
        if priority is not None:
            v.check_priority(priority)
        _raise_if_error(await self.node.propose(c.Nack(queue, id_, lease_id, delay_ms, priority, release)))

    async def touch(self, queue: str, id_: int, *, lease_id: int = 0, visibility_timeout_ms: int = 0) -> int:
        """Extend a lease; returns the new lease_expires_at_ms."""
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        return int(_raise_if_error(await self.node.propose(c.Touch(queue, id_, lease_id, visibility_timeout_ms))))  # type: ignore[call-overload]

    async def update_priority(self, queue: str, id_: int, priority: int) -> MessageView:
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_priority(priority)
        result = _raise_if_error(await self.node.propose(c.UpdatePriority(queue, id_, priority)))
        assert isinstance(result, MessageView)
        return result

    async def get_message(self, queue: str, id_: int) -> MessageView:
        v.check_queue_name(queue)
        v.check_id(id_)
        await self.node.read_barrier()
        return self.node.state.get_message(queue, id_)

    async def peek(self, queue: str, state: MessageState = MessageState.READY, offset: int = 0,
                   limit: int = 20) -> list[MessageView]:
        """`queue`'s messages in `state` from position `offset` on, in the order they would
        leave that state (ready: delivery order), without leasing them or counting an
        attempt. `offset + limit` ≤ MAX_PEEK_WINDOW (the cost grows with it)."""
        v.check_queue_name(queue)
        if not 1 <= limit <= MAX_PEEK_LIMIT:
            raise InvalidArgument(f"limit must be within 1..{MAX_PEEK_LIMIT}", reason="INVALID_ARGUMENT")
        if not 0 <= offset <= MAX_PEEK_WINDOW - limit:
            raise InvalidArgument(f"offset + limit must be at most {MAX_PEEK_WINDOW}", reason="INVALID_ARGUMENT")
        await self.node.read_barrier()
        return await self.node.inspect(lambda state_: state_.peek(queue, state, offset, limit))

    async def group_stats(self, queue: str) -> list[GroupStats]:
        """A fair queue's groups (backlog and in flight), by name; [] for a delayed queue."""
        v.check_queue_name(queue)
        await self.node.read_barrier()
        return await self.node.inspect(lambda state_: state_.group_stats(queue))

    async def delete_message(self, queue: str, id_: int) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        _raise_if_error(await self.node.propose(c.DeleteMessage(queue, id_)))
