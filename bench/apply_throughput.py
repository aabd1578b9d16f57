"""Apply throughput of StateStore.apply_entries on real LMDB (not a test).

Usage: python bench/apply_throughput.py [--messages 200000] [--batch 1000] [--queue-type fair]
(from a checkout: python bench/apply_throughput.py ...)
Prints msg/s for: enqueue (batches of `--batch` 100-byte messages, one entry per batch),
dequeue (max_messages=batch) and ack (batch ids per Ack), apply only (the commit is timed
separately and reported as well).
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--queue-type", default="delayed")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = open_env(d)
        st = StateStore(env)
        idx = 0
        now = 1_700_000_000_000
        timings: dict[str, list[float]] = {"enqueue": [0.0, 0.0], "dequeue": [0.0, 0.0], "ack": [0.0, 0.0]}

        def run(kind: str, cmds: list[c.Command]) -> list[object]:
            nonlocal idx, now
            idx += 1
            now += 1
            data = encode_batch(c.CommandBatch(now, cmds))
            t0 = time.perf_counter()
            txn = env.begin(write=True)
            res = st.apply_entries(txn, [(idx, data)])[0]
            t1 = time.perf_counter()
            txn.commit()
            t2 = time.perf_counter()
            timings[kind][0] += t1 - t0
            timings[kind][1] += t2 - t1
            return res

        run("enqueue", [c.CreateQueue("bench", a.queue_type, QueueSettings())])
        timings["enqueue"] = [0.0, 0.0]
        payload = b"x" * 100
        n = a.messages // a.batch
        for _ in range(n):
            items = [c.EnqueueItem(payload, group=f"g{j % 10}") for j in range(a.batch)]
            run("enqueue", [c.Enqueue("bench", items)])
        for _ in range(n):
            msgs = run("dequeue", [c.Dequeue("bench", a.batch)])[0]
            assert isinstance(msgs, list) and len(msgs) == a.batch
            ids = [m.id for m in msgs]
            lids = [m.lease_id for m in msgs]
            run("ack", [c.Ack("bench", ids, lids)])
        total = n * a.batch
        for kind, (ap_s, commit_s) in timings.items():
            print(f"{kind:8s} apply {total / ap_s:10.0f} msg/s ({ap_s / total * 1e6:.2f} us/msg)"
                  f"   commit {commit_s / total * 1e6:.2f} us/msg")
        deq = timings["dequeue"][0] + timings["ack"][0]
        print(f"dequeue+ack apply {total / deq:10.0f} msg/s")
        env.close()


if __name__ == "__main__":
    main()
