"""Weighted round-robin and per-group rate limits of fair queues, through the state
machine and the replicated clock (pure; in-memory store)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doq.errors import FailedPrecondition, InvalidArgument, QueueNotFound
from doq.queues import codec
from doq.queues import commands as c
from doq.queues.machine import QueueMachine
from doq.queues.model import GroupStats, QueueSettings
from doq.queues.store import MemoryStore

T0 = 1_700_000_000_000


class Node:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.m = QueueMachine(self.store)
        self.index = 0
        self.log: list[bytes] = []

    def run(self, now: int, *cmds: c.Command) -> list[object]:
        """Apply through the codec (what a replica reads from the log)."""
        raw = codec.encode_batch(c.CommandBatch(now, list(cmds)))
        self.log.append(raw)
        self.index += 1
        return self.m.apply(self.index, codec.decode_batch(raw))

    def fill(self, now: int, queue: str, group: str, n: int) -> None:
        for i in range(0, n, 1000):
            self.run(now, c.Enqueue(queue, [c.EnqueueItem(b"x", group) for _ in range(min(1000, n - i))]))

    def groups_of(self, now: int, queue: str, n: int, batch: int = 1) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            got = self.run(now, c.Dequeue(queue, min(batch, n - len(out)), ack=True))[0]
            assert isinstance(got, list)
            if not got:
                break
            out += [v.group for v in got]
        return out


def test_weights_5_to_1_deliver_5_to_1_over_10000_messages_whatever_the_batch_sizes() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings()))
    node.run(T0, c.SetGroupPolicy("q", "paying", weight=5))
    node.fill(T0, "q", "paying", 12_000)
    node.fill(T0, "q", "free", 12_000)
    rnd = random.Random(7)
    got: list[str] = []
    while len(got) < 10_000:  # dequeues of random sizes: the turn carries over
        got += node.groups_of(T0, "q", min(rnd.choice([1, 2, 3, 7, 50]), 10_000 - len(got)), batch=50)
    n = Counter(got)
    assert n["paying"] + n["free"] == 10_000
    ratio = n["paying"] / n["free"]
    assert abs(ratio - 5) <= 5 * 0.02, n
    # and exactly the pattern: 5 turns for paying, 1 for free
    assert got[:12] == ["free"] + ["paying"] * 5 + ["free"] + ["paying"] * 5


def test_queue_default_weight_and_a_group_override() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_weight=3)))
    node.run(T0, c.SetGroupPolicy("q", "b", weight=1))
    node.fill(T0, "q", "a", 10)
    node.fill(T0, "q", "b", 10)
    assert node.groups_of(T0, "q", 8) == ["a", "a", "a", "b", "a", "a", "a", "b"]


def test_a_group_limited_to_100_per_second_gets_100_per_second_the_others_the_rest() -> None:
    """Measured against the replicated clock: consumers dequeue 50 at a time every 10 ms
    of replicated time for 60 s; the limited group gets 100 ± 5 msg/s and the unlimited
    one every other delivery."""
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings()))
    node.run(T0, c.SetGroupPolicy("q", "noisy", max_per_second=100))
    node.fill(T0, "q", "noisy", 20_000)
    node.fill(T0, "q", "calm", 400_000)
    seconds, step_ms, per_call = 60, 10, 50
    n: Counter[str] = Counter()
    for k in range(1, seconds * 1000 // step_ms + 1):
        got = node.run(T0 + k * step_ms, c.Dequeue("q", per_call, ack=True))[0]
        assert isinstance(got, list) and len(got) == per_call  # never blocked by the limited group
        n.update(v.group for v in got)
    assert abs(n["noisy"] / seconds - 100) <= 5, n
    assert n["calm"] == seconds * 1000 // step_ms * per_call - n["noisy"]


def test_a_throttled_group_is_skipped_and_wakes_at_its_replicated_time() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_max_per_second=10)))
    node.fill(T0, "q", "a", 15)
    assert node.groups_of(T0, "q", 15) == ["a"] * 10  # a full bucket: one second of 10/s
    assert not node.m.has_deliverable("q")
    assert node.m.throttled_groups("q") == 1
    assert node.m.next_due_ms() == T0 + 100  # 1000 milli-tokens at 10 per second: 100 ms
    stats = node.m.group_stats("q")
    assert stats == [GroupStats("a", 5, 0, 1, 10, True, False)]
    node.run(T0 + 99, c.Tick())
    assert not node.m.has_deliverable("q")
    node.run(T0 + 100, c.Tick())
    assert node.m.has_deliverable("q") and "q" in node.m.take_changed()
    assert node.m.throttled_groups("q") == 0
    assert node.groups_of(T0 + 100, "q", 5) == ["a"]


def test_raising_or_removing_the_rate_frees_a_throttled_group_at_once() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings()))
    node.run(T0, c.SetGroupPolicy("q", "a", max_per_second=1))
    node.fill(T0, "q", "a", 5)
    assert node.groups_of(T0, "q", 5) == ["a"]
    got = node.run(T0 + 1, c.SetGroupPolicy("q", "a", max_per_second=0))[0]
    assert got == GroupStats("a", 4, 0, 1, 0, False, True)
    assert node.groups_of(T0 + 1, "q", 5) == ["a"] * 4
    got = node.run(T0 + 1, c.SetGroupPolicy("q", "a", max_per_second=-1, weight=0))[0]
    assert got == GroupStats("a", 0, 0, 1, 0, False, False)
    assert node.m.group_stats("q") == []  # nothing left to keep
    assert not [k for k in node.store.data if k[:1] == b"W"]


@pytest.mark.parametrize("cmd,err", [
    (c.SetGroupPolicy("q", "g", weight=-1), InvalidArgument),
    (c.SetGroupPolicy("q", "g", weight=10_001), InvalidArgument),
    (c.SetGroupPolicy("q", "g", weight=2**40), InvalidArgument),
    (c.SetGroupPolicy("q", "g", max_per_second=-2), InvalidArgument),
    (c.SetGroupPolicy("q", "g", max_per_second=1_000_001), InvalidArgument),
    (c.SetGroupPolicy("q", "g", weight=True), InvalidArgument),
    (c.SetGroupPolicy("nope", "g", weight=2), QueueNotFound),
    (c.SetGroupPolicy("d", "g", weight=2), FailedPrecondition),
    (c.UpdateQueue("q", QueueSettings(default_group_weight=-1)), InvalidArgument),
    (c.UpdateQueue("q", QueueSettings(default_group_weight=10_001)), InvalidArgument),
    (c.UpdateQueue("q", QueueSettings(default_group_max_per_second=-5)), InvalidArgument),
    (c.CreateQueue("z", "fair", QueueSettings(default_group_max_per_second=10**9)), InvalidArgument),
])
def test_bad_group_policy_is_refused_and_changes_nothing(cmd: c.Command, err: type) -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings()), c.CreateQueue("d", "delayed", QueueSettings()))
    node.run(T0, c.SetGroupPolicy("q", "g", weight=2, max_per_second=7))
    node.fill(T0, "q", "g", 3)
    before = dict(node.store.data)
    got = node.m.apply(99, c.CommandBatch(T0, [cmd]))[0]  # (a zero weight is a reset, not an error)
    assert isinstance(got, err)
    assert node.store.data == before
    if isinstance(got, FailedPrecondition):
        assert got.reason == "NOT_FAIR_QUEUE"


def test_codec_tags_of_group_commands_and_old_tags_unchanged() -> None:
    plain = c.CreateQueue("q", "fair", QueueSettings(max_unacked_per_group=2))
    grouped = c.CreateQueue("q", "fair", QueueSettings(default_group_weight=3, default_group_max_per_second=9))
    limited = c.CreateQueue("q", "fair", QueueSettings(default_group_weight=3), max_queues=4)
    upd_plain = c.UpdateQueue("q", QueueSettings(visibility_timeout_ms=5))
    upd = c.UpdateQueue("q", QueueSettings(default_group_max_per_second=9))
    sets = [c.SetGroupPolicy("q", "g"), c.SetGroupPolicy("q", "g", 0, -1), c.SetGroupPolicy("q", "gé", 7, None),
            c.SetGroupPolicy("q", "", None, 100)]
    hdr = 1 + 8 + 4
    tags = {}
    for cmd in [plain, grouped, limited, upd_plain, upd, *sets]:
        raw = codec.encode_batch(c.CommandBatch(5, [cmd]))
        assert codec.decode_batch(raw).commands == [cmd]
        tags[cmd] = raw[hdr]
    assert (tags[plain], tags[upd_plain]) == (1, 2)  # as before
    assert (tags[grouped], tags[limited], tags[upd]) == (50, 50, 51)
    assert {tags[s] for s in sets} == {52}


def _scenario(node: Node, ops: list[tuple[int, int, int]]) -> None:
    """A random mix of group policies, enqueues and dequeues over replicated time."""
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_max_per_second=50)))
    now = T0
    for kind, a, b in ops:
        now += b * 7
        g = "abcd"[a % 4]
        if kind == 0:
            node.run(now, c.SetGroupPolicy("q", g, weight=a % 6, max_per_second=[-1, 0, 20, 300][b % 4]))
        elif kind == 1:
            node.run(now, c.Enqueue("q", [c.EnqueueItem(b"m", g) for _ in range(1 + b % 9)]))
        elif kind == 2:
            node.run(now, c.Dequeue("q", 1 + a % 5, ack=bool(b % 2)))
        elif kind == 3:
            node.run(now, c.UpdateQueue("q", QueueSettings(default_group_weight=a % 3,
                                                           default_group_max_per_second=[0, 10, 50][b % 3])))
        else:
            node.run(now, c.Tick())


ops_st = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 20), st.integers(0, 40)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=ops_st)
def test_replaying_the_log_gives_the_same_records_and_a_rebuild_continues_identically(
        ops: list[tuple[int, int, int]]) -> None:
    a = Node()
    _scenario(a, ops)
    b = Node()
    for i, raw in enumerate(a.log, start=1):
        b.m.apply(i, codec.decode_batch(raw))
    assert b.store.data == a.store.data
    # a replica rebuilt from the records alone takes the same deliveries from here on
    fresh = QueueMachine(a.store)
    fresh.load(a.store.items())
    assert fresh.group_stats("q") == a.m.group_stats("q")
    assert fresh.next_due_ms() == a.m.next_due_ms()
    now = a.m.now_ms
    for step in range(1, 40):
        batch = c.CommandBatch(now + step * 13, [c.Dequeue("q", 3, ack=True)])
        x = a.m.apply(10_000 + step, batch)
        y = b.m.apply(10_000 + step, batch)
        assert [[v.id for v in r] for r in x] == [[v.id for v in r] for r in y]  # type: ignore[attr-defined]
    assert b.store.data == a.store.data


def test_buckets_that_fill_again_are_forgotten() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_max_per_second=10)))
    for g in ("a", "b", "c"):
        node.fill(T0, "q", g, 1)
    node.groups_of(T0, "q", 3)
    assert len([k for k in node.store.data if k[:1] == b"W"]) == 3
    node.run(T0 + 99, c.Tick())
    assert len([k for k in node.store.data if k[:1] == b"W"]) == 3
    node.run(T0 + 100, c.Tick())  # full again (10 tokens at 10/s, one taken): nothing to remember
    assert not [k for k in node.store.data if k[:1] == b"W"]
    assert node.m.next_due_ms() is None


@pytest.mark.parametrize("raise_by", ["override", "default"])
def test_a_group_whose_bucket_filled_again_bursts_at_its_new_rate(raise_by: str) -> None:
    """A full bucket is full under any rate: raising the rate of a group that went quiet
    gives it the new rate's whole burst (as a group never seen), not the old one's."""
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_max_per_second=5)))
    node.fill(T0, "q", "a", 1)
    assert node.groups_of(T0, "q", 1) == ["a"]  # 4 of 5 tokens left
    node.run(T0 + 300, c.Tick())  # full again at T0 + 200: forgotten
    if raise_by == "override":
        node.run(T0 + 300, c.SetGroupPolicy("q", "a", max_per_second=10))
    else:
        node.run(T0 + 300, c.UpdateQueue("q", QueueSettings(default_group_max_per_second=10)))
    node.fill(T0 + 300, "q", "a", 12)
    assert node.groups_of(T0 + 300, "q", 12) == ["a"] * 10
    assert node.m.next_due_ms() == T0 + 400


def test_deleting_a_queue_deletes_its_group_records() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings()))
    node.run(T0, c.SetGroupPolicy("q", "g", weight=4, max_per_second=1))
    node.fill(T0, "q", "g", 3)
    node.groups_of(T0, "q", 2)
    node.run(T0, c.DeleteQueue("q"))
    assert [k for k in node.store.data if k[:1] != b"G"] == []
    assert node.m.next_due_ms() is None


@settings(max_examples=100, deadline=None)
@given(ops=ops_st, weights=st.lists(st.integers(1, 4), min_size=4, max_size=4),
       rates=st.lists(st.sampled_from([-1, 0, 20, 1000]), min_size=4, max_size=4),
       k=st.integers(0, 25), dt=st.sampled_from([0, 30, 2000]), n=st.integers(1, 40),
       limit=st.sampled_from([0, 1, 3]))
def test_peek_shows_exactly_what_the_next_dequeue_takes(
        ops: list[tuple[int, int, int]], weights: list[int], rates: list[int], k: int, dt: int, n: int,
        limit: int) -> None:
    from doq.queues.model import MessageState

    node = Node()
    _scenario(node, ops)  # some history, then a rotation caught in the middle of a turn
    now = node.m.now_ms
    node.run(now, c.UpdateQueue("q", QueueSettings(max_unacked_per_group=limit, default_group_max_per_second=50)),
             *[c.SetGroupPolicy("q", g, w, r) for g, w, r in zip("abcd", weights, rates, strict=True)],
             *[c.Enqueue("q", [c.EnqueueItem(b"m", g) for _ in range(10)]) for g in "abcd"])
    if k:
        node.run(now, c.Dequeue("q", k, ack=True))
    node.run(now + dt, c.Tick())  # time passes: buckets refill
    peeked = node.m.peek_ids("q", MessageState.READY, 0, n)
    got = node.run(node.m.now_ms, c.Dequeue("q", n))[0]
    assert isinstance(got, list)
    assert peeked == [v.id for v in got]


def test_peek_of_a_partly_spent_group_shows_only_what_its_bucket_still_allows() -> None:
    from doq.queues.model import MessageState

    node = Node()
    node.run(T0, c.CreateQueue("q", "fair", QueueSettings(default_group_max_per_second=10)))
    node.fill(T0, "q", "a", 15)
    assert node.groups_of(T0, "q", 4) == ["a"] * 4  # 4 of the bucket's 10 tokens spent
    peeked = node.m.peek_ids("q", MessageState.READY, 0, 15)
    got = node.run(T0, c.Dequeue("q", 15))[0]
    assert isinstance(got, list) and len(got) == 6
    assert peeked == [v.id for v in got]


def test_only_a_fair_queue_has_throttled_groups() -> None:
    node = Node()
    node.run(T0, c.CreateQueue("d", "delayed", QueueSettings()))
    assert node.m.throttled_groups("d") == 0 and node.m.throttled_groups("nope") == 0


def test_each_fair_queue_wakes_its_throttled_groups_at_its_own_time() -> None:
    """A queue whose throttled group is due wakes it even while another queue's (earlier
    by name) group still waits."""
    node = Node()
    node.run(T0, c.CreateQueue("a", "fair", QueueSettings(default_group_max_per_second=1)))
    node.run(T0, c.CreateQueue("b", "fair", QueueSettings(default_group_max_per_second=10)))
    node.fill(T0, "a", "g", 3)
    node.fill(T0, "b", "g", 15)
    assert node.groups_of(T0, "a", 3) == ["g"]  # one a second: next at T0 + 1000
    assert node.groups_of(T0, "b", 15) == ["g"] * 10  # ten a second: next at T0 + 100
    assert not node.m.has_deliverable("a") and not node.m.has_deliverable("b")
    node.run(T0 + 100, c.Tick())
    assert node.m.has_deliverable("b") and not node.m.has_deliverable("a")
