"""The chaos checker on hand-built histories: each anomaly is found, and each allowed
behaviour (redelivery after a lease expired, an unknown enqueue delivered, a late receipt
of an earlier lease) is not reported as one."""

from __future__ import annotations

from tools.chaos.checker import Op, Report, check, failover_times_ms

Q = "q"
VIS = 1000


def enq(payload: str, t: float, id_: int | None, outcome: str = "ok") -> list[Op]:
    """An enqueue attempt: invoke at t, completion at t + 0.01 (`id_` when ok)."""
    done = Op(outcome, "enqueue", "p1", t + 0.01, Q, payload, id_ or 0)
    return [Op("invoke", "enqueue", "p1", t, Q, payload), done]


def deliver(payload: str, id_: int, lease_id: int, start_ms: int, t: float,
            consumer: str = "c1") -> Op:
    return Op("ok", "deliver", consumer, t, Q, payload, id_, lease_id, start_ms + VIS, VIS)


def ack(id_: int, lease_id: int, t: float, outcome: str = "ok", consumer: str = "c1") -> list[Op]:
    return [Op("invoke", "ack", consumer, t, Q, id=id_, lease_id=lease_id),
            Op(outcome, "ack", consumer, t + 0.01, Q, id=id_, lease_id=lease_id)]


def anomalies(r: Report) -> dict[str, int]:
    return {k: v for k, v in r.counts().items()
            if k in ("lost", "duplicated", "unexpected", "double_leased", "dedup_failed") and v}


def test_a_clean_history_with_a_redelivery_after_expiry_is_valid() -> None:
    h = [*enq("a", 0.0, 1), *enq("b", 0.1, 2),
         deliver("a", 1, 10, start_ms=1000, t=0.2), *ack(1, 10, 0.3),
         deliver("b", 2, 11, start_ms=1000, t=0.2),  # never acked: the lease runs out
         deliver("b", 2, 12, start_ms=2000, t=1.3, consumer="c2"), *ack(2, 12, 1.4, consumer="c2")]
    r = check(h)
    assert r.valid and anomalies(r) == {}
    assert (r.enqueue_ok, r.delivered, r.acks_ok, r.redeliveries) == (2, 3, 2, 1)


def test_an_acknowledged_enqueue_never_delivered_is_lost() -> None:
    h = [*enq("kept", 0.0, 1), *enq("gone", 0.1, 2), deliver("kept", 1, 5, 1000, 0.5)]
    r = check(h)
    assert anomalies(r) == {"lost": 1} and "gone" in r.examples["lost"][0]


def test_unknown_and_refused_enqueues_may_stay_undelivered() -> None:
    h = [*enq("maybe", 0.0, None, "info"), *enq("refused", 0.1, None, "fail"),
         Op("invoke", "enqueue", "p1", 0.2, Q, "never-completed")]
    r = check(h)
    assert r.valid and (r.enqueue_unknown, r.enqueue_failed) == (2, 1)


def test_a_retry_that_lands_is_acknowledged_and_delivered_once() -> None:
    h = [*enq("x", 0.0, None, "info"), *enq("x", 1.0, 7), deliver("x", 7, 1, 1000, 1.5)]
    r = check(h)
    assert r.valid and (r.enqueue_ok, r.unknown_delivered, r.enqueue_retried) == (1, 0, 1)


def test_an_unknown_enqueue_that_is_delivered_is_allowed_and_counted() -> None:
    h = [*enq("u", 0.0, None, "info"), deliver("u", 3, 1, 1000, 0.5),
         Op("invoke", "enqueue", "p1", 0.6, Q, "open"), deliver("open", 4, 2, 1000, 0.7)]
    r = check(h)
    assert r.valid and r.unknown_delivered == 2


def test_a_delivery_after_an_acknowledged_ack_is_duplicated() -> None:
    h = [*enq("a", 0.0, 1), deliver("a", 1, 10, 1000, 0.1), *ack(1, 10, 0.2),
         deliver("a", 1, 11, 5000, 3.0, consumer="c2")]
    r = check(h)
    assert anomalies(r) == {"duplicated": 1} and r.redeliveries == 0


def test_a_reissued_lease_id_after_the_ack_is_duplicated() -> None:
    # e.g. the ack and the lease counter were lost in a crash: the same lease id comes back
    h = [*enq("a", 0.0, 1), deliver("a", 1, 10, 1000, 0.1), *ack(1, 10, 0.2),
         deliver("a", 1, 10, 4000, 3.0)]
    assert anomalies(check(h)) == {"duplicated": 1}


