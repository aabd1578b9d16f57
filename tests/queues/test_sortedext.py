"""`extend_sorted` leaves a SortedList exactly as `update` does (values, order, positions)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from doq.queues.sortedext import extend_sorted


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
