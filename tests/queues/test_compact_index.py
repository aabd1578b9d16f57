"""The compact in-memory index of queued messages (doq.queues.pairlist, doq.queues.idset)
behaves as the plain structures it replaces (a sorted list of pairs, a set of ints), and
stays compact: a bound on the bytes a queued message costs that fails if the index went
back to an object per message."""

from __future__ import annotations

import random
import sys
import tracemalloc
from array import array
from bisect import insort
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.queues import commands as c
from doq.queues import pairlist
from doq.queues import records as R
from doq.queues.idset import PAGE_BITS, IdSet
from doq.queues.machine import QueueMachine
from doq.queues.model import MessageState, QueueSettings
from doq.queues.pairlist import PairList, sorted_pairs
from doq.queues.store import MemoryStore

I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
SMALL_A = st.integers(-3, 3) | I64
SMALL_B = st.integers(0, 40) | U64

op = st.one_of(
    st.tuples(st.just("add"), SMALL_A, SMALL_B),
    st.tuples(st.just("remove"), SMALL_A, SMALL_B),
    st.tuples(st.just("remove_present"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("pop_front"), st.integers(0, 30), st.just(0)),
    st.tuples(st.just("pop_through"), SMALL_A, st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 40), st.integers(0, 3)),
    st.tuples(st.just("add_many"), st.lists(st.tuples(SMALL_A, SMALL_B), max_size=20), st.just(0)),
    st.tuples(st.just("read"), st.just(0), st.just(0)),
    st.tuples(st.just("pop_first"), st.just(0), st.just(0)),
)


def _held(pl: PairList) -> list[tuple[int, int]]:
    """The pairs a PairList holds, sorted here: reading them does not sort its chunks."""
    return sorted(p for ca, cb in zip(pl._as, pl._bs, strict=True) for p in zip(ca, cb, strict=True))  # noqa: SLF001


@settings(max_examples=150, deadline=None)
@example([("add", a, b) for a in (-3, -2, -1, 1, 2, 3) for b in (1, 2)]  # chunks of 2 at load 1
         + [("add", -2, 0), ("add", 1, 0), ("pop_through", -2, 0), ("pop_through", 2, 0), ("read", 0, 0)], 1)
@example([("add", 10, 0), ("add_many", [(5, 1), (1, 1), (3, 1), (2, 1), (4, 1)], 0), ("pop_through", 3, 0),
          ("add_many", [(9, 1), (0, 1), (-1, 1)], 0), ("pop_first", 0, 0)],
         1)  # an unsorted chunk sorted and cut by a read: its first piece is read too
@given(st.lists(op, max_size=80), st.sampled_from([1, 2, 3, 1024]))
def test_pairlist_is_a_sorted_list_of_pairs(ops: list[tuple[str, Any, int]], load: int) -> None:
    old = pairlist.LOAD
    pairlist.LOAD = load  # small chunks: splits and chunk removals on every few operations
    try:
        pl = PairList()
        ref: list[tuple[int, int]] = []
        for name, x, y in ops:
            if name == "add" and (x, y) not in ref:
                pl.add(x, y)
                insort(ref, (x, y))
            elif name == "add_many":
                batch = list(dict.fromkeys(p for p in x if p not in ref))  # type: ignore[attr-defined]
                pl.add_many([a for a, _ in batch], [b for _, b in batch])
                ref = sorted(ref + batch)
            elif name == "remove":
                if (x, y) in ref:
                    pl.remove(x, y)
                    ref.remove((x, y))
                else:
                    with pytest.raises(ValueError):
                        pl.remove(x, y)
            elif name == "remove_present" and ref:
                pair = ref.pop(x % len(ref))
                pl.remove(*pair)
            elif name == "pop_front":
                got = pl.pop_front(x)
                want, ref = ref[:x], ref[x:]
                assert list(zip(*got, strict=True)) == want
            elif name == "pop_first" and ref:
                assert pl.pop_first() == ref.pop(0)
            elif name == "pop_through":
                got = pl.pop_through(x)
                want = [p for p in ref if p[0] <= x]
                ref = ref[len(want):]
                assert list(zip(*got, strict=True)) == want
            elif name == "append":
                base = ref[-1] if ref else (0, 0)
                new = [(base[0] + y, base[1] + 1 + i) if y else (base[0], base[1] + 1 + i) for i in range(x)]
                new = sorted(p for p in new if p > base and -(2**63) <= p[0] < 2**63 and p[1] < 2**64)
                more = PairList.from_sorted([a for a, _ in ref + new], [b for _, b in ref + new])
                more.check()
                assert list(more) == ref + new
            elif name == "read":  # reads that sort what they look at (unsorted chunks stay so until then)
                assert list(pl) == ref
                if ref:
                    assert pl.islice(1, 4) == ref[1:4]
                    assert (ref[0] in pl) and ((ref[0][0], ref[0][1] ^ 1) in pl) == ((ref[0][0], ref[0][1] ^ 1) in ref)
            pl.check()
            assert _held(pl) == ref and len(pl) == len(ref)
            if ref:
                assert pl.first() == ref[0] and pl.last() == ref[-1]
    finally:
        pairlist.LOAD = old


# a batch of `add_many`: priorities with many ties (a few values), the edges of the range,
# anywhere; ids small (ties with the list's) or anywhere; shifted below or above what the
# list holds by the test (`shift`)
batch_st = st.tuples(
    st.lists(st.tuples(st.integers(-3, 3) | st.integers(-1000, 1000) | I64, st.integers(0, 60) | U64), max_size=70),
    st.sampled_from(["as is", "below", "above"]))


