"""Server and client CPU per call, by kind of unary call, one at a time on a fresh doq.

    python bench/call_kinds.py [--nodes 1] [--calls 2000] [--rounds 2]

Starts a cluster as `bench/side_by_side.py` does (clients on node-1, the leader) and,
per round, makes `--calls` calls one at a time of each kind after 200 of warm-up:
`health` (grpc.health.v1 Check: the gRPC floor, no interceptor rule, no service),
`get_queue` (the client door's interceptors and a read of the published state),
`list_queues`, `enqueue` (100 bytes: the Raft write path too). Prints p50 and the CPU
(user + system) per call of the server processes (all nodes) and of this process (the
client). Differences between kinds say what each layer adds to a call."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from bench import side_by_side as sbs  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="doq-call-kinds-") as tmp, sbs.doq_server(Path(tmp), ns.nodes) as server:
        sbs._doq_queue(server.addr, "q")
        channel = grpc.insecure_channel(server.addr)
        health: Any = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        with sbs._doq(server.addr) as c:
            kinds: dict[str, Callable[[], object]] = {
                "health": lambda: health.Check(health_pb2.HealthCheckRequest()),
                "get_queue": lambda: c.get_queue("q"),
                "list_queues": lambda: c.list_queues(),
                "enqueue": lambda: c.enqueue("q", b"x" * 100),
            }
            for _ in range(ns.rounds):
                for kind, call in kinds.items():
                    for _ in range(200):
                        call()
                    lat_ms: list[float] = []
                    server0, client0 = server.cpu_s(), time.process_time()
                    for _ in range(ns.calls):
                        t0 = time.perf_counter()
                        call()
                        lat_ms.append((time.perf_counter() - t0) * 1e3)
                    server_us = (server.cpu_s() - server0) / ns.calls * 1e6
                    client_us = (time.process_time() - client0) / ns.calls * 1e6
                    print(f"{kind:12s} p50 {statistics.median(lat_ms):.3f} ms, server CPU {server_us:.0f} us/call, "
                          f"client CPU {client_us:.0f} us/call, load {os.getloadavg()[0]:.2f}", flush=True)
        channel.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
