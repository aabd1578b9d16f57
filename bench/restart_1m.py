"""Restart time: rebuild the in-memory indexes of StateStore from LMDB with N queued messages.

Usage: python bench/restart_1m.py [--messages 1000000] [--dir DIR]
(from a checkout: python bench/restart_1m.py ...)
Fills a fresh LMDB (half a delayed queue, half a fair queue with 1000 groups, 10% leased,
100-byte payloads), closes it, then times `StateStore(env)` (open + rebuild).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore

T0 = 1_700_000_000_000


def fill(path: Path, n: int) -> None:
    env = open_env(path)
    st = StateStore(env)
    idx = 0

    def run(*cmds: c.Command) -> None:
        nonlocal idx
        idx += 1
        with env.begin(write=True) as txn:
            st.apply_entries(txn, [(idx, encode_batch(c.CommandBatch(T0, list(cmds))))])

    run(c.CreateQueue("jobs", "delayed", QueueSettings(visibility_timeout_ms=3_600_000)),
        c.CreateQueue("tenants", "fair", QueueSettings(visibility_timeout_ms=3_600_000)))
    payload = b"x" * 100
    batch = 5000
    for i in range(n // batch):
        q = "jobs" if i % 2 == 0 else "tenants"
        items = [c.EnqueueItem(payload, group=f"t{j % 1000}", priority=j % 10) for j in range(batch)]
        run(c.Enqueue(q, items), c.Dequeue(q, batch // 10))
    env.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--dir", default="")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.dir or tmp) / "doq.lmdb"
        t0 = time.perf_counter()
        fill(path, a.messages)
        print(f"filled {a.messages} messages in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        env = open_env(path)
        st = StateStore(env)
        dt = time.perf_counter() - t0
        total = sum(q.stats.total for q in st.list_queues())
        print(f"restart (open + rebuild) of {total} messages: {dt:.2f} s")
        env.close()


if __name__ == "__main__":
    main()
