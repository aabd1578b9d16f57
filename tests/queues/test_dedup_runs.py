"""Canonical dedup ids (what producers stamp) are remembered as runs: one record per run of
a producer's consecutive ids, with the same dedup rules as ids remembered one by one."""

from __future__ import annotations

import pytest

from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues import machine as M
from doq.queues import records as R
from doq.queues.model import EnqueueColumnsResult, EnqueueResult
from tests.queues.test_machine_rules import Harness

P = "0123456789abcdef-"
Q = "fedcba9876543210-"
WINDOW_MS = 60_000


def ids_of(producer: str, first: int, n: int) -> list[str]:
    return [f"{producer}{s:012x}" for s in range(first, first + n)]


def _pair() -> tuple[Harness, Harness]:
    a, b = Harness(), Harness()
    for h in (a, b):
        h.create("q", dedup_window_ms=WINDOW_MS)
    return a, b


def cols(h: Harness, dids: list[str], at: int | None = None) -> EnqueueColumnsResult:
    res = h.one(c.EnqueueColumns("q", [b"c-" + d.encode() for d in dids], dedup_ids=list(dids)), at=at)
    assert isinstance(res, EnqueueColumnsResult), res
    return res


def items(h: Harness, dids: list[str], at: int | None = None) -> list[EnqueueResult]:
    res = h.one(c.Enqueue("q", [c.EnqueueItem(b"c-" + d.encode(), dedup_id=d) for d in dids]), at=at)
    assert isinstance(res, list) and all(isinstance(r, EnqueueResult) for r in res), res
    return res  # type: ignore[return-value]


def dedup_records(h: Harness) -> dict[bytes, tuple[int, int, int]]:
    return {k: R.decode_dedup(v) for k, v in h.store.data.items() if k[0] == K.DEDUP}


def test_a_producers_frame_is_one_record_as_by_the_per_message_path() -> None:
    a, b = _pair()
    dids = ids_of(P, 1, 1000)
    general = a.m._enqueue_items
    a.m._enqueue_items = None  # type: ignore[assignment,method-assign]  # the column path must not need it
    res = cols(a, dids)
    a.m._enqueue_items = general  # type: ignore[method-assign]
    want = items(b, dids)
    assert list(res.ids) == [r.id for r in want] == list(range(1, 1001))
    assert dedup_records(a) == {K.dedup_key("q", dids[0]): (1, a.now + WINDOW_MS, 1000)}
    assert a.store.data == b.store.data and a.m.dedup_exp == b.m.dedup_exp
    assert a.m.dedup_n == b.m.dedup_n == 1000
    # the messages keep their dedup ids
    assert [v.dedup_id for v in a.dequeue("q", 3)] == dids[:3]


def test_a_resend_is_answered_with_the_original_ids_also_when_it_overlaps_partly() -> None:
    a, b = _pair()
    first = cols(a, ids_of(P, 1, 10))
    items(b, ids_of(P, 1, 10))
    t0 = a.now
    res = cols(a, ids_of(P, 6, 10), at=t0 + 1)  # 6..10 were stored, 11..15 are new
    want = items(b, ids_of(P, 6, 10), at=t0 + 1)
    assert res.duplicates == [0, 1, 2, 3, 4] == [i for i, r in enumerate(want) if r.duplicate]
    assert list(res.ids)[:5] == list(first.ids)[5:]
    assert list(res.ids)[5:] == [11, 12, 13, 14, 15] == [r.id for r in want][5:]
    assert a.store.data == b.store.data
    assert sorted(dedup_records(a).values()) == [(1, t0 + WINDOW_MS, 10), (11, t0 + 1 + WINDOW_MS, 5)]
    # one id of a run, alone and among ids of another producer and a user's own id
    again = items(a, [ids_of(P, 8, 1)[0], ids_of(Q, 1, 1)[0], "mine", ids_of(P, 16, 1)[0]])
    assert [(r.id, r.duplicate) for r in again] == [(8, True), (16, False), (17, False), (18, False)]
    assert a.m.queue_info("q").stats.ready == 18


def test_ids_stored_one_by_one_extend_one_run_within_one_replicated_ms() -> None:
    a, b = _pair()
    dids = ids_of(P, 5, 4)
    a.run(*[c.Enqueue("q", [c.EnqueueItem(b"x", dedup_id=d)]) for d in dids])  # one frame each
    b.run(c.EnqueueColumns("q", [b"x"] * 4, dedup_ids=list(dids)))
    assert a.store.data == b.store.data and len(dedup_records(a)) == 1
    # a later ms starts another run (another expiry), and so do ids of another message order
    a.run(c.Enqueue("q", [c.EnqueueItem(b"x", dedup_id=ids_of(P, 9, 1)[0])]), at=a.now + 1)
    assert len(dedup_records(a)) == 2 and a.m.dedup_n == 5


