"""`QueueService` over a real `LocalNode` and real LMDB files: results come from the apply,
reads see one committed state while the writer runs, an empty dequeue writes nothing, and
a commit wakes only as many long polls as it can serve."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.errors import InvalidArgument, QueueNotFound
from doq.queues import commands as c
from doq.queues.model import QueueInfo, QueueSettings
from doq.service.api import QueueService
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.support.local_node import LocalNode


class Counted:
    """Commands applied by the node (its `on_applied` hook, as the metrics see it)."""

    def __init__(self) -> None:
        self.commands = 0

    def __call__(self, commands: int) -> None:
        self.commands += commands


@pytest.fixture
async def svc(tmp_path: Path) -> AsyncIterator[tuple[QueueService, Counted]]:
    counted = Counted()
    node = LocalNode(StateStore(open_env(tmp_path / "db", map_size=256 * 1024**2)), on_applied=counted)
    await node.start()
    yield QueueService(node), counted
    await node.stop()


async def _until(what: str, check: object, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


async def test_create_and_update_answer_from_the_apply_even_if_a_delete_follows(svc) -> None:
    api, _ = svc
    # proposed together: one entry applies create, then delete, then create/update of another
    create = asyncio.ensure_future(api.create_queue("x", "fair", QueueSettings(max_attempts=3)))
    delete = asyncio.ensure_future(api.delete_queue("x"))
    info = await create
    await delete
    assert isinstance(info, QueueInfo) and info.name == "x" and info.settings.max_attempts == 3
    await api.create_queue("y")
    update = asyncio.ensure_future(api.update_queue("y", QueueSettings(visibility_timeout_ms=5)))
    gone = asyncio.ensure_future(api.delete_queue("y"))
    assert (await update).settings.visibility_timeout_ms == 5
    await gone
    with pytest.raises(QueueNotFound):
        await api.get_queue("y")


async def test_an_empty_dequeue_is_not_proposed(svc) -> None:
    api, counted = svc
    await api.create_queue("jobs")
    node = api.node
    applied, commands = node.applied_index, counted.commands
    for ack in (False, True):
        assert await api.dequeue("jobs", ack=ack, max_messages=10) == []
    assert await api.dequeue("jobs", wait_ms=30) == []  # a long poll that times out
    with pytest.raises(QueueNotFound):
        await api.dequeue("nope")
    assert (node.applied_index, counted.commands) == (applied, commands)  # nothing written


async def test_a_commit_wakes_only_as_many_long_polls_as_it_can_serve(svc) -> None:
    api, counted = svc
    await api.create_queue("jobs")
    polls = [asyncio.ensure_future(api.dequeue("jobs", ack=True, wait_ms=20_000)) for _ in range(20)]
    await _until("all 20 are parked", lambda: api.long_polls.waiting("jobs") == 20)
    before = counted.commands
    await api.enqueue_many([("jobs", c.EnqueueItem(b"m%d" % i)) for i in range(3)])  # one command
    await _until("three polls are served", lambda: sum(p.done() for p in polls) == 3)
    await api.create_queue("barrier")  # commits after anything the wake-ups proposed
    assert counted.commands - before <= 1 + 3 + 1  # the enqueue, at most 3 dequeues, the barrier
    assert api.long_polls.waiting("jobs") == 17
    got = sorted(m.content for p in polls if p.done() for m in p.result())
    assert got == [b"m0", b"m1", b"m2"]
    for p in polls:
        p.cancel()
    await asyncio.gather(*polls, return_exceptions=True)
    assert api.long_polls.waiting() == 0


async def test_a_cancelled_long_poll_passes_its_wake_up_on(svc) -> None:
    api, _ = svc
    await api.create_queue("jobs")
    first = asyncio.ensure_future(api.dequeue("jobs", ack=True, wait_ms=20_000))
    await _until("the first is parked", lambda: api.long_polls.waiting("jobs") == 1)
    second = asyncio.ensure_future(api.dequeue("jobs", ack=True, wait_ms=20_000))
    await _until("both are parked", lambda: api.long_polls.waiting("jobs") == 2)
    stop = asyncio.Event()
    third = asyncio.ensure_future(api.dequeue("jobs", ack=True, wait_ms=20_000, stop_waiting=stop))
    await _until("all are parked", lambda: api.long_polls.waiting("jobs") == 3)
    await api.enqueue("jobs", c.EnqueueItem(b"one"))
    first.cancel()  # woken first, but its caller went away before it proposed
    stop.set()
    assert [m.content for m in await second] == [b"one"]
    assert await third == []
    with pytest.raises(asyncio.CancelledError):
        await first
    assert api.long_polls.waiting() == 0


async def test_a_deleted_queue_ends_its_long_polls(svc) -> None:
    api, _ = svc
    await api.create_queue("jobs")
    poll = asyncio.ensure_future(api.dequeue("jobs", wait_ms=20_000))
    await _until("parked", lambda: api.long_polls.waiting("jobs") == 1)
    await api.delete_queue("jobs")
    with pytest.raises(QueueNotFound):
        await poll


async def test_reads_are_consistent_while_the_writer_runs(svc) -> None:
    """Messages cycle ready -> in flight -> ready (lease, nack) while queues are created and
    deleted around them; readers on another thread and on the loop never see a torn count."""
    api, _ = svc
    n = 300
    await api.create_queue("cycle")
    await api.enqueue_many([("cycle", c.EnqueueItem(b"m")) for _ in range(n)])
    state = api.node.state
    bad: list[object] = []
    done = threading.Event()

    def check(info: QueueInfo, total: int | None) -> None:
        s = info.stats
        if min(s.ready, s.delayed, s.in_flight, s.dead) < 0 or (total is not None and s.total != total):
            bad.append(info)

    def reader() -> None:
        while not done.is_set():
            check(state.get_queue("cycle"), n)
            for info in state.list_queues():
                check(info, n if info.name == "cycle" else None)

    async def cycle() -> None:
        for _ in range(6):
            msgs = await api.dequeue("cycle", max_messages=n, visibility_timeout_ms=60_000)
            check(await api.get_queue("cycle"), n)
            await asyncio.gather(*(api.nack("cycle", m.id, lease_id=m.lease_id) for m in msgs))

    async def churn() -> None:
        for i in range(40):
            name = f"t{i % 4}"
            made = asyncio.ensure_future(api.create_queue(name))
            filled = asyncio.ensure_future(api.enqueue_many([(name, c.EnqueueItem(b"x"))] * 5))
            dropped = asyncio.ensure_future(api.delete_queue(name))
            assert (await made).name == name  # never NOT_FOUND, even when the delete follows
            await asyncio.gather(filled, dropped, return_exceptions=True)

    t = threading.Thread(target=reader)
    t.start()
    try:
        await asyncio.gather(cycle(), churn())
    finally:
        done.set()
        t.join()
    assert bad == []
    assert (await api.get_queue("cycle")).stats.ready == n


async def test_max_messages_is_checked_by_the_bound_the_error_states(svc) -> None:
    """The service's rule is 1..max_batch_messages (as its error says); gRPC's "0 = 1" is
    the adapter's (proto DequeueRequest.max_messages), not a second copy here."""
    api, _ = svc
    await api.create_queue("jobs")
    for bad in (0, -1, api.limits.max_batch_messages + 1):
        with pytest.raises(InvalidArgument) as e:
            await api.dequeue("jobs", max_messages=bad)
        assert e.value.reason == "INVALID_MAX" and f"1..{api.limits.max_batch_messages}" in e.value.message


