"""One test per documented rule of the queue state machine (pure; in-memory store)."""

from __future__ import annotations

import pytest

from doq.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    LimitReached,
    MessageNotFound,
    QueueNotFound,
    StaleLease,
)
from doq.queues import commands as c
from doq.queues.dedupruns import parse, run_id
from doq.queues.machine import QueueMachine
from doq.queues.model import EnqueueResult, MessageState, MessageView, QueueInfo, QueueSettings
from doq.queues.store import MemoryStore

T0 = 1_700_000_000_000


class Harness:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.m = QueueMachine(self.store)
        self.now = T0
        self.index = 0

    def run(self, *cmds: c.Command, at: int | None = None) -> list[object]:
        self.now = self.now if at is None else at
        self.index += 1
        return self.m.apply(self.index, c.CommandBatch(self.now, list(cmds)))

    def one(self, cmd: c.Command, at: int | None = None) -> object:
        return self.run(cmd, at=at)[0]

    def create(self, name: str = "q", type_: str = "delayed", **settings: object) -> None:
        info = self.one(c.CreateQueue(name, type_, QueueSettings(**settings)))  # type: ignore[arg-type]
        assert info == self.m.queue_info(name)

    def enqueue(self, q: str, *items: c.EnqueueItem) -> list[int]:
        res = self.one(c.Enqueue(q, list(items)))
        assert isinstance(res, list)
        out = []
        for r in res:
            assert isinstance(r, EnqueueResult), r
            out.append(r.id)
        return out

    def dequeue(self, q: str, n: int = 1, **kw: object) -> list[MessageView]:
        res = self.one(c.Dequeue(q, n, **kw))  # type: ignore[arg-type]
        assert isinstance(res, list)
        return res

    def ids(self, q: str, n: int = 1, **kw: object) -> list[int]:
        return [v.id for v in self.dequeue(q, n, **kw)]


def item(content: bytes = b"x", **kw: object) -> c.EnqueueItem:
    return c.EnqueueItem(content, **kw)  # type: ignore[arg-type]


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_ids_start_at_one_and_are_unique_across_queues(h: Harness) -> None:
    h.create("a")
    h.create("b", "fair")
    assert h.enqueue("a", item(), item()) == [1, 2]
    assert h.enqueue("b", item()) == [3]
    assert h.enqueue("a", item()) == [4]


def test_delayed_queue_lower_priority_first_then_fifo(h: Harness) -> None:
    h.create()
    ids = h.enqueue("q", item(priority=5), item(priority=1), item(priority=5), item(priority=-2))
    assert h.ids("q", 10, ack=True) == [ids[3], ids[1], ids[0], ids[2]]


def test_fair_round_robin_with_a_huge_backlog_in_one_group(h: Harness) -> None:
    h.create("f", "fair")
    h.enqueue("f", *[item(group="big") for _ in range(5000)])
    small = h.enqueue("f", item(group="t1"), item(group="t2"), item(group="t2"))
    got = h.dequeue("f", 3)
    assert {v.group for v in got} == {"big", "t1", "t2"}
    assert small[0] in {v.id for v in got}
    # the rotation keeps giving t2 a turn although "big" has thousands waiting
    assert [v.group for v in h.dequeue("f", 2)] == ["big", "t2"]


def test_fair_priority_then_fifo_inside_a_group(h: Harness) -> None:
    h.create("f", "fair")
    a = h.enqueue("f", item(group="g", priority=3), item(group="g", priority=1), item(group="g", priority=3))
    assert h.ids("f", 3, ack=True) == [a[1], a[0], a[2]]


