"""Bulk appends to a `SortedList` whose new values all sort after its last one (message
ids and expiry times grow): linear in the new values instead of one `add` each.

Relies on the internals of sortedcontainers 2.x (`_lists`, `_maxes`, `_index`, `_len`,
`_load`), checked against `SortedList.update` by tests/queues/test_sortedext.py.
"""

from __future__ import annotations

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
