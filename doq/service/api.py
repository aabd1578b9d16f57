"""The service facade: typed async methods every adapter (gRPC, HTTP, CLI) calls.

Validates input (raising `InvalidArgument`/`TooLarge` before anything is proposed, so a
bad request changes nothing), turns requests into replicated commands, proposes them
through the node and maps results back. Errors are `doq.errors.DoqError` subclasses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from doq.errors import DoqError, InvalidArgument
from doq.node.base import Node
from doq.queues import commands as c
from doq.queues.model import EnqueueResult, MessageView, QueueInfo, QueueSettings
from doq.service import limits as v


def _raise_if_error(result: object) -> object:
    if isinstance(result, DoqError):
        raise result
    return result


async def _wait_any(event: asyncio.Event, other: asyncio.Event | None, timeout_s: float) -> bool:
    """Wait for `event` (True) or for `other`/the timeout (False)."""
    if other is None:
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(other.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return event.is_set() and not other.is_set()


def batch_item_refused(pos: int, err: DoqError) -> DoqError:
    """The error refusing a whole batch because of its message `pos` (same class and reason)."""
    return type(err)(f"messages[{pos}]: {err.message}; nothing was enqueued", reason=err.reason,
                     loc=("messages", pos))


class QueueService:
    """One facade over a node. Methods are coroutine-safe; many may run concurrently."""

    def __init__(self, node: Node, limits: v.Limits | None = None) -> None:
        self.node = node
        self.limits = limits or v.Limits()

    # -- queues ---------------------------------------------------------------------------
    async def create_queue(
        self, name: str, type_: str = "delayed", settings: QueueSettings | None = None
    ) -> QueueInfo:
        v.check_queue_name(name)
        qtype = v.check_queue_type(type_)
        settings = v.check_settings(settings or QueueSettings())
        _raise_if_error(await self.node.propose(c.CreateQueue(name, qtype.value, settings)))
        return self.node.state.get_queue(name)

    async def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        v.check_queue_name(name)
        v.check_settings(settings)
        _raise_if_error(await self.node.propose(c.UpdateQueue(name, settings)))
        return self.node.state.get_queue(name)

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
        results = await self.node.propose(c.Enqueue(queue, [item]))
        results = _raise_if_error(results)
        assert isinstance(results, list)
        return _raise_if_error(results[0])  # type: ignore[return-value]

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
        proposals = [self.node.propose(c.Enqueue(q, items)) for q, (_, items) in by_queue.items()]
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

        `stop_waiting`, when set, ends a long poll early (returning []) but never interrupts
        a dequeue already proposed, so messages it removed or leased are always returned.
        """
        v.check_queue_name(queue)
        if not 0 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgument(
                f"max_messages must be within 1..{self.limits.max_batch_messages}", reason="INVALID_MAX"
            )
        if not 0 <= wait_ms <= self.limits.max_wait_ms:
            raise InvalidArgument(f"wait_ms must be within 0..{self.limits.max_wait_ms}", reason="INVALID_WAIT")
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        cmd = c.Dequeue(queue, max_messages or 1, ack, visibility_timeout_ms)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            changed = self.node.applied_event()
            result = _raise_if_error(await self.node.propose(cmd))
            assert isinstance(result, list)
            if result or wait_ms == 0:
                return result
            # Long poll: sleep until something is applied (an enqueue, a nack, an
            # expiry Tick) and this queue may have a deliverable message, or time is up.
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (stop_waiting is not None and stop_waiting.is_set()):
                    return []
                if not await _wait_any(changed, stop_waiting, remaining):
                    return []
                changed = self.node.applied_event()
                if self.node.state.has_deliverable(queue):
                    break

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

    async def delete_message(self, queue: str, id_: int) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        _raise_if_error(await self.node.propose(c.DeleteMessage(queue, id_)))
