"""A load split at a key (`QueueMachine.load`'s `stop` and `upper`, the segments of the
upper part made by another machine: `QueueMachine.segments_of`) builds the state a load of
every record in one go builds."""

from __future__ import annotations

import marshal
from array import array
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues import records as R
from doq.queues.machine import QueueMachine
from doq.queues.model import MessageState, QueueSettings
from doq.queues.store import MemoryStore

NOW = 1_800_000_000_000
NAMES = ("a", "f", "p", "t")


def _state(x: QueueMachine) -> list[object]:
    """What a machine holds: each queue's stats, its messages by state, its indexes'
    contents (ready and delayed order, in-flight entries, members), the leases and dues."""
    out: list[object] = [x.next_due_ms(), list(x.leases), list(x.due), x.now_ms, x.next_id]
    for qn in NAMES:
        q = x.queues[qn]
        index: Any = q.index
        out += [x.queue_info(qn).stats,
                [x.peek_ids(qn, s, 0, 10_000) for s in (MessageState.READY, MessageState.DELAYED,
                                                        MessageState.IN_FLIGHT)],
                list(index.ready) if hasattr(index, "ready") else None,
                list(q.delayed) if q.delayed else [], sorted((i, e.key, e.group, e.lease_id) for i, e in q.inflight.items()),
                list(q.inflight), list(q.members), q.n_delayed]
    return out


def _store(items: list[tuple[int, int, int]], take: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """(other records, message records) of a machine holding `items` (queue, priority kind,
    delay) in a plain queue, a delayed queue, a timestamp queue (half due, half later) and
    a fair queue with groups, `take` of each dequeued (in flight)."""
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(NOW, [c.CreateQueue(qn, "fair" if qn == "f" else "delayed", QueueSettings())
                                    for qn in NAMES]))
    for qn in NAMES:
        batch = []
        for q, p, d in items:
            if NAMES[q] != qn:
                continue
            prio = {"p": 0, "a": p, "f": p % 3, "t": NOW // 1000 + p * 7}[qn]
            batch.append(c.EnqueueItem(b"x", group=f"g{p % 4}" if qn == "f" else "", priority=prio,
                                       delay_ms=d * 1000))
        if batch:
            m.apply(2, c.CommandBatch(NOW, [c.Enqueue(qn, batch)]))
        if take:
            m.apply(3, c.CommandBatch(NOW, [c.Dequeue(qn, take, seed=7)]))
    msgs = sorted((k, b"v" * 8 + v) for k, v in store.data.items() if k[0] == K.MESSAGE)
    others = sorted((k, v) for k, v in store.data.items() if k[0] != K.MESSAGE)
    return others, msgs


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-20, 20), st.sampled_from([0, 0, 0, 5, 20_000])),
                min_size=1, max_size=120),
       st.integers(0, 6), st.integers(0, 200), st.sampled_from(["key", "after", "end of queue"]),
       st.sets(st.integers(0, 200), max_size=20), st.sets(st.integers(0, 200), max_size=6),
       st.sampled_from([3, 7, 1024]), st.sampled_from([None, None, 1, 40, 10**6]), st.sampled_from([1, 2, 5]))
def test_a_load_split_at_a_key_is_the_load_in_one_go(items: list[tuple[int, int, int]], take: int, at: int,
                                                    how: str, drop: set[int], swap: set[int], chunk: int,
                                                    split_records: int | None, ranges_min: int) -> None:
    """The records from a split key on loaded by another machine into segments (sent as
    marshal bytes, as the worker process sends them) and joined after the rest: the same
    state as the load of every record, for a plain, a delayed, a timestamp (half due) and
    a fair queue with groups, records in flight, with a not-before delay, left out (gone)
    or replaced (leased) by the overrides, the split inside a queue, right after a
    record, or between queues; several chunk sizes; and the same after later dequeues.
    With `split_records`, both machines distribute their parts of the delayed queues' ready
    pairs into pair ranges (here from `ranges_min` pairs on, on grids of a few pairs a
    range, estimates of the split queue's size from far too few to far too many), joined
    at the end with the pairs that came as columns or records."""
    _check_split(items, take, at, how, drop, swap, chunk, split_records, ranges_min)


