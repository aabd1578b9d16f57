"""`EnqueueColumns`: the column path stores exactly what `Enqueue` of the same messages
stores (records, indexes, results), fast path (contents only) and general path alike."""

from __future__ import annotations

import pytest

from doq.errors import DoqError, InvalidArgument
from doq.queues import commands as c
from doq.queues.model import EnqueueColumnsResult, EnqueueResult
from tests.queues.test_machine_rules import Harness


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
