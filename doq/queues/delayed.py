"""Ready index of a delayed queue: lowest priority value first, ties FIFO by id.

Keys are single ints `ready_key(priority, id)`, so the index is one SortedList of ints.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from doq.queues.sortedext import extend_sorted, pop_front

PRIO_OFFSET = 1 << 63
MASK64 = (1 << 64) - 1


def ready_key(priority: int, id_: int) -> int:
    """Sort key of a ready message: (priority, id) packed in one int."""
    return ((priority + PRIO_OFFSET) << 64) | id_


class PriorityIndex:
    """Ready messages of a delayed queue. Groups are ignored."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready: SortedList = SortedList()

    @property
    def n_ready(self) -> int:
        return len(self.ready)

    def has_ready(self) -> bool:
        return bool(self.ready)

    def add(self, key: int, group: str) -> None:
        self.ready.add(key)

    def add_many(self, keys: list[int], group: str) -> None:
        """`add(k, group)` for every key (ascending)."""
        extend_sorted(self.ready, keys)

    def remove(self, key: int, group: str) -> None:
        self.ready.remove(key)

    def pop(self, lease: bool) -> tuple[int, str] | None:
        """Take the next deliverable key (and its group)."""
        if not self.ready:
            return None
        return self.ready.pop(0), ""

    def pop_many(self, n: int, lease: bool) -> list[int]:
        """The keys of up to `n` `pop(lease)` calls, in order, taken at once."""
        return pop_front(self.ready, n)

    def unleased(self, group: str) -> None:
        """An in-flight message of `group` left flight (acked, returned, deleted)."""

    def group_name(self, group: str) -> str:
        return ""

    def bulk_load(self, keys: dict[str, list[int]], inflight: dict[str, int]) -> None:
        ready: list[int] = []
        for ks in keys.values():
            ready.extend(ks)
        self.ready = SortedList(ready)

    def clear(self) -> None:
        self.ready = SortedList()
