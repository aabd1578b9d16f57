"""In-memory index bytes per queued message (payloads are in LMDB, not counted).

Usage: python bench/index_memory.py [--messages 1000000]
(from a checkout: python bench/index_memory.py ...)
Enqueues through QueueMachine.apply into a store that keeps nothing, and measures the
machine's retained allocations with tracemalloc, for: a delayed queue (ready), a fair queue
with 1000 groups (ready), delayed-by-time messages, and in-flight (leased) messages.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.queues import commands as c
from doq.queues.machine import QueueMachine
from doq.queues.model import QueueSettings

T0 = 1_700_000_000_000


class NullStore:
    """Discards writes; `get` returns a minimal valid record (for dequeue)."""

    def __init__(self) -> None:
        from doq.queues.records import encode_message

        self.rec = encode_message(0, 0, T0, b"", b"", b"", b"x" * 100)

    def get(self, key: bytes) -> bytes | None:
        return self.rec

    def put(self, key: bytes, value: bytes) -> None:
        pass

    def insert(self, key: bytes, value: bytes) -> None:
        pass

    def insert_many(self, keys: list[bytes], head: bytes, tails: list[bytes]) -> None:
        pass

    def delete(self, key: bytes) -> None:
        pass

    def delete_many(self, keys: list[bytes]) -> None:
        pass

    def rewrite_many(self, keys: list[bytes], edit: Callable[[list[bytes]], list[bytes]],
                     **options: object) -> None:
        edit([self.rec] * len(keys))

    def pop_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.rec] * len(keys)


def measure(kind: str, n: int) -> float:
    m = QueueMachine(NullStore())
    qtype = "fair" if kind == "fair" else "delayed"
    m.apply(0, c.CommandBatch(T0, [c.CreateQueue("q", qtype, QueueSettings())]))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    batch = 1000
    for i in range(n // batch):
        items = [
            c.EnqueueItem(b"", group=f"tenant-{(i * batch + j) % 1000}" if kind == "fair" else "",
                          priority=(i * batch + j) % 7, delay_ms=3_600_000 if kind == "delayed-time" else 0)
            for j in range(batch)
        ]
        m.apply(i + 1, c.CommandBatch(T0, [c.Enqueue("q", items)]))
        if kind == "in-flight":
            m.apply(i + 1, c.CommandBatch(T0, [c.Dequeue("q", batch)]))
    del items
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    info = m.queue_info("q").stats
    assert info.total == n, info
    return used / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    a = ap.parse_args()
    for kind in ("delayed-ready", "fair", "delayed-time", "in-flight"):
        print(f"{kind:14s} {measure(kind, a.messages):7.1f} bytes/message ({a.messages} messages)")


if __name__ == "__main__":
    main()
