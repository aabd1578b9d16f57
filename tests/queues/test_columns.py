"""`EnqueueColumns`: the column path stores exactly what `Enqueue` of the same messages
stores (records, indexes, results), fast path (contents only) and general path alike."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.errors import DoqError, InvalidArgument
from doq.queues import commands as c
from doq.queues.model import EnqueueColumnsResult, EnqueueResult
from tests.queues.test_machine_rules import T0, Harness


def _pair(type_: str = "delayed") -> tuple[Harness, Harness]:
    a, b = Harness(), Harness()
    for h in (a, b):
        h.create("q", type_, dedup_window_ms=60_000)
    return a, b


def _same_state(a: Harness, b: Harness) -> None:
    assert a.store.data == b.store.data
    assert a.m.queue_info("q") == b.m.queue_info("q")
    assert a.m.next_due_ms() == b.m.next_due_ms()
    got_a = [(v.id, v.content, v.group, v.priority) for v in a.dequeue("q", 100)]
    got_b = [(v.id, v.content, v.group, v.priority) for v in b.dequeue("q", 100)]
    assert got_a == got_b


def _as_columns(results: list[EnqueueResult | DoqError]) -> tuple[list[int], list[int], list[int]]:
    ids = [0 if isinstance(r, DoqError) else r.id for r in results]
    dups = [i for i, r in enumerate(results) if isinstance(r, EnqueueResult) and r.duplicate]
    deliver = [0 if isinstance(r, DoqError) else r.deliver_at_ms for r in results]
    return ids, dups, deliver if any(deliver) else []


@pytest.mark.parametrize("type_", ["delayed", "fair"])
def test_contents_only_match_enqueue(type_: str) -> None:
    a, b = _pair(type_)
    contents = [b"m%d" % i for i in range(50)]
    general = a.m._enqueue_items
    a.m._enqueue_items = None  # type: ignore[assignment,method-assign]  # the column path must not need it
    res = a.one(c.EnqueueColumns("q", list(contents)))
    a.m._enqueue_items = general  # type: ignore[method-assign]
    want = b.one(c.Enqueue("q", [c.EnqueueItem(x) for x in contents]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert list(res.ids) == [r.id for r in want]
    assert (res.duplicates, res.deliver_at_ms, res.errors) == ([], [], {})
    # a second batch lands after the first (ids keep growing)
    assert list(a.one(c.EnqueueColumns("q", [b"z"])).ids) == [51]  # type: ignore[attr-defined]
    b.one(c.Enqueue("q", [c.EnqueueItem(b"z")]))
    _same_state(a, b)


@pytest.mark.parametrize("type_", ["delayed", "fair"])
def test_every_column_matches_enqueue(type_: str) -> None:
    a, b = _pair(type_)
    rows = [
        (b"a", "g1", 5, {"k": "v"}, "d1", 0),
        (b"b", "g2", 0, {}, "", 5_000),
        (b"c", "g1", 2_000_000_000, {}, "d1", 0),  # duplicate of d1; timestamp priority
        (b"d", "", -3, {"x": "y", "a": "b"}, "d2", 0),
    ]
    cols = c.EnqueueColumns("q", *[list(col) for col in zip(*rows, strict=True)])  # type: ignore[arg-type]
    res = a.one(cols)
    want = b.one(c.Enqueue("q", [c.EnqueueItem(*r) for r in rows]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    assert res.duplicates == [2] and res.deliver_at_ms
    _same_state(a, b)


def test_a_bad_message_fails_alone_in_the_general_path() -> None:
    a, _ = _pair()
    res = a.one(c.EnqueueColumns("q", [b"ok", "not bytes", b"ok2"]))  # type: ignore[list-item]
    assert isinstance(res, EnqueueColumnsResult)
    assert res.ids[1] == 0 and res.ids[0] and res.ids[2]
    assert list(res.errors) == [1] and isinstance(res.errors[1], InvalidArgument)


def test_a_column_of_another_length_refuses_the_command() -> None:
    a, _ = _pair()
    before = dict(a.store.data)
    next_id = a.m.next_id
    res = a.one(c.EnqueueColumns("q", [b"a", b"b"], groups=["g"]))
    assert isinstance(res, InvalidArgument) and res.reason == "INVALID_COLUMNS"
    assert a.m.next_id == next_id and a.m.queue_info("q").stats.ready == 0
    assert {k: v for k, v in a.store.data.items() if k[:1] != b"G"} == {
        k: v for k, v in before.items() if k[:1] != b"G"}


def test_an_empty_command_stores_nothing() -> None:
    a, _ = _pair()
    res = a.one(c.EnqueueColumns("q", []))
    assert isinstance(res, EnqueueColumnsResult) and len(res) == 0
    assert a.m.queue_info("q").stats.total == 0


def test_rebuilt_replica_matches_after_columns() -> None:
    a, _ = _pair()
    a.one(c.EnqueueColumns("q", [b"x"] * 10))
    a.one(c.EnqueueColumns("q", [b"y"] * 3, priorities=[3, 2, 1]))
    fresh = Harness()
    fresh.store = a.store
    fresh.m.store = a.store
    fresh.m.load(a.store.items())
    assert fresh.m.queue_info("q") == a.m.queue_info("q")
    assert [v.id for v in fresh.dequeue("q", 20)] == [v.id for v in a.dequeue("q", 20)]


def test_unknown_queue() -> None:
    a, _ = _pair()
    res = a.one(c.EnqueueColumns("nope", [b"x"]))
    assert isinstance(res, DoqError) and res.reason == "QUEUE_NOT_FOUND"


@pytest.mark.parametrize("type_", ["delayed", "fair"])
def test_fresh_dedup_ids_take_the_column_path_with_the_same_records(type_: str) -> None:
    a, b = _pair(type_)
    contents = [b"m%d" % i for i in range(20)]
    dids = [f"p-{i:04d}" for i in range(20)]
    general = a.m._enqueue_items
    a.m._enqueue_items = None  # type: ignore[assignment,method-assign]  # the column path must not need it
    res = a.one(c.EnqueueColumns("q", list(contents), dedup_ids=list(dids)))
    a.m._enqueue_items = general  # type: ignore[method-assign]
    want = b.one(c.Enqueue("q", [c.EnqueueItem(x, dedup_id=d) for x, d in zip(contents, dids, strict=True)]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    assert a.m.dedup_exp == b.m.dedup_exp
    # a resend of some of them (and a new one) answers the original ids as duplicates
    again = a.one(c.EnqueueColumns("q", [b"m3", b"new", b"m5"], dedup_ids=[dids[3], "p-new", dids[5]]))
    again_b = b.one(c.Enqueue("q", [c.EnqueueItem(b"m3", dedup_id=dids[3]), c.EnqueueItem(b"new", dedup_id="p-new"),
                                    c.EnqueueItem(b"m5", dedup_id=dids[5])]))
    assert isinstance(again, EnqueueColumnsResult) and isinstance(again_b, list)
    assert (list(again.ids), again.duplicates) == _as_columns(again_b)[:2]
    assert again.duplicates == [0, 2] and list(again.ids)[0] == res.ids[3]
    _same_state(a, b)


@pytest.mark.parametrize("dids", [
    ["same", "same"],  # repeated within the command: the second is a duplicate of the first
    ["", "x"],  # a message without a dedup id among others
    ["a", "bb"],  # of different lengths
    ["\ud800", "x"],  # not encodable: that message fails alone
])
def test_other_dedup_columns_match_enqueue(dids: list[str]) -> None:
    a, b = _pair()
    res = a.one(c.EnqueueColumns("q", [b"1", b"2"], dedup_ids=list(dids)))
    want = b.one(c.Enqueue("q", [c.EnqueueItem(b"1", dedup_id=dids[0]), c.EnqueueItem(b"2", dedup_id=dids[1])]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    assert sorted(res.errors) == [i for i, r in enumerate(want) if isinstance(r, DoqError)]
    _same_state(a, b)


def test_dedup_window_expiry_after_the_column_path() -> None:
    a, b = _pair()
    a.one(c.EnqueueColumns("q", [b"1", b"2"], dedup_ids=["x1", "x2"]))
    b.one(c.Enqueue("q", [c.EnqueueItem(b"1", dedup_id="x1"), c.EnqueueItem(b"2", dedup_id="x2")]))
    later = a.now + 61_000
    for h in (a, b):
        h.run(c.Tick(), at=later)
    assert a.store.data == b.store.data and not a.m.dedup_exp


_PRIOS = st.one_of(st.integers(-5, 5), st.integers(0, 10**9 - 1),
                   st.integers(T0 // 1000 - 100, T0 // 1000 + 100),  # timestamps: due or not yet
                   st.sampled_from([-(2**63), 2**63 - 1]))


@settings(max_examples=60, deadline=None)
@example(type_="delayed", rows=[(0, "a"), (0, "b"), (0, "a")], with_prios=False, with_groups=True,
         dedup="none")  # groups alone
@example(type_="delayed", rows=[(T0 // 1000, ""), (T0 // 1000 + 1, ""), (3, "")], with_prios=True,
         with_groups=False, dedup="none")  # a timestamp priority due exactly now, one not yet
@example(type_="fair", rows=[(T0 // 1000, "a"), (T0 // 1000 + 1, "b")], with_prios=True,
         with_groups=True, dedup="run")
@given(type_=st.sampled_from(["delayed", "fair"]),
       rows=st.lists(st.tuples(_PRIOS, st.sampled_from(["", "a", "b", "zz", "é"])), min_size=1, max_size=40),
       with_prios=st.booleans(), with_groups=st.booleans(),
       dedup=st.sampled_from(["none", "fresh", "run"]))
def test_priorities_and_groups_take_a_column_path_with_the_same_state(
        type_: str, rows: list[tuple[int, str]], with_prios: bool, with_groups: bool, dedup: str) -> None:
    """Priorities and groups (what a producer's frames carry for delayed and fair queues)
    skip the per-message path and store what `Enqueue` of the same messages stores."""
    a, b = _pair(type_)
    for h in (a, b):  # a backlog in the indexes already
        h.one(c.Enqueue("q", [c.EnqueueItem(b"old", "a", 3), c.EnqueueItem(b"old", "b", T0 // 1000 + 50)]))
    n = len(rows)
    prios = [p for p, _ in rows] if with_prios else []
    groups = [g for _, g in rows] if with_groups else []
    dids = {"none": [], "fresh": [f"id-{i:04d}" for i in range(n)],
            "run": [f"00112233aabbccdd-{i + 1:012x}" for i in range(n)]}[dedup]
    contents = [b"m%d" % i for i in range(n)]
    general = a.m._enqueue_items
    if with_prios or with_groups:
        a.m._enqueue_items = None  # type: ignore[assignment,method-assign]  # the column path must not need it
    res = a.one(c.EnqueueColumns("q", list(contents), list(groups), list(prios), [], list(dids)))
    a.m._enqueue_items = general  # type: ignore[method-assign]
    want = b.one(c.Enqueue("q", [c.EnqueueItem(x, groups[i] if groups else "", prios[i] if prios else 0,
                                               {}, dids[i] if dids else "")
                                 for i, x in enumerate(contents)]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    assert res.errors == {}
    assert a.m.dedup_n == b.m.dedup_n
    assert a.m.next_due_ms() == b.m.next_due_ms()  # the first delay to end, before any comes due
    for h in (a, b):
        h.run(c.Tick(), at=T0 + 200_000)  # the timestamps come due
    _same_state(a, b)


@pytest.mark.parametrize("type_", ["delayed", "fair"])
def test_a_batch_of_timestamps_brings_the_next_due_time_forward_only_if_earlier(type_: str) -> None:
    """The machine's next due time after a batch of timestamp priorities is the earliest
    delay of the queue, whether the batch's earliest is before it, after it or the first:
    and the message due first becomes ready at its time, not later."""
    h = Harness()
    h.create("q", type_)
    s = T0 // 1000
    for batch, first_s in (([s + 90, s + 70], s + 70), ([s + 80, s + 95], s + 70), ([s + 99, s + 20, s + 60], s + 20)):
        h.one(c.EnqueueColumns("q", [b"x"] * len(batch), ["g"] * len(batch) if type_ == "fair" else [], batch))
        assert h.m.next_due_ms() == first_s * 1000
    h.run(c.Tick(), at=(s + 20) * 1000)
    assert [v.priority for v in h.dequeue("q", 10)] == [s + 20]


def test_a_bad_priority_or_group_takes_the_per_message_path() -> None:
    a, b = _pair("fair")
    rows = [(b"a", "g", 1), (b"b", "\ud800", 2), (b"c", "g", 3)]  # a lone surrogate is no UTF-8
    res = a.one(c.EnqueueColumns("q", [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]))
    want = b.one(c.Enqueue("q", [c.EnqueueItem(*r) for r in rows]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert list(res.errors) == [1] and (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    _same_state(a, b)


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1])
def test_a_priority_beyond_64_bits_fails_alone_and_the_others_are_enqueued(bad: int) -> None:
    """A priority outside int64 is that message's error (as in `Enqueue`); the batch's
    other messages are enqueued, with their priorities."""
    a, b = _pair("delayed")
    rows = [(b"a", "", 1), (b"b", "", bad), (b"c", "", 3)]
    res = a.one(c.EnqueueColumns("q", [r[0] for r in rows], [], [r[2] for r in rows]))
    want = b.one(c.Enqueue("q", [c.EnqueueItem(*r) for r in rows]))
    assert isinstance(res, EnqueueColumnsResult) and isinstance(want, list)
    assert list(res.errors) == [1] and isinstance(res.errors[1], InvalidArgument)
    assert (list(res.ids), res.duplicates, res.deliver_at_ms) == _as_columns(want)
    _same_state(a, b)


def test_metadata_that_is_not_a_map_fails_its_message_saying_so() -> None:
    a, _ = _pair()
    res = a.one(c.EnqueueColumns("q", [b"a", b"b"], metadata=[{}, ["k", "v"]]))  # type: ignore[list-item]
    assert isinstance(res, EnqueueColumnsResult) and list(res.errors) == [1] and res.ids[0]
    err = res.errors[1]
    assert isinstance(err, InvalidArgument) and err.reason == "INVALID_METADATA"
    assert str(err) == "metadata must be a map of strings"


def test_an_enqueue_whose_items_are_not_a_list_is_refused_saying_so() -> None:
    a, _ = _pair()
    res = a.one(c.Enqueue("q", (c.EnqueueItem(b"x"),)))  # type: ignore[arg-type]
    assert isinstance(res, InvalidArgument) and str(res) == "items must be a list"
    assert a.m.queue_info("q").stats.ready == 0
