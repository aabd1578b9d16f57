"""Where a three-node doq cluster spends CPU and writes per message, for the latency
workloads of `bench/side_by_side.py` (`e2e` at 1,000 msg/s and `calls`, one
`client.enqueue()` at a time).

    python bench/quorum_cpu.py --runs 3 [--nodes 3] [--workloads e2e,calls] [--secure] [--json FILE]

For each run, on a fresh cluster (clients on the leader, node-1): the workload's latency
figures (as `side_by_side` prints them), and per node the CPU time per message of each
thread kind (`loop`: the main thread, which runs the event loop; `grpc`: gRPC's C-core
threads, named `event_engine`; `other`: the other threads, i.e. the Raft writer thread
and gRPC's Python poller thread, which Linux names alike) and the durable writes (LMDB commits, `doq_commit_seconds_count` of its
`/metrics`) per message. On this machine of 2 vCPUs the three nodes and the clients share
the CPUs, so CPU per message is what queueing at 1,000 msg/s is made of. `--secure`: the
cluster runs `doq serve --secure` (TLS on every port, mutual TLS between the members)."""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]

from bench import side_by_side as sbs  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU time (user + system) of each thread kind of process `pid` so far."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        kind = "loop" if tid == str(pid) else "grpc" if name.startswith(("event_engine", "grpc")) else "other"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def writes(http_url: str, server: sbs.Server) -> float:
    """Durable writes (LMDB commits) of one node so far."""
    req = urllib.request.Request(f"{http_url}/metrics")
    ctx = None
    if server.ca_file:  # a secure cluster: its CA, its admin key
        ctx = ssl.create_default_context(cafile=server.ca_file)
        req.add_header("Authorization", f"Bearer {sbs.DOQ_KEY[server.addr]}")
    with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
        text = r.read().decode()
    m = re.search(r"^doq_commit_seconds_count (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def http_urls(server: sbs.Server) -> list[str]:
    """The HTTP URLs of the nodes, read from their command lines."""
    urls = []
    for pid in server.pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode().split("\0")
        urls.append(("https://" if server.ca_file else "http://") + args[args.index("--http-addr") + 1])
    return urls


def one_run(workload: str, run: int, args: sbs.Args, root: Path, secure: bool = False) -> dict[str, Any]:
    with sbs.doq_server(root, args.nodes, secure=secure) as server:
        urls = http_urls(server)
        c0 = [thread_cpu_s(p) for p in server.pids]
        w0 = [writes(u, server) for u in urls]
        r = sbs.run_once("doq-tls" if secure else "doq", server, workload, run, args)
        c1 = [thread_cpu_s(p) for p in server.pids]
        w1 = [writes(u, server) for u in urls]
    n = r["messages"]
    nodes = []
    for a, b, wa, wb in zip(c0, c1, w0, w1, strict=True):
        per = {k: round((b.get(k, 0) - a.get(k, 0)) * 1e6 / n, 1) for k in sorted(b)}
        nodes.append({"cpu_us_per_msg": round(sum(per.values()), 1), "threads": per,
                      "writes_per_msg": round((wb - wa) / n, 3)})
    return {**r, "nodes": nodes, "loadavg": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--workloads", default="e2e,calls")
    p.add_argument("--secure", action="store_true", help="doq serve --secure (TLS, mutual TLS between members)")
    p.add_argument("--json")
    ns = p.parse_args()
    args = sbs.Args(count=0, consume_count=0, e2e_count=5000, calls_count=3000, rate=1000.0,
                    payload_bytes=100, runs=ns.runs, workloads=ns.workloads.split(","), nodes=ns.nodes)
    record: dict[str, Any] = {"loadavg_before": os.getloadavg(), "runs": {}}
    for run in range(1, ns.runs + 1):
        for workload in args.workloads:
            with tempfile.TemporaryDirectory(prefix="doq-qcpu-") as tmp:
                r = one_run(workload, run, args, Path(tmp), ns.secure)
            record["runs"].setdefault(workload, []).append(r)
            print(workload, run, json.dumps({k: r[k] for k in ("p50_ms", "p99_ms", "loadavg")}),
                  json.dumps(r["nodes"]), flush=True)
    for workload, runs in record["runs"].items():
        p50 = statistics.median(r["p50_ms"] for r in runs)
        cpu = [statistics.median(r["nodes"][i]["cpu_us_per_msg"] for r in runs) for i in range(ns.nodes)]
        w = [statistics.median(r["nodes"][i]["writes_per_msg"] for r in runs) for i in range(ns.nodes)]
        print(f"{workload}: p50 {p50} ms; CPU us/msg per node {cpu}; writes/msg per node {w}")
    record["loadavg_after"] = os.getloadavg()
    if ns.json:
        Path(ns.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
