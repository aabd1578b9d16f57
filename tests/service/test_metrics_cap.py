"""`/metrics` stays bounded whatever the number of queues: `QueueDepthCollector` shows the
queues holding the most messages and sums the others under `queue="_other"`."""

from __future__ import annotations

from doq.queues.model import QueueInfo, QueueSettings, QueueStats, QueueType
from doq.service.metrics import OTHER_QUEUES, QueueDepthCollector


def _q(name: str, ready: int, delayed: int = 0, in_flight: int = 0, dead: int = 0) -> QueueInfo:
    return QueueInfo(name, QueueType.DELAYED, QueueSettings(), QueueStats(ready, delayed, in_flight, dead))


def _series(queues: list[QueueInfo], cap: int) -> dict[tuple[str, str], float]:
    families = list(QueueDepthCollector(lambda: queues, lambda: True, max_queue_series=cap).collect())
    depth = next(f for f in families if f.name == "doq_queue_messages")
    count = next(f for f in families if f.name == "doq_queues")
    assert count.samples[0].value == len(queues)
    return {(s.labels["queue"], s.labels["state"]): s.value for s in depth.samples}


def test_the_largest_queues_have_series_and_the_rest_are_summed() -> None:
    queues = [_q(f"q{i}", ready=i, delayed=1, in_flight=1, dead=2) for i in range(50)]
    got = _series(queues, cap=5)
    shown = {q for q, _ in got} - {OTHER_QUEUES}
    assert shown == {"q45", "q46", "q47", "q48", "q49"} and len(got) == 6 * 4
    rest = queues[:45]
    assert got[(OTHER_QUEUES, "ready")] == sum(q.stats.ready for q in rest)
    assert got[(OTHER_QUEUES, "in_flight")] == 45
    assert got[(OTHER_QUEUES, "delayed")] == 45 and got[(OTHER_QUEUES, "dead")] == 90
    assert got[("q49", "ready")] == 49


def test_no_other_series_when_every_queue_fits_and_ties_go_by_name() -> None:
    assert {q for q, _ in _series([_q("b", 1), _q("a", 1)], cap=5)} == {"a", "b"}
    assert {q for q, _ in _series([_q("c", 0), _q("b", 0), _q("a", 0)], cap=2)} == {"a", "b", OTHER_QUEUES}