@settings(max_examples=60, deadline=None)
# a few pairs of the timestamp queue besides its ranges (late ones among them): the worker's
# part below `ranges_min`, then the start's
@example([(0, p, 0) for p in range(-20, 20)] + [(3, (p * 7) % 41 - 20, 0) for p in range(100)], 0, 130, "key",
         set(), set(), 7, 150, 30)
@example([(0, p, 0) for p in range(-20, 20)] + [(3, (p * 7) % 41 - 20, 0) for p in range(100)], 0, 50, "key",
         set(), set(), 7, 150, 30)
@given(st.lists(st.tuples(st.sampled_from([0, 3]), st.integers(-20, 20), st.sampled_from([0, 0, 0, 0, 0, 5])),
                min_size=60, max_size=300),
       st.integers(0, 4), st.integers(0, 300), st.sampled_from(["key", "after"]),
       st.sets(st.integers(0, 300), max_size=20), st.sets(st.integers(0, 300), max_size=6),
       st.sampled_from([3, 7, 1024]), st.sampled_from([1, 40, 150, 10**6]), st.sampled_from([2, 5, 30]))
def test_a_load_split_with_pair_ranges_is_the_load_in_one_go(items: list[tuple[int, int, int]], take: int, at: int,
                                                            how: str, drop: set[int], swap: set[int], chunk: int,
                                                            split_records: int, ranges_min: int) -> None:
    """As above, with many messages in the random and the timestamp queue: both parts of
    their ready pairs go through pair ranges, joined with the rest."""
    _check_split(items, take, at, how, drop, swap, chunk, split_records, ranges_min)


def _check_split(items: list[tuple[int, int, int]], take: int, at: int, how: str, drop: set[int], swap: set[int],
                 chunk: int, split_records: int | None, ranges_min: int) -> None:
    from doq.queues import machine as M
    from doq.queues import pairlist
    others, msgs = _store(items, take)
    overrides: dict[bytes, bytes | None] = {msgs[i % len(msgs)][0]: None for i in drop}
    for i in swap:
        k, other = msgs[i % len(msgs)][0], msgs[(i + 1) % len(msgs)]
        if other[0][:-8] == k[:-8]:
            overrides[k] = other[1]
    key = msgs[at % len(msgs)][0]
    split = {"key": key, "after": key + b"\x00", "end of queue": key[:-8] + b"\xff" * 9}[how]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", chunk)
        mp.setattr(M, "RANGES_MIN", ranges_min)
        mp.setattr(pairlist, "LOAD", 1)
        mp.setattr(pairlist, "BUCKET_LOADS", 4)
        whole = QueueMachine(MemoryStore())
        whole.load(others, iter(msgs), 8, overrides or None, ordered=True)
        worker = QueueMachine(MemoryStore())
        segs = worker.segments_of([r for r in others if r[0][0] != K.DEDUP],
                                  iter([kv for kv in msgs if kv[0] >= split]), 8,
                                  {k: v for k, v in overrides.items() if k >= split} or None,
                                  split_records=split_records)
        sent = marshal.loads(marshal.dumps(segs))
        parts = QueueMachine(MemoryStore())
        parts.load(others, iter(msgs), 8, overrides or None, ordered=True, stop=split, upper=lambda: sent,
                   split_records=split_records)
        for x in (parts, whole):
            for qn in NAMES:
                for pl in (getattr(x.queues[qn].index, "ready", None), x.queues[qn].delayed):
                    if pl is not None:
                        pl.check()
    assert _state(parts) == _state(whole)
    held = dict(others) | {k: v[8:] for k, v in msgs if k not in overrides}
    held |= {k: v[8:] for k, v in overrides.items() if v is not None}
    for x in (parts, whole):
        x.store.data = dict(held)  # type: ignore[attr-defined]
    for later in (NOW + 6_000, NOW + 100_000, NOW + 12_000_000):  # delays end, timestamps fall due, leases expire
        for x in (parts, whole):
            x.apply(4, c.CommandBatch(later, [c.Dequeue(qn, 7, seed=1) for qn in NAMES]))
        assert _state(parts) == _state(whole)


