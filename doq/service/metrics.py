"""Prometheus metrics of a node (exposed by the HTTP gateway at /metrics).

Process-wide: commit and fsync latency (observed by the node), message counters by
transport (counted by the service facade and its sessions, never by the adapters), the gRPC calls a follower relays to the leader (once per call or stream, and
those in progress). Per app: queue depths and leadership, collected at scrape time from
the node (`QueueDepthCollector`), so a scrape always shows the current state. No label
takes values from clients without a bound: per-queue series are capped
(`MAX_QUEUE_SERIES`, the rest summed under `queue="_other"`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from doq.node.alarms import Alarm
from doq.node.cluster import StorageUsage
from doq.queues.model import QueueInfo, QueueType

COMMIT_SECONDS = Histogram(
    "doq_commit_seconds",
    "Time of one durable write (append entries, apply the committed ones, commit with fsync)",
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)
FSYNC_SECONDS = Histogram(
    "doq_fsync_seconds",
    "Time of the LMDB commit (fsync) of one durable write",
    buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
)
COMMANDS = Counter("doq_commands_applied_total", "Commands applied by this node")
LEASES_ENDED_BEFORE_DELIVERY = Counter(
    "doq_leases_ended_before_delivery_total",
    "Messages a dequeue leased whose lease had ended when its commit came back (e.g. after a "
    "quorum loss): released (ready again, the attempt not counted) instead of handed out")
BATCHES = Counter("doq_batches_committed_total", "Durable writes of this node that applied commands")

MESSAGES_ENQUEUED = Counter(
    "doq_messages_enqueued_total", "Messages enqueued (new, not deduplicated) through this node", ["transport"]
)
MESSAGES_DEQUEUED = Counter("doq_messages_dequeued_total", "Messages delivered by this node", ["transport"])
MESSAGES_ACKED = Counter("doq_messages_acked_total", "Messages acked through this node", ["transport"])

GRPC_FORWARDED = Counter(
    "doq_grpc_forwarded_calls_total", "gRPC calls this node (a follower) relayed to the leader", ["method"]
)
GRPC_FORWARDING = Gauge("doq_grpc_forwarded_calls_in_progress", "gRPC calls this node is relaying to the leader now")


class Transport:
    """Pre-bound counter children of one transport (label lookups off the hot path)."""

    def __init__(self, name: str) -> None:
        self.enqueued = MESSAGES_ENQUEUED.labels(name)
        self.dequeued = MESSAGES_DEQUEUED.labels(name)
        self.acked = MESSAGES_ACKED.labels(name)


HTTP = Transport("http")
GRPC = Transport("grpc")
_TRANSPORTS = {"http": HTTP, "grpc": GRPC}


def transport(name: str) -> Transport:
    """The counters of transport `name` (one set per name for the process)."""
    t = _TRANSPORTS.get(name)
    if t is None:
        t = _TRANSPORTS[name] = Transport(name)
    return t


def observe_applied(commands: int) -> None:
    """Called by the node once it has applied a batch of `commands` commands (one write's),
    before their answers leave: whoever hears an answer finds its command counted."""
    if commands:
        COMMANDS.inc(commands)
        BATCHES.inc()


def observe_commit(commit_seconds: float, fsync_seconds: float | None) -> None:
    """Called by the node after each durable write, also one that only appended entries or
    stored a vote; `fsync_seconds` is its LMDB commit's time, None when the write had
    nothing for LMDB or left its transaction held (a leader's append-only write, a write
    of the batched commit, docs/raft.md: no `doq_fsync_seconds` sample; the write that
    commits a held transaction has one); also after a commit of a held transaction that a
    direct reader of the state asked for (both samples: that commit's time)."""
    COMMIT_SECONDS.observe(commit_seconds)
    if fsync_seconds is not None:
        FSYNC_SECONDS.observe(fsync_seconds)


MAX_QUEUE_SERIES = 100  # queues with series of their own in doq_queue_messages; the rest are summed
OTHER_QUEUES = "_other"  # their label: never a queue name (a name starts with a letter or digit)
_STATES = ("ready", "delayed", "in_flight", "dead")


def _counts(q: QueueInfo) -> tuple[int, int, int, int]:
    st = q.stats
    return st.ready, st.delayed, st.in_flight, st.dead


class QueueDepthCollector(Collector):
    """Gauges read at scrape time: messages per queue and state, whether this node leads,
    and how many long polls are parked waiting for a message.

    Bounded whatever the number of queues: `doq_queue_messages` has series of their own for
    the `max_queue_series` queues holding the most messages (ready + delayed + in flight +
    dead; ties by name), and one `queue="_other"` series per state summing the others (only
    when there are others); `doq_queues` counts them all.
    `doq_queue_groups_throttled` (with `throttled_groups`) counts, for those of them that are
    fair queues, the groups over their rate now.
    `doq_queue_oldest_message_age_seconds` (with `oldest_enqueued_ms`, `State.oldest_enqueued_ms`)
    has a series for each of those queues that holds a message, `_other` the oldest of the
    rest: one record read per queue holding messages, per scrape."""

    def __init__(self, list_queues: Callable[[], Iterable[QueueInfo]], is_leader: Callable[[], bool],
                 long_polls_waiting: Callable[[], int] = lambda: 0, *,
                 max_queue_series: int = MAX_QUEUE_SERIES,
                 oldest_enqueued_ms: Callable[[Iterable[str]], dict[str, int]] | None = None,
                 throttled_groups: Callable[[Iterable[str]], dict[str, int]] | None = None,
                 now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self._list_queues = list_queues
        self._is_leader = is_leader
        self._long_polls_waiting = long_polls_waiting
        self._max_series = max_queue_series
        self._oldest = oldest_enqueued_ms
        self._throttled = throttled_groups
        self._now_ms = now_ms

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "doq_queue_messages", "Messages in a queue by state (ready, delayed, in_flight, dead); "
            f"queue=\"{OTHER_QUEUES}\" sums the queues past the largest {self._max_series}",
            labels=["queue", "state"],
        )
        all_queues = list(self._list_queues())
        top = heapq.nsmallest(self._max_series, all_queues, key=lambda q: (-sum(_counts(q)), q.name))
        for q in sorted(top, key=lambda q: q.name):
            for state, n in zip(_STATES, _counts(q), strict=True):
                depth.add_metric([q.name, state], n)
        if len(all_queues) > len(top):
            shown = {q.name for q in top}
            other = [sum(col) for col in zip(*(_counts(q) for q in all_queues if q.name not in shown), strict=True)]
            for state, n in zip(_STATES, other, strict=True):
                depth.add_metric([OTHER_QUEUES, state], n)
        if self._oldest is not None:
            yield self._ages(all_queues, {q.name for q in top})
        if self._throttled is not None:
            throttled = GaugeMetricFamily(
                "doq_queue_groups_throttled", "A fair queue's groups waiting for their rate (max_per_second) now; "
                "series for the largest queues that have any", labels=["queue"])
            for name, n in sorted(self._throttled(q.name for q in top if q.type is QueueType.FAIR).items()):
                throttled.add_metric([name], n)
            yield throttled
        queues = GaugeMetricFamily("doq_queues", "Queues on this node")
        queues.add_metric([], len(all_queues))
        leader = GaugeMetricFamily("doq_node_is_leader", "1 if this node is the leader")
        leader.add_metric([], 1.0 if self._is_leader() else 0.0)
        waiting = GaugeMetricFamily("doq_long_polls_waiting", "Long polls (dequeues with wait_ms) parked for a message")
        waiting.add_metric([], self._long_polls_waiting())
        yield depth
        yield queues
        yield leader
        yield waiting

    def _ages(self, all_queues: list[QueueInfo], shown: set[str]) -> Metric:
        assert self._oldest is not None
        family = GaugeMetricFamily(
            "doq_queue_oldest_message_age_seconds",
            "How long the queue's oldest message (any state) has been in it; queue=\"_other\" "
            "is the oldest of the queues past the largest " + str(self._max_series),
            labels=["queue"])
        enqueued = self._oldest(q.name for q in all_queues if q.stats.total)
        now = self._now_ms()
        other: int | None = None
        for name in sorted(enqueued):
            if name in shown:
                family.add_metric([name], max(0, now - enqueued[name]) / 1000)
            elif other is None or enqueued[name] < other:
                other = enqueued[name]
        if other is not None:
            family.add_metric([OTHER_QUEUES], max(0, now - other) / 1000)
        return family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected at scrape time only


class AlarmCollector(Collector):
    """`doq_storage_alarm{node, reason}`: 1 for each storage alarm on (this node's, and on
    the leader its members'), read at scrape time; no series while none is on."""

    def __init__(self, alarms: Callable[[], Iterable[Alarm]]) -> None:
        self._alarms = alarms

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "doq_storage_alarm", "1 while a storage alarm is on (writes that grow the state are refused)",
            labels=["node", "reason"])
        for a in self._alarms():
            family.add_metric([a.node_id, a.reason], 1.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class StorageCollector(Collector):
    """This node's store, read at scrape time (`doq.node.cluster.StorageUsage`; no series
    for a node that measures none): `doq_storage_used_bytes`, `doq_storage_limit_bytes`
    (`--max-data-size`), `doq_disk_free_bytes` (once measured), `doq_disk_free_limit_bytes`."""

    def __init__(self, usage: Callable[[], StorageUsage | None]) -> None:
        self._usage = usage

    def collect(self) -> Iterator[Metric]:
        u = self._usage()
        if u is None:
            return
        for name, doc, value in (
            ("doq_storage_used_bytes", "What this node's store takes (the data size --max-data-size limits)",
             u.used_bytes),
            ("doq_storage_limit_bytes", "This node's --max-data-size", u.max_bytes),
            ("doq_disk_free_bytes", "Free bytes on the file system of this node's data directory",
             u.disk_free_bytes),
            ("doq_disk_free_limit_bytes", "This node's --disk-free-limit", u.disk_free_limit_bytes),
        ):
            if value is not None:
                family = GaugeMetricFamily(name, doc)
                family.add_metric([], value)
                yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


def render(*registries: CollectorRegistry) -> bytes:
    """Prometheus text format of the process-wide registry plus `registries`."""
    return b"".join(generate_latest(r) for r in (REGISTRY, *registries))