def _shifted(pairs: list[tuple[int, int]], shift: str, ref: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The batch placed as `shift` says against `ref`, in the given order, without pairs
    already in `ref` or repeated in the batch, all within a PairList's range."""
    if shift == "below" and ref:
        pairs = [(max(-(2**63), ref[0][0] - 1 - abs(a) % 5), b) for a, b in pairs]
    elif shift == "above" and ref:
        pairs = [(min(2**63 - 1, ref[-1][0] + 1 + abs(a) % 5), b) for a, b in pairs]
    held = set(ref)
    out = []
    for p in pairs:
        if p not in held:
            held.add(p)
            out.append(p)
    return out


@settings(max_examples=300, deadline=None)
@example([([(0, i) for i in range(40)], "as is"), ([(0, i) for i in range(40, 80)], "as is"),
          ([(1, 5), (-1, 5), (0, 100)], "as is")], 3, 0)  # ties on a, across chunks, both ends
@example([([(5, 1), (3, 2)], "as is"), ([(9, 9), (7, 7), (8, 8)], "above"), ([], "below"),
          ([(2, 2), (1, 1)], "below")], 1, 1)  # unsorted batches after the last pair / before the first
@given(st.lists(batch_st, max_size=12), st.sampled_from([1, 2, 3, 8, 1024]), st.integers(0, 4))
def test_add_many_is_an_add_per_pair(batches: list[tuple[list[tuple[int, int]], str]], load: int,
                                     reads: int) -> None:
    """`add_many` of batches in any order (ties of a, repeated priorities, empty, spanning
    many chunks, wholly below or above the pairs held) leaves exactly the list that one
    `add` per pair leaves, whether or not the list is read between batches (a read sorts
    the chunks it touches; the others stay unsorted); the invariants hold after each batch."""
    old = pairlist.LOAD
    pairlist.LOAD = load
    try:
        bulk, one = PairList(), PairList()
        ref: list[tuple[int, int]] = []
        for k, (raw, shift) in enumerate(batches):
            pairs = _shifted(raw, shift, ref)
            bulk.add_many([a for a, _ in pairs], [b for _, b in pairs])
            for a, b in pairs:
                one.add(a, b)
            ref = sorted(ref + pairs)
            bulk.check()
            assert len(bulk) == len(ref)
            if ref:
                assert bulk.last() == ref[-1]
            if reads and k % reads == 0 and ref:  # reads that sort some chunks, and change the list
                assert bulk.first() == ref[0] and bulk.islice(len(ref) // 2, len(ref) // 2 + 2) == ref[len(ref) // 2:][:2]
                mid = ref[len(ref) // 3]
                assert mid in bulk
                bulk.remove(*mid)
                one.remove(*mid)
                ref.remove(mid)
                got = bulk.pop_front(reads)
                assert list(zip(*got, strict=True)) == ref[:reads]
                one.pop_front(reads)
                ref = ref[reads:]
                bulk.check()
        assert list(bulk) == list(one) == ref
        bulk.check()
        assert all(not u for u in bulk._unsorted)  # noqa: SLF001 (iterating sorted every chunk)
    finally:
        pairlist.LOAD = old


# pairs of a bulk load: a's with ties, bunched (a few values), spread, at both edges of int64
load_a = st.integers(-3, 3) | st.integers(0, 1000) | st.sampled_from([-(2**63), 2**63 - 1, 2**62, -1]) | I64


@settings(max_examples=300, deadline=None)
@example([(a, b) for a in (-(2**63), 2**63 - 1) for b in range(20)], 1, 2, 0, 0)  # the full span, a range per end
@example([(0, b) for b in range(50)] + [(1, 0)], 1, 2, 0, 1)  # one range past the cap: sorted in place
@given(st.lists(st.tuples(load_a, SMALL_B), max_size=150), st.sampled_from([1, 2, 3, 256]),
       st.integers(1, 4), st.integers(0, 10**6), st.integers(0, 4))
def test_from_unsorted_is_the_sorted_list(pairs: list[tuple[int, int]], load: int, unsorted_loads: int,
                                          seed: int, reads: int) -> None:
    """`PairList.from_unsorted` of pairs in any order is the list `from_sorted` of the sorted
    pairs makes: the same pairs in the same order, first and last, invariants (each chunk's
    pairs above the previous chunk's largest, its largest pair exact) before any read, and
    the same list after reads, removals, bulk adds and pops (which sort the chunks they
    touch). Small LOADs make many ranges, ranges past the cap (sorted at once) and lists
    small enough to be sorted whole."""
    old = pairlist.LOAD, pairlist.UNSORTED_LOADS
    pairlist.LOAD, pairlist.UNSORTED_LOADS = load, unsorted_loads
    try:
        pairs = list(dict.fromkeys(pairs))
        random.Random(seed).shuffle(pairs)
        ref = sorted(pairs)
        pl = PairList.from_unsorted(array("q", [a for a, _ in pairs]), array("Q", [b for _, b in pairs]))
        pl.check()
        assert _held(pl) == ref and len(pl) == len(ref)
        if ref:
            assert pl.first() == ref[0] and pl.last() == ref[-1]
        rnd = random.Random(seed + 1)
        for _ in range(reads):  # reads and changes on the unsorted chunks
            if not ref:
                break
            mid = ref[rnd.randrange(len(ref))]
            assert mid in pl
            pl.remove(*mid)
            ref.remove(mid)
            more = [p for p in {(rnd.randrange(-5, 5), rnd.randrange(50)) for _ in range(5)} if p not in set(ref)]
            pl.add_many([a for a, _ in more], [b for _, b in more])
            ref = sorted(ref + more)
            got = pl.pop_front(2)
            assert list(zip(*got, strict=True)) == ref[:2]
            ref = ref[2:]
            pl.check()
            assert _held(pl) == ref
        assert list(pl) == ref
        pl.check()
    finally:
        pairlist.LOAD, pairlist.UNSORTED_LOADS = old


@settings(max_examples=300, deadline=None)
@example([(a, b) for a in range(-3, 4) for b in range(30)], 0, 1, 2, 0)  # the split inside a range past the cap
@example([(a, b) for a in (-(2**63), 2**63 - 1) for b in range(20)], 2**63 - 1, 1, 2, 0)
@given(st.lists(st.tuples(load_a, SMALL_B), max_size=150), load_a, st.sampled_from([1, 2, 3, 256]),
       st.integers(1, 4), st.integers(0, 10**6))
def test_split_unsorted_is_the_sorted_list_cut_at_a(pairs: list[tuple[int, int]], split_a: int, load: int,
                                                    unsorted_loads: int, seed: int) -> None:
    """`PairList.split_unsorted` of pairs in any order is the sorted pairs cut after the
    last whose a is <= split_a, as two lists that keep the invariants and read, pop and
    take adds as lists do; with exact bounds or wider ones given."""
    old = pairlist.LOAD, pairlist.UNSORTED_LOADS
    pairlist.LOAD, pairlist.UNSORTED_LOADS = load, unsorted_loads
    try:
        pairs = list(dict.fromkeys(pairs))
        random.Random(seed).shuffle(pairs)
        ref = sorted(pairs)
        k = sum(1 for a, _ in ref if a <= split_a)
        a_col, b_col = array("q", [a for a, _ in pairs]), array("Q", [b for _, b in pairs])
        bounds = [(None, None)]
        if pairs:
            bounds.append(((min(a_col) - (seed % 3), max(a_col)), (0, max(b_col) + seed % 5)))
        for a_bounds, b_bounds in bounds:
            if a_bounds is not None and a_bounds[0] < -(2**63):
                continue
            low, high = PairList.split_unsorted(a_col, b_col, split_a, a_bounds, b_bounds)
            low.check()
            high.check()
            assert _held(low) == ref[:k] and _held(high) == ref[k:]
            assert len(low) == k and len(high) == len(ref) - k
            assert list(high) == ref[k:] and list(low) == ref[:k]
            assert high.pop_front(2) == tuple(map(list, zip(*ref[k : k + 2], strict=True))) or len(ref) == k
    finally:
        pairlist.LOAD, pairlist.UNSORTED_LOADS = old


@settings(max_examples=300, deadline=None)
@example([(a, b) for a in (-(2**63), 2**63 - 1) for b in range(20)], [7], [None], 2**63 - 1, 1, 2, 0)
@example([(a, b) for a in range(-3, 4) for b in range(30)], [100], [0, 1], 0, 1, 2, 0)  # the split in a range past the cap
@given(st.lists(st.tuples(load_a, SMALL_B), max_size=150), st.lists(st.integers(0, 150), max_size=2),
       st.lists(st.none() | st.integers(0, 70), min_size=3, max_size=3), st.none() | load_a,
       st.sampled_from([1, 2, 3, 256]), st.integers(1, 4), st.integers(0, 10**6))
def test_pair_ranges_made_apart_and_joined_are_the_sorted_list(pairs: list[tuple[int, int]], cuts: list[int],
                                                               shifts: list[int | None], split_a: int | None,
                                                               load: int, unsorted_loads: int, seed: int) -> None:
    """Pairs cut into parts, each distributed into pair ranges on its own grid (a shift
    from its own span and count, or any), some through their wire form, joined by
    `PairList.from_ranges`: the sorted pairs (cut after the last whose a is <= split_a), as
    lists that keep the invariants, with their first and last pairs, and that pop in order.
    A grid a part does not fit (keys past 64 bits, far too many ranges) is refused (None)."""
    old = pairlist.LOAD, pairlist.UNSORTED_LOADS
    pairlist.LOAD, pairlist.UNSORTED_LOADS = load, unsorted_loads
    try:
        pairs = list(dict.fromkeys(pairs))
        rnd = random.Random(seed)
        rnd.shuffle(pairs)
        ref = sorted(pairs)
        bounds = sorted({0, len(pairs), *(min(k, len(pairs)) for k in cuts)})
        parts = []
        for (x, y), shift in zip(pairwise(bounds), shifts, strict=False):
            a_col = array("q", [a for a, _ in pairs[x:y]])
            b_col = array("Q", [b for _, b in pairs[x:y]])
            if shift is None:
                shift = pairlist.range_shift(max(a_col) - min(a_col) if a_col else 0, len(a_col), 4)
            got = pairlist.pair_ranges(a_col, b_col, shift)
            if got is None:
                a_span = max(a_col) - ((min(a_col) >> shift) << shift)
                assert (a_span.bit_length() + (max(b_col) - min(b_col)).bit_length() > 64
                        or (a_span >> shift) + 1 > 2 * len(a_col) + pairlist.RANGES_SLACK)
                return
            assert sorted(zip(*got.columns(), strict=True)) == sorted(pairs[x:y]) and len(got) == y - x
            parts.append(pairlist.PairRanges.from_wire(got.to_wire()) if rnd.random() < 0.5 else got)
        low, high = PairList.from_ranges(parts, split_a)
        low.check()
        high.check()
        k = len(ref) if split_a is None else sum(1 for a, _ in ref if a <= split_a)
        assert _held(low) == ref[:k] and _held(high) == ref[k:]
        for pl, want in ((low, ref[:k]), (high, ref[k:])):
            if want:
                assert pl.first() == want[0] and pl.last() == want[-1]
            assert list(zip(*pl.pop_front(3), strict=True)) == want[:3]
            pl.check()
            assert list(pl) == want[3:]
    finally:
        pairlist.LOAD, pairlist.UNSORTED_LOADS = old


def test_pair_ranges_from_wire_refuses_what_to_wire_does_not_make() -> None:
    """`PairRanges.from_wire` takes back `to_wire`'s value and refuses anything else."""
    got = pairlist.pair_ranges(array("q", [5, -9, 300]), array("Q", [1, 2, 3]), 4)
    assert got is not None
    back = pairlist.PairRanges.from_wire(got.to_wire())
    assert (back.shift, back.rs, back.tops) == (4, [-1, 0, 18], [(-9, 2), (5, 1), (300, 3)])
    for bad in [None, (4, [0]), (200, *got.to_wire()[1:]), (4, [0, -1, 18], *got.to_wire()[2:]),
                (4, got.rs, [b"", *got.to_wire()[2][1:]], *got.to_wire()[3:]),
                (4, got.rs, got.to_wire()[2], [bytes(16), *got.to_wire()[3][1:]], *got.to_wire()[4:]),
                (4, got.rs, *got.to_wire()[2:4], [-9, 5, 3000], got.to_wire()[5]),
                (4, got.rs, [b"x", *got.to_wire()[2][1:]], *got.to_wire()[3:]),
                (4, got.rs, *got.to_wire()[2:5], [2, "1", 3]),  # a largest id not an int
                (4, got.rs, *got.to_wire()[2:5], [2, -1, 3]),
                (4, got.rs, *got.to_wire()[2:5], [2, 1, 2**64]),
                (0, [2**63], [bytes(8)], [bytes(8)], [2**63], [1])]:  # a largest a past int64
        with pytest.raises(ValueError):
            pairlist.PairRanges.from_wire(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**40), 2**40) | st.integers(0, 2**50) | st.integers(-3, 3), SMALL_B),
                max_size=120), st.sampled_from([1, 2, 1000, 2**12]), st.sampled_from([1, 2, 256]), st.booleans())
