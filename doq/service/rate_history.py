"""The node's memory of its queues' counters over the last minutes, for rate charts that
do not start empty when a page opens (`GET /API/v1/queues/{name}/history`).

`RateHistory.record` takes one sample of every queue's cumulative counters
(`QueueCounters`: enqueued, delivered, acked) at a time; `run_sampler` calls it every
`interval_s` for as long as the node serves. A rate is the difference of two samples
divided by the time between them. Memory is bounded: at most `keep` samples per queue
(10 minutes at the default 5 s), of at most `max_queues` queues (by name; the rest are not
kept), four integers a sample. A queue that disappears, or whose counters go back (it was
deleted and created again, or the node restarted), starts a new history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from doq.queues.model import QueueInfo

log = logging.getLogger(__name__)
DEFAULT_INTERVAL_S = 5.0
DEFAULT_KEEP = 120  # samples per queue: 10 minutes at the default interval
DEFAULT_MAX_QUEUES = 1000
_FIELDS = 4  # time_ms, enqueued, delivered, acked


@dataclass(frozen=True, slots=True)
class Sample:
    time_ms: int
    enqueued: int
    delivered: int
    acked: int


class RateHistory:
    """Per queue, a ring of its last `keep` samples (flat `array('q')`: 32 bytes a sample)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, keep: int = DEFAULT_KEEP,
                 max_queues: int = DEFAULT_MAX_QUEUES) -> None:
        self.interval_s = interval_s
        self.keep = keep
        self.max_queues = max_queues
        self._rings: dict[str, array[int]] = {}

    def record(self, time_ms: int, queues: Iterable[QueueInfo]) -> None:
        """One sample of every queue in `queues` (the first `max_queues` by name) at `time_ms`."""
        kept = sorted(queues, key=lambda q: q.name)[: self.max_queues]
        rings: dict[str, array[int]] = {}
        for q in kept:
            c = q.counters
            ring = self._rings.get(q.name)
            if ring is None or (len(ring) and _went_back(ring, c.enqueued, c.delivered, c.acked)):
                ring = array("q")
            ring.extend((time_ms, c.enqueued, c.delivered, c.acked))
            if len(ring) > self.keep * _FIELDS:
                del ring[: len(ring) - self.keep * _FIELDS]
            rings[q.name] = ring
        self._rings = rings  # queues gone since the last sample are forgotten

    def samples(self, queue: str) -> list[Sample]:
        """`queue`'s samples, oldest first ([] if none are kept)."""
        ring = self._rings.get(queue)
        if ring is None:
            return []
        return [Sample(*ring[i:i + _FIELDS]) for i in range(0, len(ring), _FIELDS)]

    @property
    def queues(self) -> int:
        return len(self._rings)


def _went_back(ring: array[int], enqueued: int, delivered: int, acked: int) -> bool:
    return enqueued < ring[-3] or delivered < ring[-2] or acked < ring[-1]


async def run_sampler(history: RateHistory, list_queues: Callable[[], list[QueueInfo]],
                      clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
    """Record a sample now and every `history.interval_s` until cancelled. `list_queues`
    reads the node's published view (nothing proposed, no Raft round trip)."""
    while True:
        try:
            history.record(clock_ms(), list_queues())
        except Exception:  # a sampler must never take the node down
            log.exception("recording queue rates failed")
        await asyncio.sleep(history.interval_s)