def _batches(api: QueueService) -> list[list[type]]:
    """Record the command types of every batch the machine applies from now on."""
    seen: list[list[type]] = []
    machine = api.node.state.machine
    real = machine.apply

    def spy(index: int, batch: c.CommandBatch) -> list[object]:
        seen.append([type(cmd) for cmd in batch.commands])
        return real(index, batch)

    machine.apply = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("columns", [False, True])
async def test_a_parked_leasing_poll_is_served_by_the_commit_that_stores_the_message(svc, columns: bool) -> None:
    api, _ = svc
    await api.create_queue("jobs")
    poll = asyncio.ensure_future(api.dequeue("jobs", wait_ms=20_000))  # leases (no ack)
    await _until("parked", lambda: api.long_polls.waiting("jobs") == 1)
    seen = _batches(api)
    if columns:
        await api.enqueue_columns(c.EnqueueColumns("jobs", [b"one"]))
    else:
        await api.enqueue("jobs", c.EnqueueItem(b"one"))
    msgs = await poll
    assert [m.content for m in msgs] == [b"one"] and msgs[0].lease_id
    enqueue = c.EnqueueColumns if columns else c.Enqueue
    assert [enqueue, c.Dequeue] in seen  # one log entry, one commit: enqueue then the lease


async def test_a_removing_poll_is_not_proposed_early(svc) -> None:
    api, _ = svc
    await api.create_queue("jobs")
    poll = asyncio.ensure_future(api.dequeue("jobs", ack=True, wait_ms=20_000))
    await _until("parked", lambda: api.long_polls.waiting("jobs") == 1)
    seen = _batches(api)
    await api.enqueue("jobs", c.EnqueueItem(b"one"))
    assert [m.content for m in await poll] == [b"one"]
    assert [c.Enqueue] in seen and [c.Enqueue, c.Dequeue] not in seen


async def test_a_leasing_poll_cancelled_after_its_early_dequeue_takes_nothing(svc) -> None:
    api, _ = svc
    await api.create_queue("jobs")
    poll = asyncio.ensure_future(api.dequeue("jobs", wait_ms=20_000))
    await _until("parked", lambda: api.long_polls.waiting("jobs") == 1)
    stored = api.enqueue_nowait("jobs", c.EnqueueItem(b"one"))  # proposes the poll's dequeue too
    poll.cancel()  # before the node takes the proposals: the early dequeue is dropped
    with pytest.raises(asyncio.CancelledError):
        await poll
    await stored
    msgs = await api.dequeue("jobs", wait_ms=5_000)
    assert [m.content for m in msgs] == [b"one"] and msgs[0].attempts == 1
    assert api.long_polls.waiting() == 0