def test_scale_a_multiplies_every_a_and_keeps_the_order(pairs: list[tuple[int, int]], factor: int, load: int,
                                                       unsorted: bool) -> None:
    """`scale_a(f)` leaves the list of (a * f, b), in order, for sorted and unsorted chunks
    (word arithmetic for chunks of a's >= 0, per item otherwise); a product out of the
    int64 range raises ValueError and changes nothing."""
    old = pairlist.LOAD, pairlist.UNSORTED_LOADS
    pairlist.LOAD, pairlist.UNSORTED_LOADS = load, 2
    try:
        pairs = list(dict.fromkeys(pairs))
        random.Random(len(pairs)).shuffle(pairs)
        a_col, b_col = array("q", [a for a, _ in pairs]), array("Q", [b for _, b in pairs])
        pl = PairList.from_unsorted(a_col, b_col) if unsorted else PairList.from_sorted(*sorted_pairs(a_col, b_col))
        pl.scale_a(factor)
        pl.check()
        assert list(pl) == sorted((a * factor, b) for a, b in pairs)
        if any(a for a, _ in pairs):
            before = list(pl)
            with pytest.raises(ValueError):
                pl.scale_a(2**63 + 1)
            assert list(pl) == before
    finally:
        pairlist.LOAD, pairlist.UNSORTED_LOADS = old


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(load_a, SMALL_B), max_size=150), st.integers(0, 150), st.booleans(),
       st.sampled_from([1, 2, 256]))
