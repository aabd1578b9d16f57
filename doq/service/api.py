"""The service facade: typed async methods every adapter (gRPC, HTTP, CLI) calls.

The service owns the queue semantics; the adapters only map requests and responses.
Every public method takes the `Caller` (keyword `caller`) and passes the door first
(`doq.service.door`: admission with the queue name, the node's `Limits`), then validates
input (raising `InvalidArgument`/`TooLarge` before anything is proposed, so a bad
request changes nothing), turns requests into replicated commands, proposes them through
the node, reads the typed results (`doq.service.outcomes`) and counts the messages by
the caller's transport (`doq.service.metrics`). Errors are `doq.errors.DoqError`
subclasses.

Results of changes come from the apply itself (the command's result); queries read the
node's committed state (`StateStore` views). A dequeue is proposed only when the queue
has something deliverable: an empty dequeue writes nothing. Long polls park in the
waiting room (`doq.service.longpoll`); streams are sessions (`doq.service.sessions`);
acks, nacks and releases go through the lease bookkeeping (`doq.service.leases`), which
answers those of messages known to be gone without a log entry.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from doq.errors import DoqError, InvalidArgument
from doq.node.base import Node
from doq.queues import commands as c
from doq.queues.group_policy import INHERIT_RATE
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
from doq.service import outcomes, paging
from doq.service.door import (
    INTERNAL,
    Action,
    AdmittedQueues,
    Caller,
    Door,
    deletes_any,
    visible,
    without_leases,
)
from doq.service.leases import Leases
from doq.service.longpoll import LongPolls
from doq.service.pipeline import ProducerSession, finish
from doq.service.sessions import DequeueSession, Settlement, StreamOpen

R = TypeVar("R")
EnqueueFrame = list[tuple[str, c.EnqueueItem]] | c.EnqueueColumns
"""A frame of a batch producer stream: messages (possibly to several queues) or columns."""

MAX_PEEK_LIMIT = 100  # messages per peek
MAX_PEEK_WINDOW = 10_000  # offset + limit: how deep a peek may look (its cost grows with it)
DEFAULT_PEEK_LIMIT = 20


def peek_state(name: str) -> MessageState:
    """The state a peek names ("" : ready); InvalidArgument for another name."""
    try:
        return MessageState(name or MessageState.READY.value)
    except ValueError:
        raise InvalidArgument("state must be one of ready, delayed, in_flight", reason="INVALID_ARGUMENT") from None


class FrameOutcome(NamedTuple):
    """The outcome of one frame of a batch producer stream."""

    columns: bool  # a columnar frame
    size: int  # messages in the frame
    result: outcomes.ItemResults | EnqueueColumnsResult | DoqError  # or the error refusing it whole


def lease_seed() -> int:
    """A fresh random seed for one `Dequeue` (its lease ids derive from it: unguessable)."""
    return secrets.randbits(64) or 1


def _done(result: object) -> asyncio.Future[object]:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    fut.set_result(result)
    return fut


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

    def __init__(self, node: Node, limits: v.Limits | None = None, *, door: Door | None = None) -> None:
        self.node = node
        self.door = door or Door(limits)
        self.leases = Leases(node)
        self.long_polls = LongPolls(node.state.deliverable, self.leases.release_unawaited)
        node.add_apply_listener(self.long_polls.wake_all)

    @property
    def limits(self) -> v.Limits:
        """The node's limits (the door's)."""
        return self.door.limits

    # -- queues ---------------------------------------------------------------------------
    async def create_queue(
        self, name: str, type_: str = "delayed", settings: QueueSettings | None = None, *,
        caller: Caller = INTERNAL,
    ) -> QueueInfo:
        self.door.admit(caller, Action.CREATE_QUEUE, name)
        v.check_queue_name(name)
        qtype = v.check_queue_type(type_)
        settings = v.check_settings(settings or QueueSettings())
        cmd = c.CreateQueue(name, qtype.value, settings, self.limits.max_queues)  # the limit travels with it
        return outcomes.expect(await self.node.propose(cmd), QueueInfo)

    async def update_queue(self, name: str, settings: QueueSettings, *, caller: Caller = INTERNAL) -> QueueInfo:
        self.door.admit(caller, Action.UPDATE_QUEUE, name)
        v.check_queue_name(name)
        v.check_settings(settings)
        return outcomes.expect(await self.node.propose(c.UpdateQueue(name, settings)), QueueInfo)

    async def delete_queue(self, name: str, *, caller: Caller = INTERNAL) -> None:
        self.door.admit(caller, Action.DELETE_QUEUE, name)
        v.check_queue_name(name)
        outcomes.none(await self.node.propose(c.DeleteQueue(name)))

    async def purge_queue(self, name: str, *, caller: Caller = INTERNAL) -> int:
        self.door.admit(caller, Action.PURGE_QUEUE, name)
        v.check_queue_name(name)
        return outcomes.count(await self.node.propose(c.PurgeQueue(name)))

    async def get_queue(self, name: str, *, caller: Caller = INTERNAL) -> QueueInfo:
        self.door.admit(caller, Action.GET_QUEUE, name)
        v.check_queue_name(name)
        await self.node.read_barrier()
        return self.node.state.get_queue(name)

    async def list_queues(self, *, caller: Caller = INTERNAL) -> list[QueueInfo]:
        self.door.admit(caller, Action.LIST_QUEUES, None)
        await self.node.read_barrier()
        queues = self.node.state.list_queues()
        # only the queues the caller's key may read (a prefix key: its own), before any paging
        return visible(caller, queues)

    async def list_queues_page(self, page_token: str = "", max_results: int = 0, *,
                               caller: Caller = INTERNAL) -> tuple[list[QueueInfo], str]:
        """A page of `list_queues` (`doq.service.paging`): (queues, next page token or "")."""
        return paging.page(await self.list_queues(caller=caller), page_token, max_results)

    # -- enqueue --------------------------------------------------------------------------
    async def enqueue(self, queue: str, item: c.EnqueueItem, *, caller: Caller = INTERNAL) -> EnqueueResult:
        """Enqueue one message; returns its id (the original's if dedup_id was seen)."""
        self.door.admit(caller, Action.ENQUEUE, queue)
        v.check_queue_name(queue)
        v.check_item(item, self.limits)
        res = outcomes.item_results(await self.enqueue_nowait(queue, item))[0]
        if isinstance(res, DoqError):
            raise res
        if not res.duplicate:
            caller.counters.enqueued.inc()
        return res

    def enqueue_nowait(self, queue: str, item: c.EnqueueItem) -> asyncio.Future[object]:
        """Propose one message (admitted and validated by the caller); the future's result
        is `Enqueue`'s (`outcomes.item_results`). Raises what `propose_nowait` raises
        (NotLeader, Overloaded...). Counts nothing."""
        fut = self.node.propose_nowait(c.Enqueue(queue, [item]))
        self.long_polls.arrive(queue, 1, self.node.propose_nowait)
        return fut

    async def enqueue_many(
        self, requests: Sequence[tuple[str, c.EnqueueItem]], *, caller: Caller = INTERNAL
    ) -> outcomes.ItemResults:
        """Enqueue a batch (possibly to several queues); one result per request, in order.

        All or nothing: one invalid request refuses the whole batch, raising
        `batch_item_refused(i, its error)`. The items of one queue go in one command, so
        they succeed or fail together; a command-level failure (unknown queue, not leader,
        overload) fills the slots of that queue's items with its error.
        """
        results = await self._enqueue_many(requests, caller)
        caller.counters.enqueued.inc(outcomes.fresh(results))
        return results

    async def _enqueue_many(self, requests: Sequence[tuple[str, c.EnqueueItem]], caller: Caller) -> outcomes.ItemResults:
        """`enqueue_many` without counting."""
        if len(requests) > self.limits.max_batch_messages:
            raise InvalidArgument(
                f"batch of {len(requests)} messages exceeds the limit of {self.limits.max_batch_messages}",
                reason="BATCH_TOO_LARGE",
            )
        by_queue: dict[str, tuple[list[int], list[c.EnqueueItem]]] = {}
        for pos, (queue, item) in enumerate(requests):
            try:
                if queue not in by_queue:
                    self.door.admit(caller, Action.ENQUEUE, queue)
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
            try:
                results = outcomes.item_results(answer)
            except DoqError as e:
                for pos in slots:
                    out[pos] = e
                continue
            for pos, res in zip(slots, results, strict=True):
                out[pos] = res
        return cast(outcomes.ItemResults, out)  # every slot is filled

    def check_columns(self, cmd: c.EnqueueColumns) -> tuple[c.EnqueueColumns, dict[int, DoqError]]:
        """Split a columnar batch into the command of its valid messages and the errors of
        the others, by position (each message stands alone). Raises for what concerns the
        whole batch: the queue name, BATCH_TOO_LARGE, INVALID_COLUMNS (a column of another
        length). Per-message checks run only when metadata or delays are set or the columns'
        C-speed passes (`limits.columns_pass`) cannot tell that every message passes."""
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
        if not n or not (cmd.metadata or cmd.delays_ms) and v.columns_pass(
                cmd.contents, cmd.groups, cmd.priorities, cmd.dedup_ids, self.limits):
            return cmd, {}
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

    async def enqueue_columns(self, cmd: c.EnqueueColumns, *, caller: Caller = INTERNAL) -> EnqueueColumnsResult:
        """Enqueue a columnar batch (`check_columns`): the result of every message, by
        position (an invalid message fails alone). Raises DoqError for a whole-batch
        failure (see `check_columns`; the node may refuse: NotLeader, Overloaded...)."""
        res = await self._columns_nowait(cmd, caller)
        if isinstance(res, DoqError):
            raise res
        out = outcomes.columns_result(res)
        caller.counters.enqueued.inc(outcomes.fresh_columns(out))
        return out

    def _columns_nowait(self, cmd: c.EnqueueColumns, caller: Caller) -> asyncio.Future[object]:
        """`enqueue_columns` without a task when every message is valid (the common case);
        a whole-batch failure is the future's result (not raised: streams answer it).
        Counts nothing."""
        try:
            self.door.admit(caller, Action.ENQUEUE, cmd.queue)
            valid, bad = self.check_columns(cmd)
            fut = self.node.propose_nowait(valid) if valid.contents else None
            if fut is not None:
                self.long_polls.arrive(cmd.queue, len(valid.contents), self.node.propose_nowait)
            if not bad and fut is not None:
                return fut
        except DoqError as e:
            return _done(e)

        async def merged() -> object:
            try:
                res = await fut if fut is not None else EnqueueColumnsResult([])
            except DoqError as e:
                return e
            if isinstance(res, DoqError):
                return res
            return _merge_columns(outcomes.columns_result(res), bad, len(cmd.contents))

        return asyncio.ensure_future(merged())

    # -- producer streams -----------------------------------------------------------------
    async def enqueue_stream(
        self, requests: AsyncIterator[R], convert: Callable[[R], tuple[str, c.EnqueueItem]], *,
        caller: Caller = INTERNAL,
    ) -> AsyncGenerator[EnqueueResult | DoqError, None]:
        """A producer stream of single messages: each request (`convert`ed by the adapter
        into its queue and message; a DoqError it raises answers that request) is admitted
        (once per queue), validated and proposed as it arrives; one outcome per request,
        in order; at most `stream_window_messages` in flight (see `ProducerSession`)."""
        limits = self.limits
        admitted = AdmittedQueues(limits.stream_admitted_queues)  # bounded: a stream may name any number
        counter = caller.counters.enqueued

        def start(r: R) -> asyncio.Future[object]:
            try:
                queue, item = convert(r)
                if queue not in admitted:
                    self.door.admit(caller, Action.ENQUEUE, queue)
                    v.check_queue_name(queue)
                    admitted.remember(queue)
                v.check_item(item, limits)
                return self.enqueue_nowait(queue, item)
            except DoqError as e:
                return _done(e)

        pipe: ProducerSession[R, asyncio.Future[object]] = ProducerSession(
            requests, start, limits.stream_window_messages)
        next_started = pipe.next
        try:
            while (fut := await next_started()) is not None:
                try:
                    res = await fut
                except DoqError as e:
                    yield e
                    continue
                if type(res) is list:
                    res = res[0]
                if type(res) is EnqueueResult:
                    if not res.duplicate:
                        counter.inc()
                    yield res
                else:
                    yield outcomes.error(res)
            await pipe.finished()
        finally:
            await pipe.close()  # a node future left behind is not a task: nothing to end

    async def enqueue_frames(
        self, frames: AsyncIterator[R], convert: Callable[[R], EnqueueFrame], *, caller: Caller = INTERNAL,
    ) -> AsyncGenerator[FrameOutcome, None]:
        """A producer stream of frames (`convert`ed by the adapter: messages or columns;
        a DoqError it raises refuses that frame, answered as a columns frame's error): each frame all or nothing as
        `enqueue_many` / `enqueue_columns`, one outcome per frame, in order; at most
        `stream_window_frames` in flight. A `columns` frame is proposed without a task."""
        counter = caller.counters.enqueued

        def start(r: R) -> tuple[bool, int, asyncio.Future[object]]:
            try:
                frame = convert(r)
            except DoqError as e:  # answered as a refused frame in its `error` (a frame
                return True, 0, _done(e)  # that says nothing sure of its messages)
            if isinstance(frame, c.EnqueueColumns):
                return True, len(frame.contents), self._columns_nowait(frame, caller)
            return False, len(frame), asyncio.ensure_future(self._enqueue_many(frame, caller))

        async def abandon(started: tuple[bool, int, asyncio.Future[object]]) -> None:
            fut = started[2]
            if isinstance(fut, asyncio.Task) and not fut.done():
                await finish(fut)

        pipe = ProducerSession(frames, start, self.limits.stream_window_frames, abandon)
        started: tuple[bool, int, asyncio.Future[object]] | None = None
        try:
            while (started := await pipe.next()) is not None:
                columns, size, fut = started
                try:
                    res = await fut
                except DoqError as e:  # the whole frame failed
                    yield FrameOutcome(columns, size, e)
                    continue
                if type(res) is EnqueueColumnsResult:
                    counter.inc(outcomes.fresh_columns(res))
                    yield FrameOutcome(True, size, res)
                elif type(res) is list:
                    counter.inc(outcomes.fresh(res))
                    yield FrameOutcome(False, size, res)
                else:
                    yield FrameOutcome(columns, size, outcomes.error(res))
            started = None
            await pipe.finished()
        finally:
            await pipe.close(started)

    # -- dequeue --------------------------------------------------------------------------
    async def dequeue(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        ack: bool = False,
        wait_ms: int = 0,
        visibility_timeout_ms: int = 0,
        stop_waiting: asyncio.Event | None = None,
        caller: Caller = INTERNAL,
    ) -> list[MessageView]:
        """Lease (or with `ack`, remove) up to `max_messages`; wait up to `wait_ms` for one.

        Nothing is proposed while the queue has nothing deliverable: an empty answer
        changes nothing (QueueNotFound if the queue does not exist). `stop_waiting`, when
        set (the client went away, the stream half-closed), ends a long poll early with []
        and is checked right before each proposal; it never interrupts a dequeue already
        proposed, so messages it removed or leased are always returned.
        """
        self.door.admit(caller, Action.DEQUEUE, queue)
        v.check_queue_name(queue)
        if not 1 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgument(
                f"max_messages must be within 1..{self.limits.max_batch_messages}", reason="INVALID_MAX"
            )
        if not 0 <= wait_ms <= self.limits.max_wait_ms:
            raise InvalidArgument(f"wait_ms must be within 0..{self.limits.max_wait_ms}", reason="INVALID_WAIT")
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        msgs = await self.take(queue, max_messages, ack=ack, wait_ms=wait_ms,
                               visibility_timeout_ms=visibility_timeout_ms, stop_waiting=stop_waiting)
        if msgs:
            caller.counters.dequeued.inc(len(msgs))
            if ack:
                caller.counters.acked.inc(len(msgs))
        return msgs

    async def take(
        self, queue: str, max_messages: int, *, ack: bool, wait_ms: int, visibility_timeout_ms: int,
        stop_waiting: asyncio.Event | None,
    ) -> list[MessageView]:
        """`dequeue` of admitted and validated arguments, through the waiting room; counts
        nothing (the sessions' and `dequeue`'s own)."""
        cmd = c.Dequeue(queue, max_messages, ack, visibility_timeout_ms, 0 if ack else lease_seed())
        deadline = time.monotonic() + wait_ms / 1000
        state = self.node.state
        polls = self.long_polls
        claim = None  # set while this call was woken to take messages
        try:
            while True:
                if claim is not None and claim.early is not None:  # proposed with an enqueue
                    early, claim.early = claim.early, None
                    result = self.leases.unexpired(queue, outcomes.messages(await early))
                    if result:
                        return result
                if stop_waiting is not None and stop_waiting.is_set():
                    return []
                if state.deliverable(queue):
                    result = self.leases.unexpired(queue, outcomes.messages(await self.node.propose(cmd)))
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

    async def dequeue_stream(
        self, first: StreamOpen, requests: AsyncIterator[Settlement], *, batch_default: int,
        caller: Caller = INTERNAL,
    ) -> AsyncGenerator[list[MessageView], None]:
        """A dequeue stream (see `DequeueSession`): admitted and checked by its first
        request, then frames of messages until the client half-closes; `requests` are the
        later requests (acks, nacks, credits). Raises the DoqError that refused the first
        request or ended the stream (after the frames sent before it)."""
        session = await DequeueSession.open(self, first, batch_default, caller)
        frames = session.frames(requests)
        try:
            async for msgs in frames:
                yield msgs
        finally:
            await frames.aclose()

    # -- settle ---------------------------------------------------------------------------
    async def ack(self, queue: str, id_: int, lease_id: int = 0, *, caller: Caller = INTERNAL) -> None:
        self.door.admit(caller, Action.ACK, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        err = (await self.leases.ack(queue, [id_], [lease_id]))[0]
        if err is not None:
            raise err
        caller.counters.acked.inc()

    async def ack_many(self, queue: str, ids: Sequence[int], lease_ids: Sequence[int] = (), *,
                       caller: Caller = INTERNAL) -> outcomes.AckResults:
        """Ack a batch; one `None` (acked) or error per id, in order."""
        self.door.admit(caller, Action.ACK, queue)
        v.check_queue_name(queue)
        if len(ids) > self.limits.max_batch_messages:
            raise InvalidArgument("too many ids in one ack batch", reason="BATCH_TOO_LARGE")
        v.check_lease_ids(ids, lease_ids)
        for id_ in ids:
            v.check_id(id_)
        results = await self.leases.ack(queue, list(ids), list(lease_ids))
        caller.counters.acked.inc(results.count(None))
        return results

    async def nack(
        self, queue: str, id_: int, *, lease_id: int = 0, delay_ms: int = 0, priority: int | None = None,
        release: bool = False, caller: Caller = INTERNAL,
    ) -> None:
        """Return an in-flight message; `release` undoes the delivery (see `commands.Nack`)."""
        self.door.admit(caller, Action.NACK, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_delay_ms(delay_ms)
        if priority is not None:
            v.check_priority(priority)
        outcomes.none(await self.leases.settle_one(queue, id_, c.Nack(queue, id_, lease_id, delay_ms, priority, release)))

    async def touch(self, queue: str, id_: int, *, lease_id: int = 0, visibility_timeout_ms: int = 0,
                    caller: Caller = INTERNAL) -> int:
        """Extend a lease; returns the new lease_expires_at_ms."""
        self.door.admit(caller, Action.TOUCH, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        return outcomes.count(await self.leases.settle_one(
            queue, id_, c.Touch(queue, id_, lease_id, visibility_timeout_ms)))

    # -- one message ----------------------------------------------------------------------
    async def update_priority(self, queue: str, id_: int, priority: int, *, caller: Caller = INTERNAL) -> MessageView:
        self.door.admit(caller, Action.UPDATE_PRIORITY, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_priority(priority)
        view = outcomes.expect(await self.node.propose(c.UpdatePriority(queue, id_, priority)), MessageView)
        return without_leases(caller, [view])[0]

    async def get_message(self, queue: str, id_: int, *, caller: Caller = INTERNAL) -> MessageView:
        self.door.admit(caller, Action.GET_MESSAGE, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        await self.node.read_barrier()
        state = self.node.state
        view = state.get_message_now(queue, id_)  # nothing answered is uncommitted: no hop
        if view is None:
            # off the loop: a direct reader of LMDB waits for a commit (`wait_committed`)
            view = await asyncio.to_thread(state.get_message, queue, id_)
        return without_leases(caller, [view])[0]

    async def peek(self, queue: str, state: MessageState = MessageState.READY, offset: int = 0,
                   limit: int = 20, *, caller: Caller = INTERNAL) -> list[MessageView]:
        """`queue`'s messages in `state` from position `offset` on, in the order they would
        leave that state (ready: delivery order), without leasing them or counting an
        attempt. A peek looks no deeper than MAX_PEEK_WINDOW (the cost grows with it): a
        page that would reach past it is cut there (`offset` < MAX_PEEK_WINDOW)."""
        self.door.admit(caller, Action.PEEK, queue)
        v.check_queue_name(queue)
        if not 1 <= limit <= MAX_PEEK_LIMIT:
            raise InvalidArgument(f"limit must be within 1..{MAX_PEEK_LIMIT}", reason="INVALID_ARGUMENT")
        if not 0 <= offset < MAX_PEEK_WINDOW:
            raise InvalidArgument(f"offset must be within 0..{MAX_PEEK_WINDOW - 1}", reason="INVALID_ARGUMENT")
        limit = min(limit, MAX_PEEK_WINDOW - offset)
        await self.node.read_barrier()
        return without_leases(caller, await self.node.inspect(lambda state_: state_.peek(queue, state, offset, limit)))

    async def group_stats(self, queue: str, *, caller: Caller = INTERNAL) -> list[GroupStats]:
        """A fair queue's groups (backlog and in flight), by name; [] for a delayed queue."""
        self.door.admit(caller, Action.GET_QUEUE, queue)
        v.check_queue_name(queue)
        await self.node.read_barrier()
        return await self.node.inspect(lambda state_: state_.group_stats(queue))

    async def set_group_policy(self, queue: str, group: str, weight: int | None = None,
                               max_per_second: int | None = None, *, reset: bool = False,
                               caller: Caller = INTERNAL) -> GroupStats:
        """Override a fair queue's group defaults for `group`: `weight` (1..MAX_GROUP_WEIGHT
        turns per round) and/or `max_per_second` (0 = no limit .. MAX_GROUP_RATE); None
        keeps that one. `reset` drops both overrides (the queue's defaults apply again).
        Returns the group as it is then; FailedPrecondition NOT_FAIR_QUEUE on a delayed
        queue, QueueNotFound, InvalidArgument (nothing proposed)."""
        self.door.admit(caller, Action.UPDATE_QUEUE, queue)
        v.check_queue_name(queue)
        v.check_group_policy(group, weight, max_per_second, reset, self.limits)
        cmd = (c.SetGroupPolicy(queue, group, 0, INHERIT_RATE) if reset
               else c.SetGroupPolicy(queue, group, weight, max_per_second))
        return outcomes.expect(await self.node.propose(cmd), GroupStats)

    async def delete_message(self, queue: str, id_: int, lease_id: int = 0, *, caller: Caller = INTERNAL) -> None:
        """Delete a message. One in flight (someone holds it) needs its `lease_id` unless the
        caller may delete any (`door.deletes_any`: an admin key); a `lease_id` given must
        be the current delivery's (StaleLease)."""
        self.door.admit(caller, Action.DELETE_MESSAGE, queue)
        v.check_queue_name(queue)
        v.check_id(id_)
        holder_only = bool(lease_id) or not deletes_any(caller)
        outcomes.none(await self.node.propose(c.DeleteMessage(queue, id_, lease_id, holder_only)))