def test_expiry_forgets_a_run_at_once_and_its_ids_are_stored_anew() -> None:
    a, b = _pair()
    cols(a, ids_of(P, 1, 50))
    items(b, ids_of(P, 1, 50))
    t0 = a.now
    assert cols(a, ids_of(P, 50, 1), at=t0 + WINDOW_MS - 1).duplicates == [0]
    items(b, ids_of(P, 50, 1), at=t0 + WINDOW_MS - 1)
    res = cols(a, ids_of(P, 1, 2), at=t0 + WINDOW_MS)
    items(b, ids_of(P, 1, 2), at=t0 + WINDOW_MS)
    assert res.duplicates == [] and list(res.ids) == [51, 52]
    assert a.store.data == b.store.data
    assert dedup_records(a) == {K.dedup_key("q", ids_of(P, 1, 1)[0]): (51, t0 + 2 * WINDOW_MS, 2)}
    assert a.m.dedup_n == 2 and len(a.m.dedup_exp) == 1


def test_the_cap_counts_ids_and_forgets_the_earliest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "MAX_DEDUP_ENTRIES", 5)
    a, b = _pair()
    t0 = a.now
    cols(a, ids_of(P, 1, 4))
    items(b, ids_of(P, 1, 4))
    cols(a, ids_of(Q, 1, 3), at=t0 + 1)  # 7 ids: P's first two go (they expire first)
    items(b, ids_of(Q, 1, 3), at=t0 + 1)
    assert a.store.data == b.store.data and a.m.dedup_n == 5
    assert sorted(dedup_records(a).values()) == [(3, t0 + WINDOW_MS, 2), (5, t0 + 1 + WINDOW_MS, 3)]
    res = items(a, ids_of(P, 3, 1) + ids_of(P, 1, 1))  # P-1 is new again: P-3 goes
    assert [(r.id, r.duplicate) for r in res] == [(3, True), (8, False)]
    assert a.m.dedup_n == 5
    assert sorted(dedup_records(a).values()) == [
        (4, t0 + WINDOW_MS, 1), (5, t0 + 1 + WINDOW_MS, 3), (8, t0 + 1 + WINDOW_MS, 1)]


def test_the_cap_forgets_ids_in_the_order_of_one_at_a_time_when_another_id_sorts_inside_a_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids that expire at once are forgotten in dedup id order, one id at a time; a plain id
    of the same expiry that sorts between the ids of a run (here `P-00000000000g`, between
    P-f and P-10) is forgotten before the run's later ids, as before runs."""
    monkeypatch.setattr(M, "MAX_DEDUP_ENTRIES", 2)
    plain = P + "00000000000g"
    h = Harness()
    h.create("q", dedup_window_ms=WINDOW_MS)
    t = h.now
    h.one(c.Enqueue("q", [c.EnqueueItem(b"x", dedup_id=plain)]), at=t)
    cols(h, ids_of(P, 0xE, 4), at=t)  # P-e P-f P-10 P-11: 5 ids, 3 go: P-e, P-f and the plain one
    assert h.m.dedup_n == 2
    res = items(h, [*ids_of(P, 0x10, 2), plain], at=t)
    assert [(r.id, r.duplicate) for r in res] == [(4, True), (5, True), (6, False)]


def test_ids_of_the_canonical_form_stored_one_by_one_load_as_runs() -> None:
    """State written before runs (one 16-byte record per id) restores and keeps deduplicating."""
    a, _ = _pair()
    dids = ids_of(P, 1, 3)
    items(a, [dids[0]])
    items(a, [dids[1]], at=a.now + 1)
    exp = a.now + WINDOW_MS
    a.store.data[K.dedup_key("q", dids[2])] = R.DEDUP_REC.pack(77, exp)  # as the old code wrote
    fresh = Harness()
    fresh.now, fresh.index = a.now, a.index
    fresh.store = a.store
    fresh.m.store = a.store
    fresh.m.load(a.store.items())
    assert fresh.m.dedup_n == 3
    res = items(fresh, [*dids, ids_of(P, 4, 1)[0]])
    assert [(r.id, r.duplicate) for r in res] == [(1, True), (2, True), (77, True), (3, False)]


@pytest.mark.parametrize("bad", [
    {ids_of(P, 1, 1)[0]: R.encode_dedup(1, 9, 3), ids_of(P, 2, 1)[0]: R.encode_dedup(4, 9)},  # overlap
    {"plain": R.encode_dedup(1, 9, 3)},  # a run under a non-canonical id
    {ids_of(P, 1, 1)[0]: R.DEDUP_RUN_REC.pack(1, 9, 1)},  # a run record of one id
    {ids_of(P, 1, 1)[0]: b"short"},
])
def test_load_refuses_dedup_records_that_are_no_state(bad: dict[str, bytes]) -> None:
    a, _ = _pair()
    for did, rec in bad.items():
        a.store.data[K.dedup_key("q", did)] = rec
    with pytest.raises(Exception):  # noqa: B017  (ValueError or struct.error)
        a.m.load(a.store.items())