def test_merged_unsorted_is_the_sorted_union(pairs: list[tuple[int, int]], k: int, unsorted: bool,
                                             load: int) -> None:
    """`merged_unsorted(a, b)` is a new list of the list's pairs and `zip(a, b)`'s, sorted,
    keeping the invariants; the list itself is left as it was."""
    old = pairlist.LOAD, pairlist.UNSORTED_LOADS
    pairlist.LOAD, pairlist.UNSORTED_LOADS = load, 2
    try:
        pairs = list(dict.fromkeys(pairs))
        random.Random(k).shuffle(pairs)
        mine, theirs = pairs[:k], pairs[k:]
        a_col, b_col = array("q", [a for a, _ in mine]), array("Q", [b for _, b in mine])
        pl = PairList.from_unsorted(a_col, b_col) if unsorted else PairList.from_sorted(*sorted_pairs(a_col, b_col))
        both = pl.merged_unsorted(array("q", [a for a, _ in theirs]), array("Q", [b for _, b in theirs]))
        both.check()
        assert list(both) == sorted(pairs) and len(both) == len(pairs)
        assert list(pl) == sorted(mine)
    finally:
        pairlist.LOAD, pairlist.UNSORTED_LOADS = old


def test_a_rebuild_joins_many_delayed_records_to_late_timestamp_pairs_in_one_bulk_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A timestamp queue's rebuild with late timestamp pairs and more than
    `MERGE_BY_ADD_MAX` delayed records (not-before delays, due close together and after
    the late pairs) builds its delayed list in one bulk build, not by `add_many`, which
    piles such records into a few chunks and sorts them pair by pair (boot12's review:
    600k + 600k took 4.2 s against 0.86 s); the queue is the one loaded record by record.
    Fails if the join goes through `add_many` whatever its size."""
    from doq.queues import machine as M
    monkeypatch.setattr(M, "MERGE_BY_ADD_MAX", 100)
    now = 1_800_000_000_000
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("d", "delayed", QueueSettings())]))
    base = now // 1000 + 1000  # late timestamp priorities (seconds)
    m.apply(2, c.CommandBatch(now, [c.Enqueue("d", [c.EnqueueItem(b"x", priority=base + i) for i in range(3000)])]))
    m.apply(3, c.CommandBatch(now, [c.Enqueue("d", [c.EnqueueItem(b"x", delay_ms=10**7 + (i * 7919) % 1000)
                                                    for i in range(500)])]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
    adds: list[int] = []
    real_add_many = PairList.add_many

    def add_many(self: PairList, a: Any, b: Any) -> None:
        adds.append(len(a))
        real_add_many(self, a, b)

    monkeypatch.setattr(PairList, "add_many", add_many)
    columns = QueueMachine(MemoryStore())
    columns.load(others, [(k, b"v" * 8 + v) for k, v in msgs], 8, {})
    assert adds == []
    one_by_one = QueueMachine(MemoryStore())
    one_by_one.load(others + msgs)
    assert _seen(columns, ("d",)) == _seen(one_by_one, ("d",))
    assert len(columns.queues["d"].delayed) == 3500


def test_from_unsorted_leaves_evenly_spread_pairs_unsorted_in_ranges() -> None:
    """Random priorities (as a rebuild of a delayed queue reads them, in id order) are not
    sorted by the load: they lie in unsorted chunks of at most the cap, each sorted when
    first read; a's all equal are sorted at once (one range past the cap)."""
    rnd = random.Random(3)
    n = 100_000
    ps = array("q", [rnd.randrange(1_000_000_000) for _ in range(n)])
    pl = PairList.from_unsorted(ps, array("Q", range(1, n + 1)))
    pl.check()
    assert all(pl._unsorted) and len(pl._as) >= n // (pairlist.BUCKET_LOADS * pairlist.LOAD)  # noqa: SLF001
    assert max(map(len, pl._as)) <= pairlist.UNSORTED_LOADS * pairlist.LOAD  # noqa: SLF001
    assert pl.pop_front(3) == tuple(map(list, zip(*sorted(zip(ps, range(1, n + 1), strict=True))[:3], strict=True)))
    flat = PairList.from_unsorted(array("q", [7] * n), array("Q", rnd.sample(range(10 * n), n)))
    flat.check()
    assert not any(flat._unsorted)  # noqa: SLF001


ids_st = st.integers(0, 5) | st.integers(0, 3 << PAGE_BITS) | st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@example([("range", 0, 5000), ("discard", 100, 0), ("add", 100, 0), ("add", 5001, 0)])  # a bitmap page
@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "range", "many"]), ids_st,
                          st.integers(0, 6000)), max_size=40))
def test_idset_is_a_set(ops: list[tuple[str, int, int]]) -> None:
    s = IdSet()
    ref: set[int] = set()
    for name, x, n in ops:
        if name == "add":
            s.add(x)
            ref.add(x)
        elif name == "discard":
            s.discard(x)
            ref.discard(x)
        elif name == "range":  # a dense run: bitmap pages, and back to arrays when thinned
            n = min(n, 2**64 - x)
            s.add_range(x, n)
            ref.update(range(x, x + n))
        else:
            drop = sorted(ref)[:: max(1, n % 7)]
            s.discard_many(drop)
            ref.difference_update(drop)
        assert len(s) == len(ref)
        assert s.first() == (min(ref) if ref else None)  # the oldest message of a queue
        for probe in (x, x + 1, x - 1, x + n, -1, "x"):
            assert (probe in s) == (probe in ref)
    assert list(s) == sorted(ref)
    s.update_sorted(sorted(ref | {7, 1 << 40}))
    assert list(s) == sorted(ref | {7, 1 << 40})


