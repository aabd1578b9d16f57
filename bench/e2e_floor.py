"""The floor of the end-to-end path on this machine: what its bare parts cost, quiet.

`python bench/e2e_floor.py [--count N] [--dir DIR]` measures, one after the other:

- `fsync`: a 64-byte `os.write` + `os.fsync` on a file in DIR (the data dir's file system);
- `lmdb_put`: a one-put LMDB write transaction committed with sync (as a node commits);
- `handoff_executor`: an asyncio loop hands a no-op to a one-thread `ThreadPoolExecutor`
  (`run_in_executor`) and resumes when it is done;
- `handoff_thread`: the same through a dedicated thread taking jobs from a
  `queue.SimpleQueue` and answering with `call_soon_threadsafe`;
- `grpc_rtt`: a sync grpc client (as doq_client's) sends one small message on a
  bidirectional stream to a grpc.aio echo server in another process (uvloop, like `doq
  serve`) and waits for the echo: two loopback hops (one hop is about half).

Each prints p50 / p90 / p99 in ms. The end-to-end path of a message at 1,000 msg/s
holds two hops (producer -> server -> consumer), one hand-off to the writer and back,
and one commit (an LMDB transaction with fsync): the sum of those medians is the floor
of the e2e p50 with this design on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_METHOD = "/floor.Echo/Stream"


def _stats(name: str, values_ns: list[int]) -> dict[str, Any]:
    v = sorted(values_ns)

    def pct(q: float) -> float:
        return round(v[min(len(v) - 1, int(q / 100 * len(v)))] / 1e6, 3)

    return {"name": name, "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99)}


def _timed(count: int, fn: Callable[[], None]) -> list[int]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return out


def measure_fsync(d: Path, count: int) -> list[int]:
    fd = os.open(d / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        def one() -> None:
            os.write(fd, b"x" * 64)
            os.fsync(fd)
        return _timed(count, one)
    finally:
        os.close(fd)


def measure_lmdb(d: Path, count: int) -> list[int]:
    import lmdb

    env = lmdb.open(str(d / "lmdb"), map_size=64 << 20)
    n = iter(range(1 << 62))
    try:
        def one() -> None:
            with env.begin(write=True) as txn:
                txn.put(next(n).to_bytes(8, "big"), b"x" * 100)
        return _timed(count, one)
    finally:
        env.close()


async def _handoffs(count: int) -> tuple[list[int], list[int]]:
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    ex: list[int] = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        await loop.run_in_executor(pool, int)
        ex.append(time.perf_counter_ns() - t0)
        await asyncio.sleep(0.0005)
    pool.shutdown()
    jobs: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (fut := jobs.get()) is not None:
            loop.call_soon_threadsafe(fut.set_result, None)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    th: list[int] = []
    for _ in range(count):
        fut: asyncio.Future[None] = loop.create_future()
        t0 = time.perf_counter_ns()
        jobs.put(fut)
        await fut
        th.append(time.perf_counter_ns() - t0)
        await asyncio.sleep(0.0005)
    jobs.put(None)
    t.join()
    return ex, th


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.new_event_loop()


async def _echo_serve() -> None:
    import grpc

    async def stream(it: Any, _ctx: Any) -> Any:
        async for raw in it:
            yield raw

    handler = grpc.method_handlers_generic_handler(
        "floor.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(stream)})
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def measure_grpc(count: int) -> list[int]:
    import grpc

    proc = subprocess.Popen([sys.executable, __file__, "--echo-serve"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(_METHOD)
            requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
            responses = call(iter(requests.get, None))
            body = b"x" * 120
            out = []
            for i in range(count + 50):
                t0 = time.perf_counter_ns()
                requests.put(body)
                next(responses)
                if i >= 50:  # the first ones warm the stream up
                    out.append(time.perf_counter_ns() - t0)
                time.sleep(0.0005)
            requests.put(None)
            return out
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="e2e_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000, help="samples per measurement")
    p.add_argument("--dir", help="where the fsync and LMDB files go (default: a temp dir)")
    p.add_argument("--echo-serve", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.echo_serve:
        _new_loop().run_until_complete(_echo_serve())
        return 0
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="doq-floor-", dir=ns.dir) as tmp:
        results = [_stats("fsync (64 B write + fsync)", measure_fsync(Path(tmp), ns.count)),
                   _stats("lmdb_put (one-put txn, sync)", measure_lmdb(Path(tmp), ns.count))]
    ex, th = _new_loop().run_until_complete(_handoffs(ns.count))
    results += [_stats("handoff_executor (run_in_executor round trip)", ex),
                _stats("handoff_thread (SimpleQueue + call_soon_threadsafe)", th),
                _stats("grpc_rtt (stream echo, two hops)", measure_grpc(ns.count))]
    print("| part | p50 ms | p90 ms | p99 ms |\n| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['name']} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} |")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
