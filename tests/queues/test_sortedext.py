"""The bulk changes of doq.queues.sortedext leave a SortedList exactly as its own methods
do (values, order, positions, invariants)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from doq.queues.sortedext import extend_sorted, pop_front, remove_many


@settings(max_examples=200)
@given(st.lists(st.integers(-50, 5000), max_size=3000), st.integers(0, 5000), st.integers(0, 4000),
       st.integers(-60, 60))
def test_like_update(base: list[int], start: int, n: int, shift: int) -> None:
    values = list(range(start + shift, start + shift + n))
    a, b = SortedList(base), SortedList(base)
    a._reset(7) if n % 3 == 0 else None  # a small load: many sublists
    b._reset(7) if n % 3 == 0 else None
    extend_sorted(a, values)
    b.update(values)
    assert list(a) == list(b)
    a._check()
    for i in (0, len(a) // 2, len(a) - 1) if a else ():
        assert a[i] == b[i] and a.index(a[i]) == b.index(b[i])
    if a:
        a.add(start)
        b.add(start)
        assert list(a) == list(b) and a.pop(0) == b.pop(0)
        a._check()


def test_tuples_after_the_last() -> None:
    sl = SortedList([(1, "q", "a"), (5, "q", "b")])
    extend_sorted(sl, sorted([(9, "q", "z"), (9, "q", "c")]))
    assert list(sl) == [(1, "q", "a"), (5, "q", "b"), (9, "q", "c"), (9, "q", "z")]
    sl._check()


def _sl(values: list[int], small_load: bool) -> SortedList:
    sl = SortedList(values)
    if small_load:
        sl._reset(7)  # many sublists
    return sl


@settings(max_examples=300)
@given(st.lists(st.integers(-50, 5000), max_size=3000), st.integers(0, 3500), st.booleans())
@example(list(range(30)), 10, True)  # ends inside a sublist after whole ones (the mutation
@example(list(range(30)), 3, False)  # run's 25 derandomized examples missed a partial pop)
def test_pop_front_like_pop(base: list[int], n: int, small_load: bool) -> None:
    a, b = _sl(base, small_load), _sl(base, small_load)
    got = pop_front(a, n)
    assert got == [b.pop(0) for _ in range(min(n, len(b)))]
    assert list(a) == list(b) and len(a) == len(b)
    a._check()
    a.add(7)
    b.add(7)
    assert list(a) == list(b) and a.index(7) == b.index(7)
    a._check()


@settings(max_examples=300)
@given(st.lists(st.integers(-50, 5000), unique=True, max_size=3000), st.data(), st.booleans())
def test_remove_many_like_remove(base: list[int], data: st.DataObject, small_load: bool) -> None:
    gone = sorted(data.draw(st.sets(st.sampled_from(base))) if base else set())
    a, b = _sl(base, small_load), _sl(base, small_load)
    remove_many(a, gone)
    for v in gone:
        b.remove(v)
    assert list(a) == list(b) and len(a) == len(b)
    a._check()
    if a:
        assert a[len(a) // 2] == b[len(b) // 2] and a.pop(0) == b.pop(0)
        a._check()


def test_remove_many_of_a_run() -> None:
    """A frame's acks: a run of consecutive keys in a long list (the bulk path)."""
    a, b = SortedList(range(10_000)), SortedList(range(10_000))
    remove_many(a, list(range(2_500, 3_000)))
    for v in range(2_500, 3_000):
        b.remove(v)
    assert list(a) == list(b)
    a._check()


@pytest.mark.parametrize("gone", [[5, 10_001], [10_001], [3, 3]])
def test_remove_many_refuses_missing_or_repeated_values(gone: list[int]) -> None:
    sl = SortedList(range(0, 20_000, 2))
    with pytest.raises(ValueError):
        remove_many(sl, gone)
    assert list(sl) == list(range(0, 20_000, 2))
    sl._check()
