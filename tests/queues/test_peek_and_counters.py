"""Looking without taking (`QueueMachine.peek_ids`, `group_stats`) and the per-queue counters
(`QueueCounters`), on the pure machine with an in-memory store.

The peek's promise is checked against the machine itself: for random queues, groups,
priorities, per-group limits, leases and delays, the ready ids a peek lists are exactly the
ids the next dequeues take, and peeking changes nothing (same records, same next deliveries).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.errors import QueueNotFound
from doq.queues import commands as c
from doq.queues.model import GroupStats, MessageState, QueueCounters
from tests.queues.test_machine_rules import T0, Harness, item

READY, DELAYED, IN_FLIGHT = MessageState.READY, MessageState.DELAYED, MessageState.IN_FLIGHT


def test_peek_of_a_delayed_queue_is_priority_then_id_and_pages() -> None:
    h = Harness()
    h.create()
    ids = h.enqueue("q", item(priority=5), item(priority=1), item(priority=5), item(priority=-2))
    assert h.m.peek_ids("q", READY, 0, 10) == [ids[3], ids[1], ids[0], ids[2]]
    assert h.m.peek_ids("q", READY, 1, 2) == [ids[1], ids[0]]
    assert h.m.peek_ids("q", READY, 4, 2) == []
    assert h.ids("q", 4, ack=True) == [ids[3], ids[1], ids[0], ids[2]]


def test_peek_of_delayed_and_in_flight_messages_in_the_order_they_leave() -> None:
    h = Harness()
    h.create("q")
    h.create("other")
    late, soon = h.enqueue("q", item(delay_ms=9000), item(delay_ms=1000))
    h.enqueue("other", item(delay_ms=500))  # another queue's entry sorts first: skipped
    ready = h.enqueue("q", item(), item())
    assert h.m.peek_ids("q", DELAYED, 0, 10) == [soon, late]
    assert h.m.peek_ids("q", DELAYED, 1, 10) == [late]
    first = h.dequeue("q", 1, visibility_timeout_ms=5000)[0].id
    second = h.dequeue("q", 1, visibility_timeout_ms=2000)[0].id
    assert (first, second) == tuple(ready)
    assert h.m.peek_ids("q", IN_FLIGHT, 0, 10) == [second, first]  # by lease expiry
    assert h.m.peek_ids("q", READY, 0, 10) == []
    with pytest.raises(QueueNotFound):
        h.m.peek_ids("nope", READY, 0, 1)


def test_peek_of_a_fair_queue_follows_the_rotation_and_the_group_limit() -> None:
    h = Harness()
    h.create("f", "fair", max_unacked_per_group=2)
    a = h.enqueue("f", *(item(group="a") for _ in range(4)))
    b = h.enqueue("f", item(group="b"))
    c_ = h.enqueue("f", item(group="c"), item(group="c"))
    # a's limit of 2 unacked: the rotation serves a twice, then only b and c
    assert h.m.peek_ids("f", READY, 0, 10) == [a[0], b[0], c_[0], a[1], c_[1]]
    assert h.m.group_stats("f") == [GroupStats("a", 4, 0), GroupStats("b", 1, 0), GroupStats("c", 2, 0)]
    assert h.ids("f", 10) == [a[0], b[0], c_[0], a[1], c_[1]]
    assert h.m.group_stats("f") == [GroupStats("a", 2, 2), GroupStats("b", 0, 1), GroupStats("c", 0, 2)]


def test_group_stats_of_a_delayed_queue_is_empty() -> None:
    h = Harness()
    h.create()
    h.enqueue("q", item(group="a"))
    assert h.m.group_stats("q") == []


ops = st.lists(st.one_of(
    st.tuples(st.just("enq"), st.sampled_from(["", "a", "b", "c", "d"]), st.integers(-3, 3),
              st.sampled_from([0, 0, 0, 2000])),
    st.tuples(st.just("deq"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.integers(0, 3000)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["delayed", "fair"]), limit=st.sampled_from([0, 1, 2]), script=ops)
@example(kind="fair", limit=1, script=[("enq", "a", 0, 0), ("enq", "a", 0, 0), ("enq", "b", 1, 0)])
@example(kind="fair", limit=2, script=[("enq", "b", 0, 0), ("deq", 1, False), ("enq", "a", 2, 0),
                                       ("enq", "b", -1, 0), ("enq", "c", 0, 0), ("enq", "b", 0, 0)])
def test_a_peek_lists_exactly_what_the_next_dequeues_take_and_changes_nothing(
        kind: str, limit: int, script: list[tuple]) -> None:  # type: ignore[type-arg]
    h = Harness()
    h.create("q", kind, max_unacked_per_group=limit if kind == "fair" else 0)
    leased: list[tuple[int, int]] = []
    for op in script:
        if op[0] == "enq":
            h.enqueue("q", item(group=op[1], priority=op[2], delay_ms=op[3]))
        elif op[0] == "deq":
            leased += [(v.id, v.lease_id) for v in h.dequeue("q", op[1], ack=op[2], visibility_timeout_ms=60_000)]
        elif op[0] == "ack" and leased:
            id_, lid = leased.pop(op[1] % len(leased))
            h.one(c.Ack("q", [id_], [lid]))
        elif op[0] == "tick":
            h.now += op[1]
            h.run(c.Tick())
    records = dict(h.store.data)
    peeked = h.m.peek_ids("q", READY, 0, 1000)
    assert h.m.peek_ids("q", READY, 0, 1000) == peeked  # peeking twice: the same answer
    assert h.store.data == records  # nothing written
    assert h.ids("q", 1000, ack=False, visibility_timeout_ms=60_000) == peeked


def test_counters_count_enqueues_deliveries_and_acks_but_not_duplicates() -> None:
    h = Harness()
    h.create()
    h.enqueue("q", item(dedup_id="x"), item(), item())
    h.enqueue("q", item(dedup_id="x"))  # a duplicate: not a new message
    h.one(c.EnqueueColumns("q", [b"a", b"b"], [], [], [], [], []))
    assert h.m.queue_info("q").counters == QueueCounters(enqueued=5)
    leased = h.dequeue("q", 2)
    h.dequeue("q", 1, ack=True)
    assert h.m.queue_info("q").counters == QueueCounters(enqueued=5, delivered=3, acked=1)
    h.one(c.Ack("q", [leased[0].id], [leased[0].lease_id]))
    h.one(c.Ack("q", [leased[0].id], [leased[0].lease_id]))  # refused: not counted twice
    assert h.m.queue_info("q").counters == QueueCounters(enqueued=5, delivered=3, acked=2)
    h.now = T0 + 10**6  # the other lease expires: delivered again on the next dequeue
    h.run(c.Tick())
    assert [v.id for v in h.dequeue("q", 1)] == [leased[1].id]
    assert h.m.queue_info("q").counters.delivered == 4
