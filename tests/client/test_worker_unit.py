"""The worker's pure rules (`doq_client._worker_core`) and its argument checks; no server.

Backoff schedule, lease-extension timing, the last-attempt rule, the claim that decides
who settles a message, and bad options refused with `InvalidArgument` before anything runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq_client import (
    AckResult,
    AsyncDoqClient,
    Backoff,
    DoqClient,
    InvalidArgument,
    Message,
    StaleLease,
    Unavailable,
)
from doq_client._worker_core import (
    MAX_DELAY_MS,
    Held,
    LeasePlan,
    State,
    WorkerOptions,
    ack_outcomes,
    note_touch,
    retry_in_ms,
    take_acks,
)


def _msg(attempts: int) -> Message:
    return Message(pb.Message(id=7, attempts=attempts, lease_id=9))


def test_backoff_grows_by_its_factor_up_to_its_cap() -> None:
    b = Backoff(base_ms=100, factor=2, cap_ms=1_000, jitter=0)
    assert [b.delay_ms(a) for a in range(1, 8)] == [100, 200, 400, 800, 1_000, 1_000, 1_000]
    assert b.delay_ms(10**6) == 1_000  # no overflow for a message tried a million times
    assert Backoff(base_ms=0, jitter=0).delay_ms(5) == 0


def test_backoff_jitter_only_shortens_and_is_drawn_from_the_given_number() -> None:
    b = Backoff(base_ms=1_000, factor=1, cap_ms=1_000, jitter=0.5)
    assert b.delay_ms(1, 0.0) == 1_000
    assert b.delay_ms(1, 0.5) == 750
    assert b.delay_ms(1, 0.999) == 500


@pytest.mark.parametrize("kw", [
    {"base_ms": -1}, {"base_ms": MAX_DELAY_MS + 1}, {"cap_ms": -5}, {"factor": 0.5},
    {"factor": float("inf")}, {"jitter": 1.5}, {"jitter": -0.1}, {"base_ms": 1.5},
])
def test_bad_backoff_is_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Backoff(**kw)  # type: ignore[arg-type]


def test_last_attempt_is_not_retried_and_unlimited_attempts_always_are() -> None:
    b = Backoff(base_ms=10, factor=2, cap_ms=10_000, jitter=0)
    assert retry_in_ms(_msg(1), 3, b, 0.0) == 10
    assert retry_in_ms(_msg(2), 3, b, 0.0) == 20
    assert retry_in_ms(_msg(3), 3, b, 0.0) is None  # the server dead-letters it on this nack
    assert retry_in_ms(_msg(50), 0, b, 0.0) == 10_000


def test_a_lease_is_extended_a_third_in_and_a_failed_touch_retried_sooner() -> None:
    plan = LeasePlan(3_000)
    assert plan.next_extend_s(100.0) == pytest.approx(101.0)
    assert plan.retry_s(100.0) == pytest.approx(100.3)
    assert LeasePlan(3_000, extend_at=0.5).next_extend_s(0.0) == pytest.approx(1.5)


def test_the_worker_asks_for_its_own_lease_else_the_queues_else_the_default() -> None:
    from doq_client import QueueSettings

    assert WorkerOptions(visibility_timeout_ms=5_000).plan(QueueSettings(visibility_timeout_ms=9_000)).lease_ms == 5_000
    assert WorkerOptions().plan(QueueSettings(visibility_timeout_ms=9_000)).lease_ms == 9_000
    assert WorkerOptions().plan(QueueSettings()).lease_ms == 30_000


def test_only_one_of_finishing_and_releasing_claims_a_message() -> None:
    h = Held(_msg(1), 0.0, 1.0)
    assert h.wants_extend(1.0) and not h.wants_extend(0.5)
    assert h.claim(State.RELEASED)
    assert not h.claim(State.SETTLING)
    assert not h.wants_extend(5.0)  # a released message's lease is no longer kept
    h2 = Held(_msg(1), 0.0, 1.0)
    assert h2.claim(State.SETTLING) and not h2.claim(State.RELEASED)


@pytest.mark.parametrize("kw", [
    {"concurrency": 0}, {"concurrency": 1.5}, {"visibility_timeout_ms": -1}, {"grace_s": -1},
    {"grace_s": float("inf")}, {"poll_wait_ms": 0}, {"poll_wait_ms": 60_001}, {"extend_at": 1.0},
    {"extend_at": 0},
])
def test_bad_worker_options_are_refused_before_anything_runs(kw: dict[str, Any]) -> None:
    c = DoqClient("127.0.0.1:1")  # never dialled
    try:
        with pytest.raises(InvalidArgument):
            c.worker("q", lambda m: None, **kw)
    finally:
        c.close()


def test_unknown_worker_option_is_a_type_error() -> None:
    with DoqClient("127.0.0.1:1") as c, pytest.raises(TypeError):
        c.worker("q", lambda m: None, concurency=2)


async def test_the_async_worker_wants_a_coroutine_function() -> None:
    async with AsyncDoqClient("127.0.0.1:1") as c:
        with pytest.raises(TypeError, match="coroutine function"):
            c.worker("q", lambda m: None)  # type: ignore[arg-type,return-value]

        async def handle(m: Message) -> None:
            return None

        assert c.worker("q", concurrency=2)(handle).options.concurrency == 2


def test_acks_go_a_thousand_per_call_with_their_lease_ids() -> None:
    pending = [Held(Message(pb.Message(id=i, lease_id=100 + i)), 0.0, 1.0) for i in range(1, 1_502)]
    batch, op = take_acks(pending, "q")
    assert len(batch) == 1_000 and len(pending) == 501
    assert (op.method, list(op.request.ids[:2]), list(op.request.lease_ids[:2])) == ("AckBatch", [1, 2], [101, 102])
    assert op.repeatable  # every ack names its lease: safe to send again after a failover
    results = [AckResult(h.msg.id, None if h.msg.id % 2 else StaleLease("gone")) for h in batch]
    outcomes = ack_outcomes(batch, results)  # type: ignore[arg-type]
    assert [e is None for _, e in outcomes[:2]] == [True, False]
    boom = Unavailable("down")
    assert {e for _, e in ack_outcomes(batch, boom)} == {boom}


def test_a_touch_outcome_moves_the_next_extension_or_stops_it() -> None:
    plan = LeasePlan(3_000)
    h = Held(_msg(1), 0.0, 1.0)
    assert note_touch(h, plan, "q", 5.0, 123, 5.1)
    assert (h.leased_at_s, h.next_extend_s) == (5.0, pytest.approx(6.0))
    assert not note_touch(h, plan, "q", 7.0, Unavailable("down"), 7.2)
    assert h.next_extend_s == pytest.approx(7.5) and not h.lost  # tried again soon
    assert not note_touch(h, plan, "q", 8.0, StaleLease("gone"), 8.1)
    assert h.lost and not h.wants_extend(100.0)  # a lost lease is not touched again
