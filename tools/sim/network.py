"""A faulty in-memory network on a virtual clock: drops, delays (hence reordering),
duplicates, symmetric and one-way partitions. Fully determined by its ``random.Random``."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from doq.raft.types import Message


@dataclass(slots=True)
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    min_delay: int = 1
    max_delay: int = 1


class Network:
    """Messages in flight, delivered in (due time, send order)."""

    def __init__(self, rng: random.Random, faults: Faults) -> None:
        self.rng = rng
        self.faults = faults
        self.blocked: set[tuple[str, str]] = set()
        self.isolated: dict[str, int] = {}
        """Node id -> time its isolation ends (independent of ``blocked``)."""
        self._heap: list[tuple[int, int, Message]] = []
        self._seq = 0
        self.sent = 0
        self.dropped = 0

    def send(self, now: int, m: Message) -> None:
        self.sent += 1
        f = self.faults
        rng = self.rng
        if self.cut(m) or (f.drop and rng.random() < f.drop):
            self.dropped += 1
            return
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        for _ in range(copies):
            due = now + rng.randint(f.min_delay, f.max_delay)
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, m))

    def due(self, now: int) -> list[Message]:
        """Pop every message due at or before ``now`` (partitions apply at delivery too)."""
        out: list[Message] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            m = heapq.heappop(heap)[2]
            if self.cut(m):
                self.dropped += 1
                continue
            out.append(m)
        return out

    def __len__(self) -> int:
        return len(self._heap)

    # -- partitions ------------------------------------------------------------------
    def cut(self, m: Message) -> bool:
        iso = self.isolated
        if iso and (m.frm in iso or m.to in iso):
            return True
        return (m.frm, m.to) in self.blocked

    def isolate(self, node: str, until: int) -> None:
        self.isolated[node] = until

    def expire_isolations(self, now: int) -> None:
        for n, t in list(self.isolated.items()):
            if t <= now:
                del self.isolated[n]

    def partition(self, side_a: list[str], side_b: list[str]) -> None:
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def block_one_way(self, src: str, dst: str) -> None:
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()
        self.isolated.clear()
