"""Bulk changes of a `SortedList`, linear in the values changed instead of one `add`,
`pop` or `remove` each: appends of values that all sort after its last one (message ids
and expiry times grow), taking the smallest values (a dequeue), removing many (acks).

Relies on the internals of sortedcontainers 2.x (`_lists`, `_maxes`, `_index`, `_len`,
`_load`), checked against `SortedList`'s own methods by tests/queues/test_sortedext.py.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from sortedcontainers import SortedList


def extend_sorted(sl: SortedList, values: list[Any]) -> None:
    """`sl.update(values)` for `values` in ascending order (else the result is undefined)."""
    if not values:
        return
    if not sl or not values[0] > sl[-1]:
        sl.update(values)
        return
    lists: list[list[Any]] = sl._lists
    maxes: list[Any] = sl._maxes
    load: int = sl._load
    last = lists[-1]
    i = max(0, load - len(last))  # top the last sublist up to the load, then new sublists
    if i:
        last.extend(values[:i])
        maxes[-1] = last[-1]
    n = len(values)
    while i < n:
        chunk = values[i : i + load]
        lists.append(chunk)
        maxes.append(chunk[-1])
        i += load
    sl._len += n
    del sl._index[:]


def pop_front(sl: SortedList, n: int) -> list[Any]:
    """Remove and return the `n` smallest values (all if fewer), in order: `[sl.pop(0) for
    _ in range(n)]` without the per-value rebalancing."""
    lists: list[list[Any]] = sl._lists
    out: list[Any] = []
    i = 0
    while i < len(lists) and len(out) + len(lists[i]) <= n:
        out.extend(lists[i])
        i += 1
    r = n - len(out)
    if r > 0 and i < len(lists):
        out.extend(lists[i][:r])
        _rechunk(sl, 0, i + 1, lists[i][r:])
    elif i:
        del lists[:i]
        del sl._maxes[:i]
        del sl._index[:]
    sl._len -= len(out)
    return out


def remove_many(sl: SortedList, values: list[Any]) -> None:
    """`sl.remove(v)` for each of `values` (ascending, distinct); raises ValueError, changing
    nothing, if one is missing. Linear in the sublists the values span: one at a time when
    they are few and spread."""
    if not values:
        return
    lists: list[list[Any]] = sl._lists
    maxes: list[Any] = sl._maxes
    lo = bisect_left(maxes, values[0])
    hi = bisect_left(maxes, values[-1]) + 1
    if hi > len(lists) or (hi - lo - 2) * sl._load > 2 * len(values):
        if any(v not in sl for v in values):
            raise ValueError("a value to remove is not in the list")
        for v in values:
            sl.remove(v)
        return
    drop = set(values)
    kept = [x for sub in lists[lo:hi] for x in sub if x not in drop]
    if len(drop) != len(values) or sum(map(len, lists[lo:hi])) - len(kept) != len(values):
        raise ValueError("a value to remove is not in the list (or repeats)")
    _rechunk(sl, lo, hi, kept)
    sl._len -= len(values)


def _rechunk(sl: SortedList, lo: int, hi: int, values: list[Any]) -> None:
    """Replace sublists `lo:hi` by the (sorted) `values`, keeping SortedList's invariants
    (no sublist over twice the load, none but the last under half of it)."""
    lists: list[list[Any]] = sl._lists
    load: int = sl._load
    if hi < len(lists):  # take the next sublist in, so that a short tail can join it
        values = values + lists[hi]
        hi += 1
    chunks = [values[i : i + load] for i in range(0, len(values), load)]
    if len(chunks) > 1 and len(chunks[-1]) < load >> 1:
        chunks[-2].extend(chunks.pop())
    lists[lo:hi] = chunks
    sl._maxes[lo:hi] = [c[-1] for c in chunks]
    del sl._index[:]