def _queue_bytes(kind: str, n: int) -> tuple[int, int]:
    """Bytes traced by the machine's in-memory state while `n` messages are queued in one
    queue (MemoryStore's records left out), and the count."""
    store = MemoryStore()
    m = QueueMachine(store)
    now = 1_800_000_000_000
    fair = kind.startswith("fair")
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("q", "fair" if fair else "delayed", QueueSettings())]))
    prios = {"plain": [0] * n, "fair-blocks": [0] * n,
             "random": [(i * 2654435761) % 1_000_000_000 for i in range(n)],
             "timestamps": [1_800_000_000 + (i * 7919) % 3600 - 1800 for i in range(n)]}[kind]
    names = [f"group-{g}" for g in range(n // 100)]  # fair: 100 messages a group, filled as blocks
    groups = [names[i // 100] for i in range(n)] if fair else []
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store_before = sys.getsizeof(store.data)
    for i in range(0, n, 1000):
        m.apply(2 + i, c.CommandBatch(now, [c.EnqueueColumns("q", [b"x"] * 1000, priorities=prios[i : i + 1000],
                                                                       groups=groups[i : i + 1000])]))
    traced = tracemalloc.get_traced_memory()[0] - before
    # what the store itself holds (dict + keys + records) is not the machine's
    held = sys.getsizeof(store.data) - store_before + sum(sys.getsizeof(k) + sys.getsizeof(v)
                                                          for k, v in store.data.items())
    tracemalloc.stop()
    return traced - held, n


@pytest.mark.parametrize("kind", ["plain", "random", "timestamps"])
def test_a_queued_message_costs_few_bytes_of_index(kind: str) -> None:
    """Deterministic (tracemalloc, no clock): the machine's state grows by < 40 bytes per
    queued message of a delayed queue (an object, dict slot and int per message, as
    before the compact index, cost > 200)."""
    traced, n = _queue_bytes(kind, 50_000)
    assert traced / n < 40, traced / n


def test_a_queued_message_of_a_fair_queue_costs_few_bytes_of_index() -> None:
    """Deterministic (tracemalloc): a fair queue of 100-message groups grows by < 30 bytes
    per queued message (its groups' ready pairs packed, ~16 bytes, and each group's
    objects shared by 100 messages); with a sorted list of int keys per group it cost ~70."""
    traced, n = _queue_bytes("fair-blocks", 50_000)
    assert traced / n < 30, traced / n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(ids_st, st.integers(1, 70_000)), max_size=4), st.integers(1, 9))
def test_idset_load_sorted(runs: list[tuple[int, int]], step: int) -> None:
    """Bulk loading (dense runs as filled bitmaps, thinned runs, sparse ids) = adding."""
    ref = sorted({x for first, n in runs for x in range(first, min(first + n, 2**64), step if n % 2 else 1)})
    s = IdSet()
    s.load_sorted(ref)
    assert list(s) == ref and len(s) == len(ref)
    assert s.first() == (ref[0] if ref else None)
    members = set(ref)
    for x in ref[:50] + [r + 1 for r in ref[-50:]]:
        assert (x in s) == (x in members)
    s.discard_many(ref[::2])
    assert list(s) == ref[1::2]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3) | I64, st.integers(0, 40) | U64), unique_by=lambda t: t[1], max_size=60),
       st.randoms(use_true_random=False))
def test_sorted_pairs_sorts_pairs_in_any_order(pairs: list[tuple[int, int]], rnd: object) -> None:
    """`sorted_pairs` is `sorted(pairs)` as two arrays, whatever the input order, on both of
    its paths (packed keys within 53 bits sorted as floats, wider ones as ints)."""
    want = sorted(pairs)
    shuffled = list(pairs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    for order in (pairs, shuffled, want):
        a, b = sorted_pairs([x for x, _ in order], [y for _, y in order])
        assert (a.typecode, b.typecode) == ("q", "Q")
        assert list(zip(a, b, strict=True)) == want


def test_sorted_pairs_float_path_is_exact_at_its_edge() -> None:
    """Keys of exactly 62 bits (the float path: sorted as float bit patterns) and of 63
    (the int path) come out exact: a pair that differs from its neighbour in the lowest
    bit keeps its place, for a's of either sign."""
    for a_bits in (39, 40):  # with b spanning 23 bits: 62 and 63 bits
        top = (1 << a_bits) - 1
        bs = [(1 << 23) - 1, 0, (1 << 23) - 2, 1, 5, 4]
        for base in (0, -(1 << 62), 1 << 20, -(2**63)):
            as_ = [base + top, base + top, base, base, base + 1, base + 1]
            a, b = sorted_pairs(as_, bs)
            assert list(zip(a, b, strict=True)) == sorted(zip(as_, bs, strict=True))


def test_sorted_pairs_of_many_runs_with_ties_and_timestamps() -> None:
    """Tens of thousands of pairs (several of `_RUN`-float runs merged) with many equal
    priorities, equal timestamps (ms), negative priorities and scattered ids come out as
    `sorted()` puts them."""
    rnd = random.Random(20)
    n = 3 * pairlist._RUN + 123  # noqa: SLF001
    ids = rnd.sample(range(1, 40 * n), n)
    for ps in ([rnd.randrange(-50, 50) for _ in range(n)],
               [1_800_000_000_000 + 1000 * rnd.randrange(300) for _ in range(n)],
               [rnd.randrange(1_000_000_000) for _ in range(n)]):
        a, b = sorted_pairs(array("q", ps), array("Q", ids))
        assert list(zip(a, b, strict=True)) == sorted(zip(ps, ids, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2) | st.integers(0, 999_999_999) | I64, st.integers(0, 2**23) | U64),
                unique_by=lambda t: t[1], max_size=200),
       st.sampled_from([1, 2, 3, 7, 64]), st.randoms(use_true_random=False))
def test_sorted_pairs_by_sorted_runs_is_sorted(pairs: list[tuple[int, int]], run: int, rnd: object) -> None:
    """The float path sorts runs apart, then merges them: whatever the run length, the
    result is `sorted(pairs)` (ties on a broken by b, equal a's of both signs)."""
    shuffled = list(pairs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pairlist, "_RUN", run)
        a, b = sorted_pairs([x for x, _ in shuffled], [y for _, y in shuffled])
    assert list(zip(a, b, strict=True)) == sorted(pairs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3) | st.integers(1_799_999_990, 1_800_000_010)
                          | st.sampled_from([-(2**63), 2**62, 2**63 - 1]), st.integers(0, 3),
                          st.sampled_from(["", "g1", "g2"])), min_size=1, max_size=60),
       st.integers(0, 20), st.randoms(use_true_random=False))
def test_rebuild_from_records_in_any_order(items: list[tuple[int, int, str]], take: int, rnd: object) -> None:
    """A machine rebuilt from its records, in key order or shuffled, holds the same
    messages in the same places (ready order, delayed order, in flight) and goes on the same."""
    now = 1_800_000_000_000
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("d", "delayed", QueueSettings()),
                                    c.CreateQueue("f", "fair", QueueSettings())]))
    for qn in ("d", "f"):
        m.apply(2, c.CommandBatch(now, [c.Enqueue(qn, [c.EnqueueItem(b"x", group=g, priority=p, delay_ms=d * 1000)
                                                       for p, d, g in items])]))
        m.apply(3, c.CommandBatch(now, [c.Dequeue(qn, max(1, take), seed=7)] if take else []))
    records = list(store.items())
    rnd.shuffle(records)  # type: ignore[attr-defined]

    def seen(x: QueueMachine) -> list[object]:
        from doq.queues.model import MessageState as S
        return [(x.queue_info(qn).stats, [x.peek_ids(qn, s, 0, 1000) for s in (S.READY, S.DELAYED, S.IN_FLIGHT)])
                for qn in ("d", "f")] + [x.next_due_ms()]

    for recs in (list(store.items()), records):
        fresh = QueueMachine(MemoryStore())
        fresh.store.data = dict(store.data)  # type: ignore[attr-defined]
        fresh.load(recs)
        assert seen(fresh) == seen(m)
    for later in (now + 2_000, now + 12_000_000):  # delays end, leases expire
        for x in (m, fresh):
            x.apply(4, c.CommandBatch(later, [c.Dequeue("d", 1000, seed=1), c.Dequeue("f", 1000, seed=1)]))
        assert seen(fresh) == seen(m)


