"""An in-memory stand-in for `QueueService` (unit tests of the HTTP adapter only).

Same method signatures and the real input validation (`doq.service.limits`); simple
semantics: delayed queues by (priority, id), leases, acks. Every state change goes
through `_mutate`, so tests can assert that a refused request changed nothing.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from doq.errors import (
    AlreadyExists,
    DoqError,
    FailedPrecondition,
    InvalidArgument,
    MessageNotFound,
    QueueNotFound,
    StaleLease,
)
from doq.queues.commands import EnqueueItem
from doq.queues.model import (
    EnqueueResult,
    MessageState,
    MessageView,
    QueueInfo,
    QueueSettings,
    QueueStats,
)
from doq.service import limits as v
from doq.service.api import batch_item_refused


@dataclass
class _Queue:
    type: str
    settings: QueueSettings
    messages: dict[int, MessageView] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)


class FakeState:
    def __init__(self) -> None:
        self.queues: dict[str, _Queue] = {}

    def _q(self, name: str) -> _Queue:
        if name not in self.queues:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return self.queues[name]

    def get_queue(self, name: str) -> QueueInfo:
        q = self._q(name)
        ready = sum(1 for x in q.messages.values() if x.state is MessageState.READY)
        flight = sum(1 for x in q.messages.values() if x.state is MessageState.IN_FLIGHT)
        from doq.queues.model import QueueType

        return QueueInfo(name, QueueType(q.type), q.settings, QueueStats(ready, 0, flight, 0))

    def list_queues(self) -> list[QueueInfo]:
        return [self.get_queue(n) for n in sorted(self.queues)]


class FakeNode:
    def __init__(self) -> None:
        self.state = FakeState()
        self.is_leader = True
        self.leader_hint = "node-1"
        self.node_id = "node-1"

    async def read_barrier(self) -> None:
        return None


class FakeQueueService:
    def __init__(self, limits: v.Limits | None = None) -> None:
        self.node = FakeNode()
        self.limits = limits or v.Limits()
        self.next_id = 1
        self.next_lease = 1000
        self.now_ms = 1_700_000_000_000
        self.mutations = 0

    @property
    def state(self) -> FakeState:
        return self.node.state

    def snapshot(self) -> object:
        return copy.deepcopy(self.state.queues)

    def _mutate(self) -> None:
        self.mutations += 1

    async def create_queue(self, name: str, type_: str = "delayed", settings: QueueSettings | None = None) -> QueueInfo:
        v.check_queue_name(name)
        qtype = v.check_queue_type(type_)
        settings = v.check_settings(settings or QueueSettings())
        if name in self.state.queues:
            raise AlreadyExists(f"queue {name!r} already exists")
        self._mutate()
        self.state.queues[name] = _Queue(qtype.value, settings)
        return self.state.get_queue(name)

    async def update_queue(self, name: str, settings: QueueSettings) -> QueueInfo:
        v.check_queue_name(name)
        v.check_settings(settings)
        self.state._q(name).settings = settings
        self._mutate()
        return self.state.get_queue(name)

    async def delete_queue(self, name: str) -> None:
        v.check_queue_name(name)
        self.state._q(name)
        self._mutate()
        del self.state.queues[name]

    async def purge_queue(self, name: str) -> int:
        v.check_queue_name(name)
        q = self.state._q(name)
        n = len(q.messages)
        q.messages.clear()
        self._mutate()
        return n

    async def get_queue(self, name: str) -> QueueInfo:
        v.check_queue_name(name)
        return self.state.get_queue(name)

    async def list_queues(self) -> list[QueueInfo]:
        return self.state.list_queues()

    def _enqueue(self, queue: str, item: EnqueueItem) -> EnqueueResult:
        q = self.state._q(queue)
        if item.dedup_id and item.dedup_id in q.dedup:
            old = q.messages[q.dedup[item.dedup_id]]
            return EnqueueResult(old.id, True, old.group, old.priority, old.deliver_at_ms)
        id_ = self.next_id
        self.next_id += 1
        deliver = self.now_ms + item.delay_ms if item.delay_ms else 0
        q.messages[id_] = MessageView(
            id_, queue, item.group, item.priority, 0, deliver, 0, self.now_ms, MessageState.READY,
            dedup_id=item.dedup_id, metadata=dict(item.metadata), content=item.content,
        )
        if item.dedup_id:
            q.dedup[item.dedup_id] = id_
        self._mutate()
        return EnqueueResult(id_, False, item.group, item.priority, deliver)

    async def enqueue(self, queue: str, item: EnqueueItem) -> EnqueueResult:
        v.check_queue_name(queue)
        v.check_item(item, self.limits)
        return self._enqueue(queue, item)

    async def enqueue_many(self, requests: Sequence[tuple[str, EnqueueItem]]) -> list[EnqueueResult | DoqError]:
        for pos, (queue, item) in enumerate(requests):  # all or nothing, as QueueService
            try:
                v.check_queue_name(queue)
                v.check_item(item, self.limits)
            except DoqError as e:
                raise batch_item_refused(pos, e) from None
        out: list[EnqueueResult | DoqError] = []
        for queue, item in requests:
            try:
                out.append(self._enqueue(queue, item))
            except DoqError as e:
                out.append(e)
        return out

    async def dequeue(
        self, queue: str, *, max_messages: int = 1, ack: bool = False, wait_ms: int = 0, visibility_timeout_ms: int = 0
    ) -> list[MessageView]:
        v.check_queue_name(queue)
        if not 0 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgument("bad max_messages", reason="INVALID_MAX")
        if not 0 <= wait_ms <= self.limits.max_wait_ms:
            raise InvalidArgument("bad wait_ms", reason="INVALID_WAIT")
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        q = self.state._q(queue)
        ready = sorted((x for x in q.messages.values() if x.state is MessageState.READY), key=lambda x: (x.priority, x.id))
        got = ready[: max_messages or 1]
        if not got and wait_ms:
            await asyncio.sleep(min(wait_ms, 50) / 1000)
        out = []
        for msg in got:
            self._mutate()
            msg.attempts += 1
            if ack:
                del q.messages[msg.id]
                out.append(replace(msg))
                continue
            self.next_lease += 1
            msg.state = MessageState.IN_FLIGHT
            msg.lease_id = self.next_lease
            msg.lease_expires_at_ms = self.now_ms + (visibility_timeout_ms or q.settings.effective_visibility_timeout_ms)
            out.append(replace(msg))
        return out

    def _inflight(self, queue: str, id_: int, lease_id: int) -> tuple[_Queue, MessageView]:
        q = self.state._q(queue)
        msg = q.messages.get(id_)
        if msg is None:
            raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
        if msg.state is not MessageState.IN_FLIGHT:
            raise FailedPrecondition(f"message {id_} is not in flight", reason="NOT_IN_FLIGHT")
        if lease_id and lease_id != msg.lease_id:
            raise StaleLease(f"lease {lease_id} of message {id_} is stale")
        return q, msg

    async def ack(self, queue: str, id_: int, lease_id: int = 0) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        q, msg = self._inflight(queue, id_, lease_id)
        self._mutate()
        del q.messages[msg.id]

    async def ack_many(self, queue: str, ids: Sequence[int], lease_ids: Sequence[int] = ()) -> list[DoqError | None]:
        v.check_queue_name(queue)
        self.state._q(queue)
        if lease_ids and len(lease_ids) != len(ids):
            raise InvalidArgument("lease_ids must be empty or as long as ids", reason="INVALID_LEASE_IDS")
        out: list[DoqError | None] = []
        for i, id_ in enumerate(ids):
            try:
                await self.ack(queue, id_, lease_ids[i] if lease_ids else 0)
                out.append(None)
            except DoqError as e:
                out.append(e)
        return out

    async def nack(
        self, queue: str, id_: int, *, lease_id: int = 0, delay_ms: int = 0, priority: int | None = None,
        release: bool = False,
    ) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_delay_ms(delay_ms)
        _, msg = self._inflight(queue, id_, lease_id)
        self._mutate()
        msg.state = MessageState.READY
        msg.lease_id = 0
        msg.lease_expires_at_ms = 0
        if priority is not None:
            msg.priority = priority
        if release:
            msg.attempts -= 1

    async def touch(self, queue: str, id_: int, *, lease_id: int = 0, visibility_timeout_ms: int = 0) -> int:
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_visibility_timeout_ms(visibility_timeout_ms)
        q, msg = self._inflight(queue, id_, lease_id)
        self._mutate()
        msg.lease_expires_at_ms = self.now_ms + (visibility_timeout_ms or q.settings.effective_visibility_timeout_ms)
        return msg.lease_expires_at_ms

    async def update_priority(self, queue: str, id_: int, priority: int) -> MessageView:
        v.check_queue_name(queue)
        v.check_id(id_)
        v.check_priority(priority)
        msg = self._get(queue, id_)
        self._mutate()
        msg.priority = priority
        return replace(msg, content=b"")

    def _get(self, queue: str, id_: int) -> MessageView:
        q = self.state._q(queue)
        if id_ not in q.messages:
            raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
        return q.messages[id_]

    async def get_message(self, queue: str, id_: int) -> MessageView:
        v.check_queue_name(queue)
        v.check_id(id_)
        return replace(self._get(queue, id_))

    async def delete_message(self, queue: str, id_: int) -> None:
        v.check_queue_name(queue)
        v.check_id(id_)
        self._get(queue, id_)
        self._mutate()
        del self.state._q(queue).messages[id_]
