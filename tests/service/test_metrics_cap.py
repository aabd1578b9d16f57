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


def test_the_oldest_message_age_of_the_largest_queues_and_the_oldest_of_the_rest() -> None:
    queues = [_q(f"q{i}", ready=i) for i in range(6)]  # q0 holds nothing: no age
    enqueued = {f"q{i}": 1_000_000 - 1000 * i for i in range(1, 6)}  # q5 is the oldest
    asked: list[str] = []

    def oldest(names: object) -> dict[str, int]:
        asked.extend(names)  # type: ignore[call-overload]
        return {n: enqueued[n] for n in asked}

    families = list(QueueDepthCollector(lambda: queues, lambda: True, max_queue_series=3,
                                        oldest_enqueued_ms=oldest, now_ms=lambda: 1_010_000).collect())
    ages = next(f for f in families if f.name == "doq_queue_oldest_message_age_seconds")
    assert asked == ["q1", "q2", "q3", "q4", "q5"]
    assert {s.labels["queue"]: s.value for s in ages.samples} == {
        "q3": 13.0, "q4": 14.0, "q5": 15.0, OTHER_QUEUES: 12.0}


def test_throttled_groups_of_the_largest_fair_queues() -> None:
    queues = [QueueInfo(f"f{i}", QueueType.FAIR, QueueSettings(), QueueStats(10 + i, 0, 0, 0)) for i in range(3)]
    queues.append(_q("d", ready=100))  # a delayed queue has no groups: not asked
    asked: list[str] = []

    def throttled(names: object) -> dict[str, int]:
        asked.extend(names)  # type: ignore[call-overload]
        return {n: 4 for n in asked if n == "f2"}

    families = list(QueueDepthCollector(lambda: queues, lambda: True, max_queue_series=3,
                                        throttled_groups=throttled).collect())
    fam = next(f for f in families if f.name == "doq_queue_groups_throttled")
    assert sorted(asked) == ["f1", "f2"]  # the largest three: d, f2, f1
    assert {s.labels["queue"]: s.value for s in fam.samples} == {"f2": 4.0}