def test_deleting_the_queue_forgets_its_runs() -> None:
    a, _ = _pair()
    a.create("other", dedup_window_ms=WINDOW_MS)
    cols(a, ids_of(P, 1, 5))
    items(a, ["plain"])
    a.one(c.EnqueueColumns("other", [b"x"], dedup_ids=ids_of(P, 1, 1)))
    assert a.one(c.DeleteQueue("q")) is None
    assert a.m.dedup_n == 1 and [d for _, _, d in a.m.dedup_exp] == ids_of(P, 1, 1)
    assert [k for k in a.store.data if k[0] == K.DEDUP] == [K.dedup_key("other", ids_of(P, 1, 1)[0])]
    a.create("q", dedup_window_ms=WINDOW_MS)
    assert cols(a, ids_of(P, 1, 2)).duplicates == []


def test_forms_near_the_canonical_one_are_plain_ids() -> None:
    a, b = _pair()
    near = ["0123456789ABCDEF-000000000001",  # upper case
            "0123456789abcdef-00000000001",  # 11 digits
            "0123456789abcdef_000000000001",
            "0123456789abcdef-00000000000g"]
    cols(a, near)
    items(b, near)
    assert a.store.data == b.store.data and not a.m.queues["q"].runs
    assert len(dedup_records(a)) == 4 and all(v[2] == 1 for v in dedup_records(a).values())


def _naive_run(dids: list[object]) -> tuple[str, int] | None:
    d0 = dids[0]
    if type(d0) is not str or len(d0) != 29:
        return None
    import re
    if not re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{12}", d0):
        return None
    first = int(d0[17:], 16)
    want = [f"{d0[:17]}{s:012x}" for s in range(first, first + len(dids))]
    return (d0[:17], first) if want == dids and first + len(dids) <= 1 << 48 else None


@pytest.mark.parametrize("first", [0, 1, 0xFFF0, 0x1FFFE, 0xFFFF_FFFF_FF00, (1 << 48) - 3])
@pytest.mark.parametrize("n", [1, 2, 17, 300])
def test_one_run_is_the_id_by_id_definition(first: int, n: int) -> None:
    from doq.queues.dedupruns import one_run

    good = ids_of(P, first, n)
    assert one_run(good) == _naive_run(good)  # type: ignore[arg-type]
    variants: list[list[object]] = []
    for i in {0, n // 2, n - 1}:
        for bad in (good[i][:-1] + "g", good[i].upper(), good[i][:-1], good[i] + "0", Q + good[i][17:],
                    good[i][:16] + "_" + good[i][17:], 7, good[i - 1] if n > 1 else "x"):
            variants.append([*good[:i], bad, *good[i + 1:]])
    if n > 1:  # same characters, other boundaries: every id must be 29 long
        variants.append([good[0][:-1], good[0][-1] + good[1], *good[2:]])
        variants.append(good[::-1])
    for v in variants:
        assert one_run(v) == _naive_run(v), v[:3]  # type: ignore[arg-type]


def test_a_batch_whose_last_id_starts_a_remembered_run_reports_that_one_duplicate() -> None:
    """A producer re-sends a batch that overlaps an earlier one only in its last message:
    that message is a duplicate (not enqueued twice), the others are new."""
    a, b = _pair()
    a.one(c.EnqueueColumns("q", [b"x"] * 5, dedup_ids=ids_of(P, 10, 5)))
    res = a.one(c.EnqueueColumns("q", [b"y"] * 5, dedup_ids=ids_of(P, 6, 5)))
    assert isinstance(res, EnqueueColumnsResult) and res.duplicates == [4]
    assert a.m.queue_info("q").stats.ready == 9
    b.enqueue("q", *[c.EnqueueItem(b"x", dedup_id=d) for d in ids_of(P, 10, 5)])
    b.enqueue("q", *[c.EnqueueItem(b"y", dedup_id=d) for d in ids_of(P, 6, 5)])
    assert [v.content for v in a.dequeue("q", 20)] == [v.content for v in b.dequeue("q", 20)]


def test_the_cap_forgets_a_whole_run_without_a_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the cap forgets every id of a run at once, nothing of the run stays behind."""
    monkeypatch.setattr(M, "MAX_DEDUP_ENTRIES", 5)
    a, b = _pair()
    t0 = a.now
    cols(a, ids_of(P, 1, 4))
    items(b, ids_of(P, 1, 4))
    cols(a, ids_of(Q, 1, 5), at=t0 + 1)  # 9 ids: all 4 of P's run go
    items(b, ids_of(Q, 1, 5), at=t0 + 1)
    assert a.store.data == b.store.data and a.m.dedup_n == 5
    assert sorted(dedup_records(a).values()) == [(5, t0 + 1 + WINDOW_MS, 5)]
    res = items(a, ids_of(P, 1, 4))  # P's ids are new again
    assert not any(r.duplicate for r in res)
