"""The chaos checker: a pure function from a recorded history to the anomalies it shows.

A history is a list of `Op`s in the style of Jepsen's: a client operation is an `invoke`
followed by its completion, `ok` (it happened), `fail` (it certainly did not happen) or
`info` (unknown: the connection broke, a deadline passed). `f` names the operation:

- `enqueue` (queue, payload; `ok` carries the stored `id`). Every payload is unique, and
  retries of one payload carry the same dedup id, so they are attempts of one message.
- `deliver` (always `ok`): a consumer received message `id` with `payload` under lease
  `lease_id`, expiring at `lease_expires_at_ms` (server time) after a visibility timeout
  of `visibility_timeout_ms`, so the lease began at `lease_expires_at_ms -
  visibility_timeout_ms`.
- `ack` (queue, id, lease_id). An ack without a completion (sent in a stream, never
  confirmed) has an unknown outcome.

`t` is the recording process's monotonic clock in seconds; it orders client events. Lease
times are the server's (replicated) clock, compared only with each other.

`check` reports (the first four must be 0):
- lost: a payload whose enqueue was acknowledged and that was never delivered;
- duplicated: a delivery of a message received after an ack of it was acknowledged,
  other than a late receipt of a lease granted before the acked one;
- unexpected: a delivery of a payload never enqueued, or refused, or of an id that was
  acknowledged for another payload;
- double_leased: a delivery whose lease began before another lease of the same message
  ended (by more than `skew_margin_ms`);
- dedup_failed: a payload stored under two ids (a retry was not idempotent);
and, allowed: redeliveries (deliveries after the first of a message, not duplicated) and
unknown_delivered (payloads whose enqueue outcome was unknown, delivered).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
ENQUEUE, DELIVER, ACK = "enqueue", "deliver", "ack"

#: anomalies that must be zero (in report order)
ANOMALIES = ("lost", "duplicated", "unexpected", "double_leased", "dedup_failed")
EXAMPLES_PER_ANOMALY = 5


@dataclass(frozen=True, slots=True)
class Op:
    """One history event (see the module docstring)."""

    type: str  # invoke | ok | fail | info
    f: str  # enqueue | deliver | ack
    process: str  # the worker that recorded it
    t: float  # monotonic seconds
    queue: str
    payload: str = ""
    id: int = 0
    lease_id: int = 0
    lease_expires_at_ms: int = 0
    visibility_timeout_ms: int = 0

    @property
    def lease_start_ms(self) -> int:
        return self.lease_expires_at_ms - self.visibility_timeout_ms

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Op:
        return cls(**d)


@dataclass(slots=True)
class Report:
    """What `check` found; `examples` holds a few offending events per anomaly."""

    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    double_leased: int = 0
    dedup_failed: int = 0
    redeliveries: int = 0
    unknown_delivered: int = 0
    enqueue_ok: int = 0
    enqueue_unknown: int = 0
    enqueue_failed: int = 0
    enqueue_retried: int = 0
    delivered: int = 0
    acks_ok: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return sum(getattr(self, a) for a in ANOMALIES)

    @property
    def valid(self) -> bool:
        return self.anomalies == 0

    def counts(self) -> dict[str, int]:
        """Every count, without the examples."""
        d = asdict(self)
        del d["examples"]
        return d

    def note(self, anomaly: str, what: str) -> None:
        setattr(self, anomaly, getattr(self, anomaly) + 1)
        ex = self.examples.setdefault(anomaly, [])
        if len(ex) < EXAMPLES_PER_ANOMALY:
            ex.append(what)


@dataclass(slots=True)
class _Enqueue:
    """Everything the history says about one payload's enqueue attempts."""

    ids: set[int] = field(default_factory=set)  # acknowledged ids
    attempts: int = 0
    open_attempts: int = 0  # invoked, not completed
    unknown: bool = False
    failed: bool = False

    @property
    def outcome(self) -> str:
        if self.ids:
            return OK
        return INFO if self.unknown or self.open_attempts else FAIL


