"""Ready index of a delayed queue: lowest priority value first, ties FIFO by id.

The interface speaks keys `ready_key(priority, id)` (single ints, as `FairIndex`); the
index holds the (priority, id) pairs in a `PairList` (packed arrays, ~16 bytes a message).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from operator import le, lt

from doq.queues.pairlist import PairList, PairRanges

PRIO_OFFSET = 1 << 63
MASK64 = (1 << 64) - 1


def ready_key(priority: int, id_: int) -> int:
    """Sort key of a ready message: (priority, id) packed in one int."""
    return ((priority + PRIO_OFFSET) << 64) | id_


class PriorityIndex:
    """Ready messages of a delayed queue. Groups are ignored."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready = PairList()

    @property
    def n_ready(self) -> int:
        return len(self.ready)

    def has_ready(self) -> bool:
        return bool(self.ready)

    def add(self, key: int, group: str) -> None:
        self.ready.add((key >> 64) - PRIO_OFFSET, key & MASK64)

    def add_pair(self, priority: int, id_: int) -> None:
        self.ready.add(priority, id_)

    def add_ids(self, priority: int, ids: range | list[int]) -> None:
        """Add the ascending `ids`, all of one `priority`."""
        rl = self.ready
        if ids and (not rl or (priority, ids[0]) > rl.last()):
            rl._append_sorted([priority] * len(ids), list(ids))  # noqa: SLF001 (same package)
            return
        rl.add_many([priority] * len(ids), ids)

    def add_pairs(self, priorities: Sequence[int], ids: Sequence[int]) -> None:
        """Add the (priority, id) pairs, in any order (ids distinct, none held)."""
        self.ready.add_many(priorities, ids)

    def add_many(self, keys: list[int], group: str) -> None:
        """`add(k, group)` for every key (ascending)."""
        self.add_pairs([(k >> 64) - PRIO_OFFSET for k in keys], [k & MASK64 for k in keys])

    def remove(self, key: int, group: str) -> None:
        self.ready.remove((key >> 64) - PRIO_OFFSET, key & MASK64)

    def pop(self, lease: bool) -> tuple[int, str] | None:
        """Take the next deliverable key (and its group)."""
        if not self.ready:
            return None
        (p,), (i,) = self.ready.pop_front(1)
        return ready_key(p, i), ""

    def pop_ids(self, n: int) -> list[int]:
        """The ids of up to `n` `pop` calls, in order, taken at once."""
        return self.ready.pop_front(n)[1]

    def pop_many(self, n: int, lease: bool) -> list[int]:
        """The keys of up to `n` `pop(lease)` calls, in order, taken at once."""
        ps, ids = self.ready.pop_front(n)
        return [ready_key(p, i) for p, i in zip(ps, ids, strict=True)]

    def peek_ids(self, start: int, stop: int) -> list[int]:
        """The ids at delivery positions start..stop-1, unchanged."""
        return [i for _, i in self.ready.islice(start, stop)]

    def ids(self) -> list[int]:
        return list(self.ready.bs())

    def unleased(self, group: str) -> None:
        """An in-flight message of `group` left flight (acked, returned, deleted)."""

    def group_name(self, group: str) -> str:
        return ""

    def load_pairs(self, priorities: Sequence[int], ids: Sequence[int],
                   p_bounds: tuple[int, int] | None = None, id_bounds: tuple[int, int] | None = None) -> None:
        """Replace the content by the pairs (any order; ids distinct). Pairs out of order
        are left in unsorted chunks, sorted as they are first read (`PairList.from_unsorted`).
        `p_bounds`, `id_bounds`: (lowest, highest) that every priority, every id lies within
        (not checked), if the caller knows them."""
        if all(map(le, priorities, islice(priorities, 1, None))) and all(map(lt, ids, islice(ids, 1, None))):
            self.ready = PairList.from_sorted(priorities, ids)
            return
        self.ready = PairList.from_unsorted(priorities, ids, p_bounds, id_bounds)

    def load_pairs_split(self, priorities: Sequence[int], ids: Sequence[int], ready_upto: int,
                         p_bounds: tuple[int, int] | None = None,
                         id_bounds: tuple[int, int] | None = None) -> PairList:
        """`load_pairs` of the pairs whose priority is <= `ready_upto`; the others are
        returned, as a list of (priority, id) (`PairList.split_unsorted`: one pass over the
        pairs for both)."""
        self.ready, rest = PairList.split_unsorted(priorities, ids, ready_upto, p_bounds, id_bounds)
        return rest

    def load_ranges(self, parts: Sequence[PairRanges], ready_upto: int | None) -> PairList:
        """Replace the content by the pairs of `parts` (distributed apart: a split load's)
        whose priority is <= `ready_upto` (None: all); the others are returned, as a list of
        (priority, id) (`PairList.from_ranges`). The parts are spent."""
        self.ready, rest = PairList.from_ranges(parts, ready_upto)
        return rest

    def bulk_load(self, keys: dict[str, list[int]], inflight: dict[str, int]) -> None:
        ready: list[int] = []
        for ks in keys.values():
            ready.extend(ks)
        ready.sort()
        self.ready = PairList.from_sorted([(k >> 64) - PRIO_OFFSET for k in ready], [k & MASK64 for k in ready])

    def clear(self) -> None:
        self.ready = PairList()