def test_segments_of_records_that_need_one_by_one_handling_are_their_records() -> None:
    """A chunk the columns do not take (here: a malformed record) comes back as its
    records, the overrides applied; chunks of ready records of one queue as one run of
    columns, the records left out by the overrides cut out."""
    from doq.queues import machine as M
    others, msgs = _store([(2, 0, 0)] * 10 + [(0, 1, 0)] * 10, 0)
    worker = QueueMachine(MemoryStore())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", 5)
        segs = worker.segments_of(others, iter(msgs), 8, {msgs[0][0]: None, msgs[17][0]: msgs[17][1][:8] + b"?"})
    # a: two chunks of columns (one run, its first record left out); p: a chunk of
    # columns, then a chunk holding a malformed record: its records
    assert [s[0] for s in segs] == ["c", "c", "r"]
    assert segs[0][1] == "a" and len(segs[0][6]) == 9 * 8 and segs[1][1] == "p"
    assert segs[2][1] == [(k, v) for k, v in msgs[15:17]] + [(msgs[17][0], msgs[17][1][:8] + b"?")] + msgs[18:]


def test_a_chunk_with_records_in_flight_is_sent_as_columns_and_those_records() -> None:
    """Records in flight among a delayed queue's chunk leave the chunk in the columns: the
    segment carries those records alone (id, record), not the chunk's records (bodies
    and all) for the start to take one by one."""
    from doq.queues import machine as M
    others, msgs = _store([(0, 1, 0)] * 10, 2)
    worker = QueueMachine(MemoryStore())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", 5)
        segs = worker.segments_of(others, iter(msgs), 8)
    assert [s[0] for s in segs] == ["c"]
    in_flight = segs[0][12]
    assert len(in_flight) == 2 and len(segs[0][6]) == 10 * 8
    by_id = {int.from_bytes(k[-8:], "big"): v[8:] for k, v in msgs}
    assert all(by_id[i] == rec for i, rec in in_flight)
    whole = QueueMachine(MemoryStore())
    whole.load(others, iter(msgs), 8, ordered=True)
    parts = QueueMachine(MemoryStore())
    parts.load(others, iter(msgs), 8, ordered=True, stop=msgs[0][0], upper=lambda: segs)
    assert _state(parts) == _state(whole)


def test_absorb_refuses_segments_that_do_not_fit() -> None:
    """Columns of an unknown queue, of unequal lengths, groups of a queue that is not fair,
    or a record sent as in flight that is not are refused (the store then loads again in
    one go)."""
    from doq.queues import machine as M
    others, msgs = _store([(0, 1, 0)] * 4, 0)
    m = QueueMachine(MemoryStore())
    m.load(others)
    loader = M._Loader(m)  # noqa: SLF001
    loader.meta_seen = True
    good = ("c", "a", True, 0, 1, None, b"\x01" + bytes(7), bytes(8), b"\x01" + bytes(7), b"", b"", [], [], None)
    ranges = (0, [0], [bytes(8)], [b"\x02" + bytes(7)], [0], [2])  # the pair (0, 2)
    bad = [("c", "nope", *good[2:]), (*good[:7], bytes(16), *good[8:]),
           (*good[:11], [("g", bytes(8), bytes(8))], *good[12:]), (*good[:6], b"\x01", *good[7:]),
           (*good[:12], [(1, bytes(R.HDR_SIZE))], None),  # a record "in flight" that is not
           (*good[:13], (0, [0], [bytes(8)], [bytes(16)], [0], [2])),  # pair ranges of unequal columns
           (*good[:13], (0, [1, 0], [bytes(8)] * 2, [bytes(8)] * 2, [1, 0], [0, 0])),  # out of order
           (*good[:13], (1, [0], [b"\x05" + bytes(7)], [bytes(8)], [5], [0])),  # a largest pair outside its range
           (*good[:13], (0, [0], [bytes(8)], [bytes(8)])),  # the wrong shape
           ("c", "f", *good[2:13], ranges)]  # pair ranges of a fair queue
    for seg in bad:
        with pytest.raises(ValueError):
            loader.absorb([seg])
    loader.absorb([good])
    assert list(loader.per_q["a"].ready_i) == [1]
    loader.absorb([(*good[:6], b"\x02" + bytes(7), b"", b"", *good[9:13], ranges)])
    assert [p.columns() for p in loader.per_q["a"].ranges] == [(array("q", [0]), array("Q", [2]))]


