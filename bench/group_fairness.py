"""Weighted and rate-limited fairness measured against a running node (a benchmark, not a
test: it records figures, it asserts nothing).

    python bench/group_fairness.py --server 127.0.0.1:10500 --seconds 30

Creates a fair queue (`--queue`, recreated), gives group `paying` weight `--weight` and
group `noisy` `--rate` messages per second, fills `--backlog` messages per group
(`paying`, `free`, `noisy`), then `--consumers` threads dequeue batches of `--batch`
with ack for `--seconds` of wall-clock time. Prints per group: messages delivered,
msg/s over the window, and the paying:free ratio. Everything is decided by the
replicated state machine from the leader's clock; the wall-clock window only frames the
measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq_client import DoqClient, QueueNotFound, QueueSettings, enqueue_request


def _fill(client: DoqClient, queue: str, group: str, n: int) -> None:
    for i in range(0, n, 1000):
        client.enqueue_batch([enqueue_request(queue, b"x" * 100, group=group) for _ in range(min(1000, n - i))])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="127.0.0.1:10500", help="a node's gRPC address")
    p.add_argument("--queue", default="bench-fairness")
    p.add_argument("--weight", type=int, default=5, help="weight of group `paying` (`free`: 1)")
    p.add_argument("--rate", type=int, default=100, help="max_per_second of group `noisy`")
    p.add_argument("--backlog", type=int, default=100_000, help="messages queued per group before the run")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    with DoqClient(a.server, timeout_s=60) as client:
        try:
            client.delete_queue(a.queue)
        except QueueNotFound:
            pass
        client.create_queue(a.queue, "fair", QueueSettings())
        client.set_group_policy(a.queue, "paying", a.weight)
        client.set_group_policy(a.queue, "noisy", max_per_second=a.rate)
        for g in ("paying", "free", "noisy"):
            _fill(client, a.queue, g, a.backlog)
    counts: Counter[str] = Counter()
    seen: dict[str, list[float]] = {}  # group -> [first batch time, its count, last batch time]
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + a.seconds

    def consume() -> None:
        with DoqClient(a.server, timeout_s=60) as c:
            while time.monotonic() < stop_at:
                got = c.dequeue(a.queue, max_messages=a.batch, ack=True)
                now = time.monotonic()
                n = Counter(m.group for m in got)
                with lock:
                    counts.update(n)
                    for g, k in n.items():
                        s = seen.setdefault(g, [now, k, now])
                        s[2] = now

    threads = [threading.Thread(target=consume) for _ in range(a.consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    doc = {
        "seconds": round(elapsed, 2), "weight": a.weight, "rate": a.rate, "batch": a.batch,
        "consumers": a.consumers,
        "delivered": dict(sorted(counts.items())),
        "per_second": {g: round(n / elapsed, 1) for g, n in sorted(counts.items())},
        # from a group's first delivery to its last (the window's start-up and the tail after
        # a group ran dry left out): what a group gets while it is served
        "per_second_while_served": {g: round((counts[g] - s[1]) / (s[2] - s[0]), 1)
                                    for g, s in sorted(seen.items()) if s[2] > s[0]},
        "paying_to_free": round(counts["paying"] / counts["free"], 4) if counts["free"] else None,
    }
    print(json.dumps(doc) if a.json else "\n".join(f"{k}: {v}" for k, v in doc.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
