"""`RateHistory`: a ring of each queue's cumulative counters, bounded in samples and in
queues; a queue deleted, or whose counters went back, starts again."""

from __future__ import annotations

import asyncio

from doq.queues.model import QueueCounters, QueueInfo, QueueSettings, QueueStats, QueueType
from doq.service.rate_history import RateHistory, Sample, run_sampler


def info(name: str, enqueued: int, delivered: int = 0, acked: int = 0) -> QueueInfo:
    return QueueInfo(name, QueueType.DELAYED, QueueSettings(), QueueStats(),
                     QueueCounters(enqueued, delivered, acked))


def test_keeps_the_last_samples_of_each_queue_oldest_first() -> None:
    h = RateHistory(interval_s=5, keep=3)
    for t in range(5):
        h.record(1000 * t, [info("a", 10 * t, 5 * t, t), info("b", t)])
    assert h.samples("a") == [Sample(2000, 20, 10, 2), Sample(3000, 30, 15, 3), Sample(4000, 40, 20, 4)]
    assert [s.enqueued for s in h.samples("b")] == [2, 3, 4]
    assert h.samples("nope") == []


def test_bounded_in_queues_by_name_and_forgets_deleted_ones() -> None:
    h = RateHistory(keep=10, max_queues=2)
    h.record(1, [info("c", 1), info("a", 1), info("b", 1)])
    assert (h.queues, h.samples("c")) == (2, [])
    h.record(2, [info("a", 2)])  # b and c are gone
    assert h.queues == 1 and [s.time_ms for s in h.samples("a")] == [1, 2]
    h.record(3, [info("a", 3), info("b", 3)])
    assert [s.time_ms for s in h.samples("b")] == [3]  # b came back: a new history


def test_counters_that_go_back_start_a_new_history() -> None:
    h = RateHistory()
    h.record(1, [info("a", 100, 90, 80)])
    h.record(2, [info("a", 110, 95, 85)])
    h.record(3, [info("a", 5, 0, 0)])  # deleted and created again between two samples
    assert h.samples("a") == [Sample(3, 5, 0, 0)]


async def test_the_sampler_records_until_cancelled_and_survives_a_failing_read() -> None:
    h = RateHistory(interval_s=0.001)
    calls = 0

    def list_queues() -> list[QueueInfo]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a read failed")
        return [info("a", calls)]

    async def three_samples() -> None:
        while len(h.samples("a")) < 3:
            await asyncio.sleep(0.001)

    task = asyncio.create_task(run_sampler(h, list_queues, clock_ms=lambda: calls))
    await asyncio.wait_for(three_samples(), 30)
    task.cancel()
    assert [s.enqueued for s in h.samples("a")][:3] == [1, 3, 4]