def _seen(x: QueueMachine, names: tuple[str, ...]) -> list[object]:
    from doq.queues.model import MessageState as S
    return [(x.queue_info(qn).stats, [x.peek_ids(qn, s, 0, 10_000) for s in (S.READY, S.DELAYED, S.IN_FLIGHT)])
            for qn in names] + [x.next_due_ms(), list(x.leases)]


@settings(max_examples=60, deadline=None)
@example([(p, 0, "f") for p in (0, 0, 1, 1, 0, 0, 1)], 0, 40, set(), set(), 4096)  # g0 g1 g0 g1: runs interleave
@given(st.lists(st.tuples(st.integers(-3, 3) | st.integers(1_799_999_990, 1_800_000_010)
                          | st.sampled_from([-(2**63), 2**62]), st.integers(0, 3),
                          st.sampled_from(["a", "b", "f"])), min_size=1, max_size=80),
       st.integers(0, 30), st.integers(1, 40), st.sets(st.integers(0, 200), max_size=30),
       st.sets(st.integers(0, 200), max_size=10), st.sampled_from([0, 4096]))
def test_rebuild_from_columns_equals_record_by_record(
        items: list[tuple[int, int, str]], take: int, chunk: int,
        drop: set[int], swap: set[int], merge_by_add_max: int) -> None:
    """The store's fast rebuild (message records fed in chunks, taken as columns where a
    chunk qualifies, with a map of overridden records: left out, or another value) builds
    the same state as feeding each record (with the overrides applied) one by one: over
    delayed and fair queues, chunks that straddle queues, in-flight, delayed and
    timestamp-priority records, a fair queue's groups in runs that interleave within a
    chunk (a group's second run adds to its first), whatever the chunk size; delayed
    records joined to late timestamp pairs by `add_many` or by one bulk build
    (`MERGE_BY_ADD_MAX`)."""
    from doq.queues import machine as M
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", chunk)
        mp.setattr(M, "MERGE_BY_ADD_MAX", merge_by_add_max)
        _columns_vs_rows(items, take, drop, swap)


def _columns_vs_rows(items: list[tuple[int, int, str]], take: int, drop: set[int], swap: set[int]) -> None:
    now = 1_800_000_000_000
    store = MemoryStore()
    m = QueueMachine(store)
    names = ("a", "b", "f")
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("a", "delayed", QueueSettings()),
                                    c.CreateQueue("b", "delayed", QueueSettings()),
                                    c.CreateQueue("f", "fair", QueueSettings())]))
    for qn in names:
        m.apply(2, c.CommandBatch(now, [c.Enqueue(qn, [c.EnqueueItem(b"x", group=f"g{p % 2}" if q == "f" else "",
                                                                       priority=p, delay_ms=d * 1000)
                                                        for p, d, q in items if q == qn])]))
        if take:
            m.apply(3, c.CommandBatch(now, [c.Dequeue(qn, take, seed=7)]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
    # overrides: some records left out, some replaced by another message's record
    overrides: dict[bytes, bytes | None] = {msgs[i % len(msgs)][0]: None for i in drop}
    for i in swap:  # another record of the same queue (e.g. in flight for a ready one)
        k, other = msgs[i % len(msgs)][0], msgs[(i + 1) % len(msgs)]
        if other[0][:-8] == k[:-8]:
            overrides[k] = b"v" * 8 + other[1]
    applied = sorted([(k, v) for k, v in msgs if k not in overrides]
                     + [(k, v[8:]) for k, v in overrides.items() if v is not None])
    one_by_one = QueueMachine(MemoryStore())
    one_by_one.load(others + applied)
    columns = QueueMachine(MemoryStore())
    columns.load(others, [(k, b"v" * 8 + v) for k, v in msgs], 8, overrides)
    shuffled = [(k, b"v" * 8 + v) for k, v in msgs]
    random.Random(len(items) + take).shuffle(shuffled)  # chunks out of key order: the same
    out_of_order = QueueMachine(MemoryStore())
    out_of_order.load(others, shuffled, 8, overrides)
    assert _seen(out_of_order, names) == _seen(one_by_one, names)
    for x in (one_by_one, columns):
        x.store.data = dict(others + applied)  # type: ignore[attr-defined]
    assert _seen(columns, names) == _seen(one_by_one, names)
    for later in (now + 2_000, now + 12_000_000):  # delays end, leases expire
        for x in (one_by_one, columns):
            x.apply(4, c.CommandBatch(later, [c.Dequeue(qn, 1000, seed=1) for qn in names]))
        assert _seen(columns, names) == _seen(one_by_one, names)


def test_a_chunk_of_ready_records_is_taken_as_columns() -> None:
    """A chunk of one delayed queue's ready records (with records left out by the
    overrides) is indexed as columns, and holds what the records say."""
    from doq.queues import machine as M
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(1000, [c.CreateQueue("d", "delayed", QueueSettings())]))
    m.apply(2, c.CommandBatch(1000, [c.Enqueue("d", [c.EnqueueItem(b"x", priority=(7 * i) % 5) for i in range(50)])]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
    fresh = QueueMachine(MemoryStore())
    fresh.load(others)
    loader = M._Loader(fresh)  # noqa: SLF001
    loader.meta_seen = True
    assert loader._feed_columns(msgs, 0, {msgs[3][0]: None})  # noqa: SLF001
    got = loader.per_q["d"]
    ids = [int.from_bytes(k[-8:], "big") for k, _ in msgs]
    assert list(got.ids) == list(got.ready_i) == ids[:3] + ids[4:]
    assert list(got.ready_p) == [(7 * i) % 5 for i in range(50) if i != 3]


def test_a_chunk_of_timestamp_priorities_is_split_due_or_delayed_as_columns() -> None:
    """A chunk of timestamp-priority records (neither in flight nor held by a delay) is
    kept whole as columns, the late ones told apart at `finish` by one split of the
    queue's pairs: no record goes through `_place`, and the queue holds the due ones
    ready and the others delayed until their priority's time."""
    from doq.queues import machine as M
    now = 1_800_000_000_000
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("d", "delayed", QueueSettings())]))
    prios = [1_800_000_000 + (i * 37) % 61 - 30 for i in range(60)]  # seconds: half due, half later
    m.apply(2, c.CommandBatch(now, [c.Enqueue("d", [c.EnqueueItem(b"x", priority=p) for p in prios])]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
    ids = [int.from_bytes(k[-8:], "big") for k, _ in msgs]
    late = [p for p in prios if p * 1000 > now]
    future = [kv for kv, p in zip(msgs, prios, strict=True) if p * 1000 > now]
    past = [kv for kv, p in zip(msgs, prios, strict=True) if p * 1000 <= now]
    for part in (msgs, msgs[:10], past, future):  # mixed chunks; the past only; the future only
        fresh = QueueMachine(MemoryStore())
        fresh.load(others)
        loader = M._Loader(fresh)  # noqa: SLF001
        loader.meta_seen = True
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(M._Loader, "_place", None)  # noqa: SLF001
            mp.setattr(M._Loader, "_split_due", None)  # noqa: SLF001
            assert loader._feed_columns(part, 0, None)  # noqa: SLF001
            got = loader.per_q["d"]
            held = {ids.index(int.from_bytes(k[-8:], "big")) for k, _ in part}
            assert (got.late_above is None) == all(prios[j] * 1000 <= now for j in held)
            loader.finish()
        due = sorted((prios[j], ids[j]) for j in held if prios[j] * 1000 <= now)
        q = fresh.queues["d"]
        assert list(q.index.ready) == due and not q.inflight
        assert list(q.delayed) == sorted((prios[j] * 1000, ids[j]) for j in held if prios[j] * 1000 > now)
    assert len(late) == len(future)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3) | st.integers(R.TS_PRIORITY_MIN - 2, R.TS_PRIORITY_MIN + 2)
                          | st.integers(1_799_999_990, 1_800_000_010) | st.integers(R.MAX_MS // 1000 - 2, R.MAX_MS // 1000 + 2),
                          st.sampled_from([0, 0, 0, 5_000, 20_000])),
                min_size=1, max_size=80),
       st.sampled_from([3, 7, 1024]), st.sets(st.integers(0, 79), max_size=5),
       st.sampled_from([1_800_000_000_000, 1_800_000_000_999, 0]))