def test_a_late_receipt_of_an_earlier_lease_is_not_duplicated() -> None:
    # lease 10 (c1) expired, lease 11 went to c2 and was acked; c1's thread reads lease 10 late
    h = [*enq("a", 0.0, 1), deliver("a", 1, 11, 2000, 0.1, consumer="c2"), *ack(1, 11, 0.2, consumer="c2"),
         deliver("a", 1, 10, 1000, 0.5)]
    r = check(h)
    assert r.valid and r.redeliveries == 1


def test_failed_and_unknown_acks_allow_redelivery() -> None:
    h = [*enq("a", 0.0, 1), deliver("a", 1, 10, 1000, 0.1), *ack(1, 10, 0.2, "fail"),
         deliver("a", 1, 11, 2000, 1.2), *ack(1, 11, 1.3, "info"),
         Op("invoke", "ack", "c1", 1.4, Q, id=1, lease_id=11),  # an ack in a stream
         deliver("a", 1, 12, 3000, 2.2), *ack(1, 12, 2.3)]
    r = check(h)
    assert r.valid and r.redeliveries == 2


def test_a_delivery_of_something_never_enqueued_or_refused_is_unexpected() -> None:
    h = [*enq("refused", 0.0, None, "fail"),
         deliver("ghost", 9, 1, 1000, 0.1), deliver("refused", 8, 2, 1000, 0.2)]
    r = check(h)
    assert anomalies(r) == {"unexpected": 2}


def test_a_payload_under_an_id_acknowledged_for_another_is_unexpected() -> None:
    h = [*enq("a", 0.0, 1), *enq("b", 0.1, 2), deliver("b", 1, 1, 1000, 0.2), deliver("b", 2, 2, 1000, 0.3)]
    r = check(h)
    assert r.unexpected == 1 and r.lost == 1  # "a" never came back under its id or any


def test_overlapping_leases_are_double_leased_beyond_the_skew_margin() -> None:
    base = [*enq("a", 0.0, 1), deliver("a", 1, 10, 1000, 0.1)]
    early = check([*base, deliver("a", 1, 11, 1500, 0.6, consumer="c2")], skew_margin_ms=100)
    assert anomalies(early) == {"double_leased": 1}
    assert "c1" in early.examples["double_leased"][0]
    within = check([*base, deliver("a", 1, 11, 1950, 0.95, consumer="c2")], skew_margin_ms=100)
    assert within.valid
    after = check([*base, deliver("a", 1, 11, 2000, 1.0, consumer="c2")], skew_margin_ms=0)
    assert after.valid and after.redeliveries == 1


def test_double_lease_is_found_against_the_longest_earlier_lease() -> None:
    # lease 10 runs to 1000+5000; lease 11 (short) starts and ends inside it; lease 12 too
    long_lease = Op("ok", "deliver", "c1", 0.1, Q, "a", 1, 10, 6000, 5000)
    h = [*enq("a", 0.0, 1), long_lease,
         deliver("a", 1, 11, 1200, 0.3, "c2"), deliver("a", 1, 12, 2500, 1.6, "c3")]
    assert check(h).double_leased == 2


def test_a_payload_stored_under_two_ids_is_dedup_failed() -> None:
    h = [*enq("a", 0.0, 1), *enq("a", 1.0, 2), deliver("a", 1, 1, 1000, 1.5), deliver("a", 2, 2, 1000, 1.6)]
    r = check(h)
    assert anomalies(r) == {"dedup_failed": 1}


def test_failover_time_is_to_the_first_enqueue_invoked_after_the_fault_and_acknowledged() -> None:
    h = [*enq("before", 0.0, 1),          # invoked before the fault: does not count
         Op("invoke", "enqueue", "p1", 0.9, Q, "in-flight"),
         Op("ok", "enqueue", "p1", 2.5, Q, "in-flight", 2),
         Op("invoke", "enqueue", "p1", 1.2, Q, "x"), Op("info", "enqueue", "p1", 1.3, Q, "x"),
         Op("invoke", "enqueue", "p1", 2.0, Q, "x"), Op("ok", "enqueue", "p1", 3.0, Q, "x", 3),
         Op("invoke", "enqueue", "p2", 2.1, Q, "y"), Op("ok", "enqueue", "p2", 2.8, Q, "y", 4)]
    assert failover_times_ms(h, [1.0, 2.05, 5.0]) == [1800.0, 750.0, None]


def test_ops_round_trip_through_json() -> None:
    op = deliver("a", 1, 10, 1000, 0.1)
    assert Op.from_json(op.to_json()) == op and op.lease_start_ms == 1000