@pytest.mark.parametrize("wide", [True, False])
def test_pairs_besides_the_ranges_are_joined_to_them_or_all_go_back_to_one_bulk_build(wide: bool) -> None:
    """The start's part of a queue in pair ranges, the worker's part sent as columns
    (its priorities ascend): joined on the ranges' grid, or, when they do not fit it (a
    span of priorities far wider than the grid's ranges), every pair back into one bulk
    build (the bounds of all found again): the state of a load in one go either way."""
    from doq.queues import machine as M
    from doq.queues import pairlist
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(NOW, [c.CreateQueue(qn, "fair" if qn == "f" else "delayed", QueueSettings())
                                    for qn in NAMES]))
    step = 2**40 if wide else 1
    ps = [(i * 7919) % 101 for i in range(60)] + [10**6 + i * step for i in range(60)]
    m.apply(2, c.CommandBatch(NOW, [c.Enqueue("a", [c.EnqueueItem(b"x", priority=p) for p in ps])]))
    msgs = sorted((k, b"v" * 8 + v) for k, v in store.data.items() if k[0] == K.MESSAGE)
    others = sorted((k, v) for k, v in store.data.items() if k[0] != K.MESSAGE)
    split = msgs[60][0]
    joined: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", 7)
        mp.setattr(M, "RANGES_MIN", 5)
        mp.setattr(pairlist, "LOAD", 1)  # bulk builds by ranges, not sorted whole
        mp.setattr(pairlist, "BUCKET_LOADS", 4)
        real = M.pair_ranges

        def watched(*a: Any) -> Any:
            got = real(*a)
            joined.append(got is not None)
            return got

        mp.setattr(M, "pair_ranges", watched)
        whole = QueueMachine(MemoryStore())
        whole.load(others, iter(msgs), 8, ordered=True)
        segs = QueueMachine(MemoryStore()).segments_of(others, iter(msgs[60:]), 8, split_records=120)
        assert segs[0][-1] is None  # ascending: sent as columns
        parts = QueueMachine(MemoryStore())
        # the start's part record by record (its priorities' bounds unknown, then those of
        # the worker's columns only): the bulk build must find the bounds of all again
        mp.setattr(M._Loader, "_feed_columns", lambda *a: False)  # noqa: SLF001
        parts.load(others, iter(msgs), 8, ordered=True, stop=split, upper=lambda: segs, split_records=120)
        parts.queues["a"].index.ready.check()  # type: ignore[attr-defined]
    assert joined == [True, not wide]  # the start's part; the worker's columns on its grid, or not
    assert _state(parts) == _state(whole)


def test_pairs_bunched_on_few_priorities_are_not_distributed_into_ranges() -> None:
    """A part whose pairs share a few priorities (a grid of shift 0 with ranges far past the
    unsorted chunks' cap) goes as columns to one bulk build; pairs spread over a wide span
    are distributed into ranges."""
    import random

    from doq.queues import machine, pairlist

    rnd = random.Random(7)
    n = 4 * pairlist.UNSORTED_LOADS * pairlist.LOAD * 10
    ids = array("Q", range(1, n + 1))
    bunched = array("q", [rnd.randrange(10) for _ in range(n)])
    assert machine._ranges_of(bunched, ids, None, 4 * n) is None
    spread = array("q", [rnd.randrange(10**9) for _ in range(n)])
    got = machine._ranges_of(spread, ids, None, 4 * n)
    assert got is not None and sum(map(len, got.as_)) == n