def test_a_rebuild_of_timestamp_priorities_is_the_per_record_load(items: list[tuple[int, int]], chunk: int,
                                                                  dequeued: set[int], now: int) -> None:
    """A delayed queue's rebuild by columns (timestamp chunks kept whole, the late pairs
    split off at `finish`) holds what the per-record load holds (`_feed_rows` only): the
    same ready order, the same delayed (time, id) list, the same in-flight entries and
    due times, beside records with a delay, in flight, with priorities no timestamps and
    timestamps past MAX_MS; chunks of several sizes."""
    from doq.queues import machine as M
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(now, [c.CreateQueue("d", "delayed", QueueSettings())]))
    m.apply(2, c.CommandBatch(now, [c.Enqueue("d", [c.EnqueueItem(b"x", priority=p, delay_ms=d) for p, d in items])]))
    if dequeued:
        m.apply(3, c.CommandBatch(now, [c.Dequeue("d", len(dequeued), visibility_timeout_ms=30_000)]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))

    def state(mm: QueueMachine) -> tuple[object, ...]:
        q = mm.queues["d"]
        return (list(q.index.ready), list(q.delayed), sorted(q.inflight), list(mm.due), list(mm.leases),
                q.n_delayed, mm.queue_info("d"))

    fast = QueueMachine(MemoryStore())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", chunk)
        fast.load(others, msgs, ordered=True)
    slow = QueueMachine(MemoryStore())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M._Loader, "_feed_columns", lambda *a, **k: False)  # noqa: SLF001
        slow.load(others, msgs, ordered=True)
    assert state(fast) == state(slow)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-3, 3) | st.integers(R.TS_PRIORITY_MIN - 2, R.TS_PRIORITY_MIN + 2)
                | st.integers(1_799_999_990, 1_800_000_010) | st.integers(R.MAX_MS // 1000 - 2, 2**63 - 1),
                min_size=1, max_size=40),
       st.sampled_from([0, 1_800_000_000_000, 1_800_000_000_999, R.TS_PRIORITY_MIN * 1000 - 1, R.MAX_MS - 1,
                        R.MAX_MS, -1]))
def test_split_due_as_columns_is_place_one_by_one(ps: list[int], now: int) -> None:
    """`_split_due` (the timestamp chunk told due or delayed in C) puts each record where
    `_place` puts it alone: ready (priority, id) in order, or delayed at min(p * 1000,
    MAX_MS); equal timestamps, priorities that are no timestamps, times past MAX_MS."""
    from doq.queues import machine as M
    ids = list(range(1, len(ps) + 1))
    ats = [min(p * 1000, R.MAX_MS) if p >= R.TS_PRIORITY_MIN else 0 for p in ps]
    want_ready = [(p, i) for p, i, at in zip(ps, ids, ats, strict=True) if at <= now]
    want_delayed = [(at, i) for i, at in zip(ids, ats, strict=True) if at > now]
    m = QueueMachine(MemoryStore())
    m.apply(1, c.CommandBatch(1000, [c.CreateQueue("d", "delayed", QueueSettings())]))
    m.now_ms = now
    loader = M._Loader(m)  # noqa: SLF001
    cur = M._QueueLoad(m.queues["d"])  # noqa: SLF001
    loader._split_due(cur, array("q", ps), array("Q", ids))  # noqa: SLF001
    assert list(zip(cur.ready_p, cur.ready_i, strict=True)) == want_ready
    assert list(zip(cur.dl_at, cur.dl_id, strict=True)) == want_delayed


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3) | st.integers(1_799_999_990, 1_800_000_010)
                | st.sampled_from([-(2**63), -(2**62), 2**62, 2**63 - 1]), min_size=1, max_size=300),
       st.integers(-3, 3) | st.integers(1_799_999_990, 1_800_000_010) | st.integers(-(2**63), 2**63 - 1),
       st.booleans())
def test_late_bytes_as_words_is_the_per_item_test(ps: list[int], threshold: int, known: bool) -> None:
    """`_late_bytes` (the word arithmetic on one int, or its fallbacks for spans of 2**63
    and more) marks exactly the items > threshold, with the bounds given or not; the
    items next to the threshold, the int64 ends and one-item chunks included."""
    from doq.queues import machine as M
    col = array("q", ps)
    want = bytes(p > threshold for p in ps)
    assert M._late_bytes(col, threshold, (min(ps), max(ps)) if known else None) == want  # noqa: SLF001
    for t in (min(ps) - 1, min(ps), max(ps) - 1, max(ps)):  # at the bounds
        assert M._late_bytes(col, t) == bytes(p > t for p in ps)  # noqa: SLF001
    # a span below 2**63 takes the word path: shifted into it, the same answer
    lo = min(ps)
    narrow = array("q", [max(p, lo) if p - lo < 2**62 else lo + 2**62 for p in ps])
    assert M._late_bytes(narrow, threshold) == bytes(p > threshold for p in narrow)  # noqa: SLF001