def test_fair_max_unacked_per_group_skips_a_group_at_its_limit(h: Harness) -> None:
    h.create("f", "fair", max_unacked_per_group=1)
    h.enqueue("f", item(group="a"), item(group="a"), item(group="b"))
    got = h.dequeue("f", 5)
    assert sorted(v.group for v in got) == ["a", "b"]
    assert h.dequeue("f", 5) == []
    assert not h.m.has_deliverable("f")
    first_a = next(v for v in got if v.group == "a")
    assert h.one(c.Ack("f", [first_a.id], [first_a.lease_id])) == [None]
    assert h.m.has_deliverable("f")
    assert [v.group for v in h.dequeue("f", 5)] == ["a"]


def test_priority_that_is_a_future_unix_timestamp_delays_delivery(h: Harness) -> None:
    h.create()
    ts = T0 // 1000 + 10  # ten seconds from now, in seconds
    late, now = h.enqueue("q", item(priority=ts), item(priority=ts + 100_000_000_000))[0], None
    assert now is None
    assert h.ids("q", 5) == []
    assert h.m.queue_info("q").stats.delayed == 2
    assert h.m.next_due_ms() == ts * 1000
    h.one(c.Tick(), at=ts * 1000 - 1)
    assert h.ids("q", 5) == []
    h.one(c.Tick(), at=ts * 1000)
    assert h.m.has_deliverable("q")
    assert h.ids("q", 5) == [late]
    # a timestamp in the past is just a (large) priority
    past = h.enqueue("q", item(priority=1_000_000_000), item(priority=7))
    assert h.ids("q", 5, ack=True) == [past[1], past[0]]


def test_explicit_delay(h: Harness) -> None:
    h.create()
    res = h.one(c.Enqueue("q", [item(delay_ms=500)]))
    assert isinstance(res, list) and isinstance(res[0], EnqueueResult)
    assert res[0].deliver_at_ms == T0 + 500
    assert h.m.get_message("q", res[0].id).state is MessageState.DELAYED
    assert h.ids("q") == []
    h.one(c.Tick(), at=T0 + 500)
    assert h.ids("q") == [res[0].id]


def test_replicated_time_never_goes_back(h: Harness) -> None:
    h.create()
    h.one(c.Tick(), at=T0 + 1000)
    h.one(c.Tick(), at=T0)
    assert h.m.now_ms == T0 + 1000
    v = h.dequeue("q", 1)
    assert v == []
    h.enqueue("q", item())
    assert h.dequeue("q", 1, visibility_timeout_ms=10)[0].lease_expires_at_ms == T0 + 1010


def test_lease_expiry_redelivers_and_old_lease_is_stale(h: Harness) -> None:
    h.create(visibility_timeout_ms=100)
    [id_] = h.enqueue("q", item(b"payload", metadata={"k": "v"}))
    [first] = h.dequeue("q")
    assert (first.attempts, first.lease_expires_at_ms, first.content, first.metadata) == (
        1, T0 + 100, b"payload", {"k": "v"})
    assert h.m.next_due_ms() == T0 + 100
    h.one(c.Tick(), at=T0 + 100)
    assert h.m.get_message("q", id_).state is MessageState.READY
    [second] = h.dequeue("q")
    assert second.attempts == 2 and second.lease_id != first.lease_id
    assert isinstance(h.one(c.Ack("q", [id_], [first.lease_id]))[0], StaleLease)  # type: ignore[index]
    assert isinstance(h.one(c.Touch("q", id_, first.lease_id)), StaleLease)
    assert isinstance(h.one(c.Nack("q", id_, first.lease_id)), StaleLease)
    assert h.one(c.Ack("q", [id_], [second.lease_id])) == [None]
    assert isinstance(h.one(c.Ack("q", [id_]))[0], MessageNotFound)  # type: ignore[index]


def test_ack_of_a_ready_message_is_not_in_flight(h: Harness) -> None:
    h.create()
    [id_] = h.enqueue("q", item())
    res = h.one(c.Ack("q", [id_]))
    assert isinstance(res, list)
    assert isinstance(res[0], FailedPrecondition) and res[0].reason == "NOT_IN_FLIGHT"
    res = h.one(c.Ack("q", [id_], [5]))
    assert isinstance(res, list) and isinstance(res[0], StaleLease)
    assert isinstance(h.one(c.Ack("nope", [id_])), QueueNotFound)


