"""How fast a redrive moves a dead-letter queue's messages, and how closely it keeps its rate.

`python bench/redrive.py --server URL --messages 20000 [--rate 0,500,2000]`: for each
rate (0: no limit), on the node at URL (any member), creates `redrive_bench_src` (which
dead-letters into `redrive_bench_dlq`) and the DLQ, fills the DLQ with `--messages`
messages (batches of 1000, `--payload-bytes` each), starts a redrive, follows it with
`GET .../redrive` every `--poll-s` until it ends, and prints one JSON line: messages
moved, wall-clock seconds and messages/s from the start to the first answer that shows it
ended (so the figure includes up to one poll interval), and the replicated-clock duration
and rate (`updated_at_ms - started_at_ms` of the task: what the pacing is held to). The
bench queues are deleted first and after.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from typing import Any

SRC, DLQ = "redrive_bench_src", "redrive_bench_dlq"


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + "/API/v1" + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def run_one(base: str, messages: int, rate: int, payload_bytes: int, poll_s: float) -> dict[str, Any]:
    for q in (SRC, DLQ):
        call(base, "DELETE", f"/queues/{q}")
    call(base, "POST", "/queues", {"name": DLQ})
    call(base, "POST", "/queues", {"name": SRC, "settings": {"max_attempts": 1, "dead_letter_queue": DLQ}})
    body = "x" * payload_bytes
    for start in range(0, messages, 1000):
        n = min(1000, messages - start)
        status, doc = call(base, "POST", f"/queues/{DLQ}/messages:batch",
                           {"messages": [{"content": body} for _ in range(n)]})
        assert status == 200, doc
    t0 = time.perf_counter()
    status, task = call(base, "POST", f"/queues/{DLQ}/redrive", {"max_per_second": rate})
    assert status == 202, task
    while task["state"] == "running":
        time.sleep(poll_s)
        status, task = call(base, "GET", f"/queues/{DLQ}/redrive")
        assert status == 200, task
    wall = time.perf_counter() - t0
    replicated_s = (task["updated_at_ms"] - task["started_at_ms"]) / 1000
    for q in (SRC, DLQ):
        call(base, "DELETE", f"/queues/{q}")
    return {"messages": messages, "rate": rate, "state": task["state"], "moved": task["moved"],
            "wall_s": round(wall, 3), "msgs_per_s_wall": round(task["moved"] / wall, 1),
            "replicated_s": replicated_s,
            "msgs_per_s_replicated": round(task["moved"] / replicated_s, 1) if replicated_s else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/redrive.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8000")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--rate", default="0,500,2000", help="comma separated messages/s (0: no limit)")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--poll-s", type=float, default=0.05)
    ns = p.parse_args(argv)
    for rate in (int(r) for r in ns.rate.split(",") if r):
        print(json.dumps(run_one(ns.server.rstrip("/"), ns.messages, rate, ns.payload_bytes, ns.poll_s)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