def test_a_chunk_of_a_fair_queues_ready_records_is_taken_by_runs_of_one_group() -> None:
    """A chunk of a fair queue's ready records is indexed a run of one group at a time
    (no record through `_other`), with groups of one name length or of several."""
    from doq.queues import machine as M
    for groups in ([f"g{i // 7:02d}" for i in range(50)], ["g" * (1 + i // 9) for i in range(50)]):
        store = MemoryStore()
        m = QueueMachine(store)
        m.apply(1, c.CommandBatch(1000, [c.CreateQueue("f", "fair", QueueSettings())]))
        m.apply(2, c.CommandBatch(1000, [c.Enqueue("f", [c.EnqueueItem(b"x", group=g, priority=i % 3)
                                                         for i, g in enumerate(groups)])]))
        msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
        others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
        fresh = QueueMachine(MemoryStore())
        fresh.load(others)
        loader = M._Loader(fresh)  # noqa: SLF001
        loader.meta_seen = True
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(M._Loader, "_other", None)  # noqa: SLF001
            assert loader._feed_columns(msgs, 0, None)  # noqa: SLF001
        got = loader.per_q["f"]
        ids = [int.from_bytes(k[-8:], "big") for k, _ in msgs]
        assert list(got.ids) == ids
        assert {g: (list(p), list(i)) for g, (p, i) in got.ready_keys.items()} == {
            g: ([j % 3 for j in range(50) if groups[j] == g], [ids[j] for j in range(50) if groups[j] == g])
            for g in set(groups)}


def test_overrides_in_a_chunk_out_of_key_order_apply_to_their_own_records() -> None:
    """Message records out of key order, each overridden: every override applies to its
    own record (a chunk whose keys are not in order is not spliced by position)."""
    store = MemoryStore()
    m = QueueMachine(store)
    m.apply(1, c.CommandBatch(1000, [c.CreateQueue("d", "delayed", QueueSettings())]))
    m.apply(2, c.CommandBatch(1000, [c.Enqueue("d", [c.EnqueueItem(b"x", priority=p) for p in (5, 3, 4)])]))
    msgs = sorted((k, v) for k, v in store.data.items() if k[0] == ord("M"))
    others = sorted((k, v) for k, v in store.data.items() if k[0] != ord("M"))
    fresh = QueueMachine(MemoryStore())
    # keys 0, 2, 1 with 1 and 2 left out: bisecting this chunk finds position 1 for both
    fresh.load(others, [msgs[0], msgs[2], msgs[1]], 0, {msgs[1][0]: None, msgs[2][0]: None})
    assert fresh.queue_info("d").stats.ready == 1
    assert fresh.peek_ids("d", MessageState.READY, 0, 10) == [int.from_bytes(msgs[0][0][-8:], "big")]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9), st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(0, 8))
def test_runs_of_equal_names_are_groupby(size: int, picks: list[int], at: int) -> None:
    """`_runs` (where a group's run starts, found by XORs and strided ORs over the chunk) is
    `itertools.groupby` of the names: names of one length differing in one byte anywhere
    (first, last, middle) or in all, runs of one and runs of many."""
    import itertools

    from doq.queues import machine as M
    base = bytes(range(65, 65 + size))
    pool = [base] + [base[:i] + b"\x00" + base[i + 1:] for i in ({at % size, 0, size - 1} if size else set())]
    names = [pool[p % len(pool)] for p in picks]
    want = [(k, len(list(g))) for k, g in itertools.groupby(names)]
    assert M._runs(b"".join(names), size, len(names)) == want  # noqa: SLF001


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(SMALL_A, SMALL_B), max_size=30), min_size=1, max_size=6),
       st.lists(st.integers(0, 5), max_size=40), st.sampled_from([1, 2, 3, 1024]))
def test_pop_firsts_is_a_pop_first_of_each(contents: list[list[tuple[int, int]]], order: list[int],
                                           load: int) -> None:
    """`PairList.pop_firsts(lists)` pops what `pop_first()` of each list in turn pops, and
    leaves the same lists (unsorted chunks left by `add_many` included; a list may come
    more than once)."""
    old = pairlist.LOAD
    pairlist.LOAD = load
    try:
        fast, slow = [], []
        for pairs in contents:
            pairs = sorted(set(pairs), key=lambda p: (p[1], p[0]))  # distinct, out of order
            for side in (fast, slow):
                pl = PairList()
                pl.add_many([a for a, _ in pairs[: len(pairs) // 2]], [b for _, b in pairs[: len(pairs) // 2]])
                pl.add_many([a for a, _ in pairs[len(pairs) // 2 :]], [b for _, b in pairs[len(pairs) // 2 :]])
                side.append(pl)
        left = [len(pl) for pl in slow]
        picks = []
        for i in order:
            i %= len(slow)
            if left[i]:
                left[i] -= 1
                picks.append(i)
        got = PairList.pop_firsts([fast[i] for i in picks])
        want = [slow[i].pop_first() for i in picks]
        assert got == ([a for a, _ in want], [b for _, b in want])
        for f, s in zip(fast, slow, strict=True):
            f.check()
            assert list(f) == list(s) and len(f) == len(s)
    finally:
        pairlist.LOAD = old


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 70_000), st.integers(1, 70_000), st.integers(1, 40)), max_size=3),
       st.randoms(use_true_random=False))
def test_idset_bulk_load_equals_the_per_id_load(runs: list[tuple[int, int, int]], rnd: object) -> None:
    """`load_sorted` (C calls per page: offsets, bitmaps with holes cleared per run of
    missing ids) builds the very pages the per-id load builds: the same form and bytes,
    counts and length, for dense pages with holes (single and runs), sparse and full ones."""
    ids: set[int] = set()
    for first, n, drop in runs:
        ids.update(x for x in range(first, first + n) if rnd.randrange(drop) or drop == 1)  # type: ignore[attr-defined]
    ref = sorted(ids)
    bulk, by_id = IdSet(), IdSet()
    bulk.load_sorted(ref)
    by_id._load_sorted_by_id(ref)
    assert bulk._pages == by_id._pages and bulk._counts == by_id._counts and len(bulk) == len(by_id) == len(ref)
    assert all(type(bulk._pages[h]) is type(by_id._pages[h]) for h in bulk._pages)
    assert list(bulk) == ref