def check(history: Iterable[Op], *, skew_margin_ms: int = 100) -> Report:
    """Check a complete history (after the final drain); see the module docstring."""
    report = Report()
    enqueues: dict[tuple[str, str], _Enqueue] = defaultdict(_Enqueue)
    id_payload: dict[tuple[str, int], str] = {}  # acknowledged (queue, id) -> payload
    deliveries: dict[tuple[str, int], list[Op]] = defaultdict(list)
    acks: list[Op] = []
    for op in history:
        if op.f == ENQUEUE:
            e = enqueues[(op.queue, op.payload)]
            if op.type == INVOKE:
                e.attempts += 1
                e.open_attempts += 1
                continue
            e.open_attempts = max(0, e.open_attempts - 1)
            if op.type == OK:
                e.ids.add(op.id)
                id_payload.setdefault((op.queue, op.id), op.payload)
            elif op.type == FAIL:
                e.failed = True
            else:
                e.unknown = True
        elif op.f == DELIVER:
            deliveries[(op.queue, op.id)].append(op)
        elif op.f == ACK and op.type == OK:
            acks.append(op)
    report.delivered = sum(len(ds) for ds in deliveries.values())
    report.acks_ok = len(acks)
    for e in enqueues.values():
        o = e.outcome
        report.enqueue_ok += o == OK
        report.enqueue_unknown += o == INFO
        report.enqueue_failed += o == FAIL
        report.enqueue_retried += e.attempts > 1

    delivered_payloads: dict[tuple[str, str], set[int]] = defaultdict(set)
    for (queue, id_), ds in deliveries.items():
        for d in ds:
            delivered_payloads[(queue, d.payload)].add(id_)
            known = enqueues.get((queue, d.payload))
            if known is None or known.outcome == FAIL:
                report.note("unexpected", f"{_desc(d)}: never enqueued"
                            if known is None else f"{_desc(d)}: its enqueue was refused")
            elif id_payload.get((queue, id_), d.payload) != d.payload:
                report.note("unexpected", f"{_desc(d)}: id {id_} was acknowledged for "
                            f"{id_payload[(queue, id_)]!r}")
    for (queue, payload), e in enqueues.items():
        got = delivered_payloads.get((queue, payload), set())
        if e.outcome == OK and not got:
            report.note("lost", f"{queue}/{payload!r} acknowledged as id(s) {sorted(e.ids)}")
        if got and e.outcome == INFO:
            report.unknown_delivered += 1
        if len(e.ids | got) > 1:
            report.note("dedup_failed", f"{queue}/{payload!r} stored as ids {sorted(e.ids | got)}")

    dup = _duplicates(deliveries, acks, skew_margin_ms)
    for d in dup.values():
        report.note("duplicated", f"{_desc(d)} after its ack was acknowledged")
    for ds in deliveries.values():
        report.redeliveries += max(0, len(ds) - 1 - sum(1 for d in ds if id(d) in dup))
        for d, other in _overlaps(ds, skew_margin_ms):
            report.note("double_leased", f"{_desc(d)} while lease {other.lease_id} of "
                        f"{other.process} ran until {other.lease_expires_at_ms}")
    return report


def _duplicates(deliveries: dict[tuple[str, int], list[Op]], acks: Sequence[Op],
                skew_margin_ms: int) -> dict[int, Op]:
    """Deliveries (by object id) received after an acknowledged ack of their message, except late receipts
    of leases granted before the acked one (starting no later than it, within the skew margin: lease ids
    are random, not ordered; a redelivery after the ack would start at least a visibility timeout later)."""
    out: dict[int, Op] = {}
    for a in acks:
        ds = deliveries.get((a.queue, a.id), [])
        acked = next((d for d in ds if d.lease_id == a.lease_id and d.t <= a.t), None)
        for d in ds:
            if d is acked or d.t <= a.t:
                continue
            earlier = acked is not None and d.lease_start_ms <= acked.lease_start_ms + skew_margin_ms
            if not earlier:
                out[id(d)] = d
    return out


def _overlaps(ds: list[Op], skew_margin_ms: int) -> list[tuple[Op, Op]]:
    """(delivery, lease it overlapped) pairs: a lease beginning more than `skew_margin_ms`
    before an earlier-begun lease of the same message expired."""
    leased = sorted((d for d in ds if d.lease_id), key=lambda d: (d.lease_start_ms, d.lease_id))
    out: list[tuple[Op, Op]] = []
    holder: Op | None = None  # the lease that runs longest so far
    for d in leased:
        if holder is not None and d.lease_start_ms + skew_margin_ms < holder.lease_expires_at_ms:
            out.append((d, holder))
        if holder is None or d.lease_expires_at_ms > holder.lease_expires_at_ms:
            holder = d
    return out


def failover_times_ms(history: Sequence[Op], fault_times: Sequence[float]) -> list[float | None]:
    """For each fault time (same clock as `Op.t`): milliseconds until the first enqueue
    invoked at or after it was acknowledged (None if none was)."""
    invoked: dict[tuple[str, str], float] = {}
    oks: list[tuple[float, float]] = []  # (invoke t, ok t)
    for op in history:
        if op.f != ENQUEUE:
            continue
        key = (op.queue, op.payload)
        if op.type == INVOKE:
            invoked[key] = op.t
        elif op.type == OK and key in invoked:
            oks.append((invoked[key], op.t))
    oks.sort()
    first_ok_from = [0.0] * len(oks)  # earliest ok among attempts invoked at or after oks[i]
    best = float("inf")
    for i in range(len(oks) - 1, -1, -1):
        best = min(best, oks[i][1])
        first_ok_from[i] = best
    out: list[float | None] = []
    for tf in fault_times:
        i = bisect.bisect_left(oks, (tf, float("-inf")))
        out.append(round((first_ok_from[i] - tf) * 1000, 1) if i < len(oks) else None)
    return out


def _desc(d: Op) -> str:
    return (f"{d.queue}/{d.id} {d.payload!r} lease {d.lease_id} "
            f"[{d.lease_start_ms}, {d.lease_expires_at_ms}) to {d.process} at t={d.t:.3f}")