def test_touch_extends_the_lease_from_now(h: Harness) -> None:
    h.create(visibility_timeout_ms=100)
    h.enqueue("q", item())
    [v] = h.dequeue("q")
    h.one(c.Tick(), at=T0 + 90)
    assert h.one(c.Touch("q", v.id, v.lease_id, 200)) == T0 + 290
    h.one(c.Tick(), at=T0 + 289)
    assert h.m.get_message("q", v.id).state is MessageState.IN_FLIGHT
    h.one(c.Tick(), at=T0 + 290)
    assert h.m.get_message("q", v.id).state is MessageState.READY


def test_nack_with_delay_and_new_priority(h: Harness) -> None:
    h.create()
    a, b = h.enqueue("q", item(priority=1), item(priority=2))
    [v] = h.dequeue("q")
    assert v.id == a
    assert h.one(c.Nack("q", a, v.lease_id, delay_ms=50, priority=9)) is None
    assert h.ids("q", 5) == [b]
    h.one(c.Tick(), at=T0 + 50)
    [again] = h.dequeue("q")
    assert (again.id, again.priority, again.attempts) == (a, 9, 2)


def test_update_priority_ready_delayed_and_in_flight(h: Harness) -> None:
    h.create()
    a, b, d = h.enqueue("q", item(priority=1), item(priority=2), item(priority=3, delay_ms=10))
    view = h.one(c.UpdatePriority("q", b, 0))
    assert isinstance(view, MessageView) and view.priority == 0 and view.content == b""
    [v] = h.dequeue("q")
    assert v.id == b
    h.one(c.UpdatePriority("q", b, -5))  # in flight: takes effect when it comes back
    h.one(c.Nack("q", b, v.lease_id))
    h.one(c.UpdatePriority("q", d, -1))
    h.one(c.Tick(), at=T0 + 10)
    assert h.ids("q", 5, ack=True) == [b, d, a]
    # a priority that is a future timestamp turns a ready message into a delayed one
    [e] = h.enqueue("q", item())
    h.one(c.UpdatePriority("q", e, T0 // 1000 + 60))
    assert h.m.get_message("q", e).state is MessageState.DELAYED


def test_dead_letter_after_max_attempts(h: Harness) -> None:
    h.create("dlq", "fair")
    h.create(visibility_timeout_ms=10, max_attempts=2, dead_letter_queue="dlq")
    [id_] = h.enqueue("q", item(b"body", group="tenant", priority=4, metadata={"a": "b"}))
    h.dequeue("q")
    h.one(c.Tick(), at=T0 + 10)
    [v] = h.dequeue("q")
    assert v.attempts == 2
    h.one(c.Tick(), at=T0 + 20)
    assert h.m.queue_info("q").stats.dead == 1
    assert h.m.queue_info("q").stats.total == 0
    with pytest.raises(MessageNotFound):
        h.m.get_message("q", id_)
    [moved] = h.dequeue("dlq")
    assert moved.id != id_
    assert (moved.content, moved.group, moved.priority, moved.metadata, moved.attempts) == (
        b"body", "tenant", 4, {"a": "b"}, 1)


def test_nack_after_the_last_attempt_dead_letters(h: Harness) -> None:
    h.create(max_attempts=1)  # no DLQ: dropped, counted as dead
    [id_] = h.enqueue("q", item())
    [v] = h.dequeue("q")
    h.one(c.Nack("q", id_, v.lease_id))
    assert h.m.queue_info("q").stats.dead == 1
    assert h.m.queue_info("q").stats.total == 0
    assert [k for k in h.store.data if k[:1] == b"M"] == []


def test_dedup_within_window_and_expiry(h: Harness) -> None:
    h.create(dedup_window_ms=1000)
    r1 = h.one(c.Enqueue("q", [item(dedup_id="x"), item(dedup_id="x")]))
    assert isinstance(r1, list)
    assert [(r.id, r.duplicate) for r in r1] == [(1, False), (1, True)]  # type: ignore[union-attr]
    h.dequeue("q", 1, ack=True)  # consumed: a retry is still a duplicate
    r2 = h.one(c.Enqueue("q", [item(dedup_id="x")]), at=T0 + 999)
    assert isinstance(r2, list)
    assert [(r.id, r.duplicate) for r in r2] == [(1, True)]  # type: ignore[union-attr]
    assert h.m.queue_info("q").stats.total == 0
    r3 = h.one(c.Enqueue("q", [item(dedup_id="x")]), at=T0 + 1000)
    assert isinstance(r3, list)
    assert [(r.id, r.duplicate) for r in r3] == [(2, False)]  # type: ignore[union-attr]
    assert len(h.m.dedup_exp) == 1  # the expired entry was forgotten (bounded memory)


@pytest.mark.parametrize("did", ["x", run_id("0123456789abcdef-", 7)])
def test_a_duplicate_answers_the_stored_messages_fields(h: Harness, did: str) -> None:
    """A retry of an enqueue (plain or canonical dedup id) answers the stored message's
    delivery time, priority and group — not ones computed from the retry."""
    assert (parse(did) is None) == (did == "x")
    h.create("f", "fair", dedup_window_ms=60_000)
    first = h.one(c.Enqueue("f", [item(dedup_id=did, delay_ms=5_000, group="g1", priority=3)]))
    assert isinstance(first, list) and first[0].deliver_at_ms == T0 + 5_000
    (id_,) = [r.id for r in first]
    again = h.one(c.Enqueue("f", [item(dedup_id=did, delay_ms=5_000, group="g2", priority=9)]),
                  at=T0 + 1_000)
    assert isinstance(again, list)
    assert (again[0].id, again[0].duplicate, again[0].deliver_at_ms, again[0].priority, again[0].group) == (
        id_, True, T0 + 5_000, 3, "g1")
    h.one(c.UpdatePriority("f", id_, 1), at=T0 + 6_000)
    late = h.one(c.Enqueue("f", [item(dedup_id=did, group="g2", priority=9)]), at=T0 + 6_001)
    assert isinstance(late, list) and (late[0].priority, late[0].group) == (1, "g1")


def test_purge_and_delete_queue(h: Harness) -> None:
    h.create()
    h.enqueue("q", item(), item(delay_ms=100), item(dedup_id="d"))
    h.dequeue("q")
    assert h.one(c.PurgeQueue("q")) == 3
    assert h.m.queue_info("q").stats.total == 0 and h.m.next_due_ms() is None
    h.enqueue("q", item())
    assert h.one(c.DeleteQueue("q")) is None
    assert [k for k in h.store.data if k != b"G"] == []
    assert isinstance(h.one(c.PurgeQueue("q")), QueueNotFound)
    with pytest.raises(QueueNotFound):
        h.m.queue_info("q")


def test_delete_and_get_message(h: Harness) -> None:
    h.create()
    [a] = h.enqueue("q", item(b"c"))
    assert h.m.get_message("q", a).content == b"c"
    assert h.one(c.DeleteMessage("q", a)) is None
    assert isinstance(h.one(c.DeleteMessage("q", a)), MessageNotFound)


def test_create_queue_is_idempotent_only_with_identical_settings(h: Harness) -> None:
    h.create()
    assert h.one(c.CreateQueue("q", "delayed", QueueSettings())) == h.m.queue_info("q")  # a harmless retry
    assert isinstance(h.one(c.CreateQueue("q", "fair", QueueSettings())), AlreadyExists)
    assert isinstance(h.one(c.CreateQueue("r", "lifo", QueueSettings())), InvalidArgument)


def test_a_new_queue_past_the_commands_max_queues_is_refused_and_changes_nothing(h: Harness) -> None:
    for name in ("a", "b"):
        assert isinstance(h.one(c.CreateQueue(name, "delayed", QueueSettings(), 2)), QueueInfo)
    before = dict(h.store.data)
    err = h.one(c.CreateQueue("c", "delayed", QueueSettings(), 2))
    assert isinstance(err, LimitReached) and err.reason == "QUEUE_LIMIT_REACHED"
    assert h.store.data == before and h.m.queue_info("a") is not None
    assert h.one(c.CreateQueue("a", "delayed", QueueSettings(), 2)) == h.m.queue_info("a")  # a retry still succeeds
    assert isinstance(h.one(c.CreateQueue("c", "delayed", QueueSettings(), 3)), QueueInfo)  # the command's limit
    assert isinstance(h.one(c.CreateQueue("d", "delayed", QueueSettings())), QueueInfo)  # 0: no limit
    h.one(c.DeleteQueue("a"))
    assert isinstance(h.one(c.CreateQueue("e", "delayed", QueueSettings(), 4)), QueueInfo)


def test_bad_input_fails_alone_and_changes_nothing(h: Harness) -> None:
    h.create()
    before = dict(h.store.data)
    bad: list[object] = [
        c.Enqueue("q", [item(priority=2**70)]),
        c.Enqueue("q", [item(delay_ms=-1)]),
        c.Enqueue("q", [item(metadata={"k": 1})]),
        c.Enqueue("q", [c.EnqueueItem("not bytes")]),  # type: ignore[arg-type]
        c.Dequeue("q", 0),
        c.Dequeue(None, 1),  # type: ignore[arg-type]
        c.Ack("q", [1, 2], [1]),
        c.Nack("q", 1, delay_ms=-5),
        c.Touch("q", "1"),  # type: ignore[arg-type]
        c.UpdatePriority("q", 1, 2**64),
        c.CreateQueue("x", "delayed", QueueSettings(visibility_timeout_ms=-1)),
        c.CreateQueue("", "delayed", QueueSettings()),
        "not a command",
    ]
    results = h.run(*bad)  # type: ignore[arg-type]
    flat = [r[0] if isinstance(r, list) else r for r in results]
    assert all(isinstance(r, (InvalidArgument, QueueNotFound)) for r in flat), flat
    assert {k: v for k, v in h.store.data.items() if k != b"G"} == {
        k: v for k, v in before.items() if k != b"G"}
    # one bad item among good ones fails only itself
    res = h.one(c.Enqueue("q", [item(), item(priority=2**70), item()]))
    assert isinstance(res, list)
    assert [type(r) for r in res] == [EnqueueResult, InvalidArgument, EnqueueResult]
    assert h.m.queue_info("q").stats.ready == 2


def test_lease_ids_are_deterministic_counters(h: Harness) -> None:
    h.create()
    h.enqueue("q", item(), item(), item())
    assert [v.lease_id for v in h.dequeue("q", 3)] == [1, 2, 3]


def test_rebuild_from_records_gives_identical_behaviour() -> None:
    a, b = Harness(), Harness()
    for x in (a, b):
        x.create("f", "fair", max_unacked_per_group=2, visibility_timeout_ms=50)
        x.enqueue("f", *[item(bytes([i]), group=f"g{i % 3}", priority=i % 4) for i in range(30)])
        x.enqueue("f", item(delay_ms=70), item(dedup_id="d"))
        x.dequeue("f", 4)
    rebuilt = QueueMachine(b.store)
    rebuilt.load(b.store.items())
    b.m = rebuilt
    for x in (a, b):
        x.one(c.Tick(), at=T0 + 60)
    for _ in range(10):
        assert [(v.id, v.lease_id) for v in a.dequeue("f", 3)] == [(v.id, v.lease_id) for v in b.dequeue("f", 3)]
    assert a.store.data == b.store.data
    assert a.m.queue_infos() == b.m.queue_infos()


def test_release_undoes_the_delivery(h: Harness) -> None:
    """A release puts the message back as if it had not been delivered: attempt taken
    back, same place in the order, no delay, and never dead-lettered."""
    h.create(max_attempts=1)
    a, b = h.enqueue("q", item(priority=1), item(priority=2))
    [va, vb] = h.dequeue("q", 2)
    assert (va.attempts, vb.attempts) == (1, 1)
    assert h.one(c.Nack("q", b, vb.lease_id, release=True)) is None
    assert h.one(c.Nack("q", a, va.lease_id, release=True)) is None  # max_attempts 1: still kept
    info = h.m.queue_info("q").stats
    assert (info.ready, info.in_flight, info.dead) == (2, 0, 0)
    assert [(m.state, m.attempts, m.lease_id) for m in (h.m.get_message("q", a), h.m.get_message("q", b))] == [
        (MessageState.READY, 0, 0), (MessageState.READY, 0, 0)]
    again = h.dequeue("q", 2)
    assert [(v.id, v.attempts) for v in again] == [(a, 1), (b, 1)]  # priority order as before


def test_a_release_in_the_batch_that_finds_the_lease_due_undoes_the_delivery(h: Harness) -> None:
    """A dequeue that commits after its lease's end (it waited through a quorum loss) is
    released by the service, which never hands it out; the batch carrying that release
    finds the lease due: the release wins over the expiry, so the attempt is not counted
    and a `max_attempts=1` message is not dead-lettered. Another due lease in the same
    batch still expires."""
    h.create("dlq")
    h.create(max_attempts=1, visibility_timeout_ms=1_000, dead_letter_queue="dlq")
    a, b = h.enqueue("q", item(b"a"), item(b"b"))
    [va, vb] = h.dequeue("q", 2)
    late = T0 + 5_000  # both leases ended 4 s ago
    assert h.run(c.Nack("q", a, va.lease_id, release=True), at=late) == [None]
    ma = h.m.get_message("q", a)
    assert (ma.state, ma.attempts, ma.lease_id) == (MessageState.READY, 0, 0)
    stats = h.m.queue_info("q").stats
    assert (stats.ready, stats.in_flight, stats.dead) == (1, 0, 1)  # b expired: dead-lettered
    assert [v.content for v in h.dequeue("dlq")] == [b"b"]
    assert [(v.id, v.attempts) for v in h.dequeue("q")] == [(a, 1)]


def test_release_refuses_delay_priority_and_stale_leases(h: Harness) -> None:
    h.create()
    [a] = h.enqueue("q", item())
    [v] = h.dequeue("q")
    for bad in (c.Nack("q", a, v.lease_id, delay_ms=10, release=True),
                c.Nack("q", a, v.lease_id, priority=3, release=True)):
        err = h.one(bad)
        assert isinstance(err, InvalidArgument) and err.reason == "INVALID_RELEASE"
    assert isinstance(h.one(c.Nack("q", a, v.lease_id + 1, release=True)), StaleLease)
    assert h.m.get_message("q", a).state is MessageState.IN_FLIGHT  # nothing changed


def test_sort_known_tells_present_gone_and_unborn_ids_and_a_gone_one_stays_gone(h: Harness) -> None:
    h.create("a")
    h.create("b")
    a1, a2, a3 = h.enqueue("a", item(), item(), item())
    (b1,) = h.enqueue("b", item())
    leased = h.dequeue("a", 2)
    assert h.one(c.Ack("a", [leased[0].id], [])) == [None]  # a1 is gone
    assert h.m.sort_known("a", [a1, a2, a3]) == ([1, 2], [0], [])
    assert h.m.sort_known("a", [b1, b1 + 1]) == ([], [0], [1])  # b's id is not a's; b1 + 1 unborn
    assert h.m.sort_known("a", [a2, a3]) == ([0, 1], [], [])
    assert h.m.sort_known("nope", [a1]) == ([0], [], [])  # the command answers for a missing queue
    # the rule the service relies on: what sort_known calls gone, the machine answers NOT_FOUND
    (err,) = h.one(c.Ack("a", [a1], []))  # type: ignore[misc]
    assert type(err).__name__ == "MessageNotFound"
    h.enqueue("a", item())  # later enqueues never bring an id back
    assert h.m.sort_known("a", [a1]) == ([], [0], [])


def test_lease_ids_of_a_seeded_dequeue_are_scattered_and_the_same_on_every_replica() -> None:
    from doq.queues.leaseids import splitmix64

    assert splitmix64(0) == 0xE220A8397B1DCDAF  # the published first output of splitmix64(seed 0)
    runs = []
    for _ in range(2):  # two replicas applying the same entries
        h = Harness()
        h.create()
        h.one(c.Enqueue("q", [item() for _ in range(6)]))
        a = h.one(c.Dequeue("q", 3, seed=0x1234_5678_9ABC_DEF0))
        b = h.one(c.Dequeue("q", 3, seed=0x0FED_CBA9_8765_4321))
        runs.append(([m.lease_id for m in a], [m.lease_id for m in b], dict(h.store.data)))
    assert runs[0] == runs[1]
    lids = runs[0][0] + runs[0][1]
    assert len(set(lids)) == 6 and 0 not in lids
    assert max(abs(x - y) for x, y in zip(lids, lids[1:], strict=False)) > 2**32  # not a sequence
    # an entry without a seed (written before seeds existed) keeps the sequential ids
    h = Harness()
    h.create()
    h.one(c.Enqueue("q", [item() for _ in range(2)]))
    assert [m.lease_id for m in h.one(c.Dequeue("q", 2))] == [1, 2]


def test_deleting_an_in_flight_message_needs_its_lease_unless_the_caller_may_delete_any() -> None:
    h = Harness()
    h.create()
    a, b = h.enqueue("q", item(), item())
    [d] = h.dequeue("q", 1, seed=7)
    assert d.id == a
    before = dict(h.store.data)
    err = h.one(c.DeleteMessage("q", a, holder_only=True))
    assert isinstance(err, FailedPrecondition) and err.reason == "MESSAGE_IN_FLIGHT"
    assert isinstance(h.one(c.DeleteMessage("q", a, d.lease_id ^ 1, holder_only=True)), StaleLease)
    assert isinstance(h.one(c.DeleteMessage("q", b, 5, holder_only=True)), StaleLease)  # b is not in flight
    assert {k: v for k, v in h.store.data.items() if k != b"G"} == {k: v for k, v in before.items() if k != b"G"}
    assert h.one(c.DeleteMessage("q", b, holder_only=True)) is None  # ready: no one holds it
    assert h.one(c.DeleteMessage("q", a, d.lease_id, holder_only=True)) is None  # the holder
    [a2] = h.enqueue("q", item())
    h.dequeue("q", 1, seed=9)
    assert h.one(c.DeleteMessage("q", a2)) is None  # an admin (and entries written before): any state


def test_a_timestamp_priority_delivered_shows_its_later_not_before(h: Harness) -> None:
    """A message with a timestamp priority (seconds) is shown not before the later of its
    timestamp and its own not-before (a nack's delay)."""
    h.create()
    ts_s = T0 // 1000 + 5  # due 5 s after T0
    [a] = h.enqueue("q", item(priority=ts_s))
    assert h.dequeue("q") == []
    h.one(c.Tick(), at=T0 + 5_000)
    [v] = h.dequeue("q")
    assert (v.id, v.deliver_at_ms) == (a, ts_s * 1000)
    assert h.one(c.Nack("q", a, v.lease_id, delay_ms=7_000)) is None
    h.one(c.Tick(), at=T0 + 12_000)
    [again] = h.dequeue("q")
    assert (again.id, again.deliver_at_ms, again.attempts) == (a, T0 + 12_000, 2)
