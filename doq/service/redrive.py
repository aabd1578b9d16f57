"""The facade's redrive operations (`doq.queues.redrive`): start, cancel and read the task
that moves a dead-letter queue's messages back to a queue.

Same contract as `QueueService`'s methods: the door first (the queue named is the DLQ),
then validation before anything is proposed (a bad request changes nothing), then one
replicated command (start, cancel) or a linearizable read of the committed state (get).
The gRPC and HTTP adapters and the CLI call these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from doq.errors import InvalidArgument, NotFound, QueueNotFound
from doq.queues import redrive as RD
from doq.service import limits as v
from doq.service import outcomes
from doq.service.door import INTERNAL, Action, Caller
from doq.storage.state import StateView

if TYPE_CHECKING:
    from doq.service.api import QueueService


@dataclass(frozen=True, slots=True)
class RedriveProgress:
    """A redrive task as clients see it."""

    queue: str  # the dead-letter queue
    to: str  # the target queue
    state: str  # running | completed | cancelled | failed
    max_per_second: int  # 0: no limit
    moved: int
    remaining: int  # messages it may still move (0 once it ended)
    total: int  # messages it set out to move
    started_at_ms: int
    updated_at_ms: int
    reason: str = ""  # why it failed

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


def progress(task: RD.RedriveTask, view: StateView) -> RedriveProgress:
    """The client view of `task` in the committed state `view`."""
    q = view.queues.get(task.queue)
    ready, delayed = (q.info.stats.ready, q.info.stats.delayed) if q is not None else (0, 0)
    return RedriveProgress(task.queue, task.to, task.state, task.max_per_second, task.moved,
                           task.remaining(ready, delayed), task.total, task.started_at_ms,
                           task.updated_at_ms, task.reason)


def check_rate(max_per_second: object) -> int:
    if type(max_per_second) is not int or not 0 <= max_per_second <= RD.MAX_RATE:
        raise InvalidArgument(f"max_per_second must be an integer within 0..{RD.MAX_RATE} (0 or none: no limit)",
                              reason="INVALID_RATE")
    return max_per_second


async def start(api: QueueService, queue: str, to: str = "", max_per_second: int = 0, *,
                caller: Caller = INTERNAL) -> RedriveProgress:
    """Start moving `queue`'s messages to `to` ("": the queue that dead-letters into it).
    Raises QueueNotFound, InvalidArgument (REDRIVE_TO_ITSELF, INVALID_RATE...),
    FailedPrecondition (REDRIVE_RUNNING, REDRIVE_TARGET_REQUIRED)."""
    api.door.admit(caller, Action.REDRIVE, queue)
    v.check_queue_name(queue)
    if to:
        v.check_queue_name(to, "target queue name")
    check_rate(max_per_second)
    if to == queue:
        raise InvalidArgument(f"a redrive moves messages out of {queue!r}: `to` must be another queue",
                              reason="REDRIVE_TO_ITSELF")
    task = outcomes.expect(await api.node.propose(RD.StartRedrive(queue, to, max_per_second)), RD.RedriveTask)
    return progress(task, api.node.state.view)


async def cancel(api: QueueService, queue: str, *, caller: Caller = INTERNAL) -> RedriveProgress:
    """Cancel `queue`'s running redrive (an ended one is returned as it is). Raises
    QueueNotFound, NotFound REDRIVE_NOT_FOUND."""
    api.door.admit(caller, Action.REDRIVE, queue)
    v.check_queue_name(queue)
    task = outcomes.expect(await api.node.propose(RD.CancelRedrive(queue)), RD.RedriveTask)
    return progress(task, api.node.state.view)


async def get(api: QueueService, queue: str, *, caller: Caller = INTERNAL) -> RedriveProgress:
    """`queue`'s redrive (the last one started, running or ended). Raises QueueNotFound,
    NotFound REDRIVE_NOT_FOUND."""
    api.door.admit(caller, Action.GET_QUEUE, queue)
    v.check_queue_name(queue)
    await api.node.read_barrier()
    view = api.node.state.view
    if queue not in view.queues:
        raise QueueNotFound(f"queue {queue!r} not found")
    task = view.redrives.get(queue)
    if task is None:
        raise NotFound(f"queue {queue!r} has no redrive", reason="REDRIVE_NOT_FOUND")
    return progress(task, view)


class RedriveCollector(Collector):
    """Gauges of the redrive tasks, read at scrape time from the committed state (any node:
    the tasks are replicated): per dead-letter queue `doq_redrive_messages{queue,kind}`
    (kind moved, remaining, total), `doq_redrive_running{queue}` (1 while it runs) and
    `doq_redrive_max_per_second{queue}` (0: no limit). A queue's series stay after its
    task ended (its last figures) until the queue is deleted."""

    def __init__(self, view: Callable[[], StateView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        msgs = GaugeMetricFamily("doq_redrive_messages", "A dead-letter queue's redrive: messages moved, "
                                 "remaining (an upper bound while it runs) and total", labels=["queue", "kind"])
        running = GaugeMetricFamily("doq_redrive_running", "1 while a redrive of the queue runs", labels=["queue"])
        rate = GaugeMetricFamily("doq_redrive_max_per_second", "The redrive's rate limit (0: none)", labels=["queue"])
        for name in sorted(view.redrives):
            p = progress(view.redrives[name], view)
            for kind, n in (("moved", p.moved), ("remaining", p.remaining), ("total", p.total)):
                msgs.add_metric([name, kind], n)
            running.add_metric([name], 1.0 if p.state == RD.RUNNING else 0.0)
            rate.add_metric([name], p.max_per_second)
        yield msgs
        yield running
        yield rate

    def describe(self) -> Iterator[Metric]:
        return iter(())
