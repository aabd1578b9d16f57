"""What an open dashboard costs the data path: the per-message producer and consumer of
`bench/side_by_side.py` (one enqueue and one confirmation per message; one ack per
message) against one node, alternating run by run between "no page" and "page open" (a
reader of the node's `GET /events` stream, the one the dashboard at `/ui` keeps open,
reading every event while the clients run).

    python bench/dashboard_cost.py [--runs 3] [--count 100000] [--consume-count 50000] [--json FILE]

Prints the median rate and the mean server CPU time per message, with the
differences to "no page"; `--json FILE` writes every run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from bench import alternating
from bench import side_by_side as sbs

NAMES = ("no page", "page open")


@contextlib.contextmanager
def open_page(http_host: str, http_port: int) -> Iterator[list[int]]:
    """Read `/events` in a thread while the block runs; the value counts the events read."""
    events = [0]
    conn = http.client.HTTPConnection(http_host, http_port, timeout=30)
    conn.request("GET", "/events", headers={"Accept": "text/event-stream"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"GET /events answered {resp.status}")
    stop = threading.Event()

    def read() -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):  # the close ends it
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    return
                if line.startswith(b"event: snapshot"):
                    events[0] += 1

    reader = threading.Thread(target=read, name="dashboard-page", daemon=True)
    reader.start()
    try:
        yield events
    finally:
        stop.set()
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(2)  # wakes the reader blocked in readline: it ends
        reader.join(30)
        conn.close()  # only once the reader is done with the response (no race on its file)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/dashboard_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--consume-count", type=int, default=50_000)
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args(argv)
    args = sbs.Args(count=ns.count, consume_count=ns.consume_count, runs=ns.runs, workloads=("producer", "consumer"))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in NAMES}
    with tempfile.TemporaryDirectory(prefix="doq-dashboard-cost-") as tmp, \
            sbs.doq_server(Path(tmp) / "node") as server:
        host, port = server.http_url.split("://", 1)[1].rsplit(":", 1)
        for run in range(ns.runs):
            for workload in args.workloads:
                for i, name in enumerate(NAMES if run % 2 == 0 else NAMES[::-1]):
                    run_id = run * 10 + i
                    with open_page(host, int(port)) if name == "page open" else contextlib.nullcontext([0]) as events:
                        r = sbs.run_once("doq", server, workload, run_id, args)
                    r["events_read"] = events[0]
                    if name == "page open" and events[0] == 0 and r["seconds"] > 2:
                        raise RuntimeError("the page read no event during the run")
                    runs[name].setdefault(workload, []).append(r)
                    print(f"{name:9} {workload:8} run {run}: {r['msg_per_s']:,.0f} msg/s, server "
                          f"{r['server_cpu_us_per_msg']} us/msg, {events[0]} events read", file=sys.stderr)
    summary, lines = alternating.summarize(runs, NAMES, args.workloads)
    print("\n".join(lines))
    if ns.json:
        Path(ns.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
