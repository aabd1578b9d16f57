"""The client's own CPU time per message and its rate, sync and asyncio, for two checkouts
of the Python client side by side (before / after a change to the client).

`python bench/client_cpu.py --before DIR [--after DIR] --rounds 6 --count 30000
--modes sync_consumer,async_consumer` starts one `doq serve` (this checkout's, in a temp
dir) and, per round and mode, runs one child process per checkout (the order alternates
round by round: A B, B A, ...), each with that checkout's `clients/python` first on its
path. A child measures its own CPU time (`time.process_time`, user + system of the whole
process: the gRPC threads too) and wall time over the measured loop only:

- `sync_producer` / `async_producer`: `p = c.producer(window=1000)`, `count` enqueues of
  100 bytes, then every result;
- `sync_consumer` / `async_consumer`: a queue pre-filled with `count` messages (not
  measured), then `for m in c.consumer(q, prefetch=1000): cons.ack(m)` (`async for` on an
  `AsyncDoqClient`) until `count` were handed out;
- `sync_hand_out` / `async_hand_out`: the consumer's per-message path alone, without the
  network: `next()` and `ack(m)` of `count` messages put in its buffer (a frame received),
  the sender's request frame taken at each ack batch as the stream would; the best of 5
  passes (CPU time). It reaches into the consumer's private state: it measures this
  version of the code.

Prints each pair with the load average before it, and per mode the medians and the median
of the per-pair ratios; `--json FILE` writes every run. Never asserts on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("sync_producer", "async_producer", "sync_consumer", "async_consumer", "sync_hand_out", "async_hand_out")
BODY = b"x" * 100


# -- the child: one measured run of one mode with one checkout's client -------------------
def _child(checkout: str, target: str, mode: str, count: int) -> dict[str, Any]:
    import asyncio
    import time
    import uuid

    sys.path[:0] = [str(Path(checkout) / "clients" / "python")]
    from doq_client import AsyncDoqClient, DoqClient

    q = "cpu-" + uuid.uuid4().hex[:8]

    def prefill() -> None:
        with DoqClient(target) as c:
            c.create_queue(q)
            with c.producer(window=20000, batch=1000) as p:
                for f in [p.enqueue(q, BODY) for _ in range(count)]:
                    f.result()

    def sync_producer() -> tuple[float, float]:
        with DoqClient(target) as c:
            c.create_queue(q)
            p = c.producer(window=1000)
            c0, w0 = time.process_time(), time.perf_counter()
            for f in [p.enqueue(q, BODY) for _ in range(count)]:
                f.result()
            r = time.process_time() - c0, time.perf_counter() - w0
            p.close()
            c.delete_queue(q)
        return r

    async def async_producer() -> tuple[float, float]:
        async with AsyncDoqClient(target) as c:
            await c.create_queue(q)
            p = c.producer(window=1000)
            c0, w0 = time.process_time(), time.perf_counter()
            fs = [await p.enqueue(q, BODY) for _ in range(count)]
            await asyncio.gather(*fs)
            r = time.process_time() - c0, time.perf_counter() - w0
            await p.close()
            await c.delete_queue(q)
        return r

    def sync_consumer() -> tuple[float, float]:
        prefill()
        with DoqClient(target) as c:
            cons = c.consumer(q, prefetch=1000)
            c0, w0 = time.process_time(), time.perf_counter()
            n = 0
            for m in cons:
                cons.ack(m)
                n += 1
                if n == count:
                    break
            r = time.process_time() - c0, time.perf_counter() - w0
            cons.close()
            c.delete_queue(q)
        return r

    async def async_consumer() -> tuple[float, float]:
        prefill()
        async with AsyncDoqClient(target) as c:
            cons = c.consumer(q, prefetch=1000)
            c0, w0 = time.process_time(), time.perf_counter()
            n = 0
            async for m in cons:
                cons.ack(m)
                n += 1
                if n == count:
                    break
            r = time.process_time() - c0, time.perf_counter() - w0
            await cons.close()
            await c.delete_queue(q)
        return r

    def hand_out_msgs() -> list[Any]:
        from doq_proto.v1 import doq_pb2 as pb

        return [pb.Message(id=i + 1, lease_id=i + 7, content=BODY) for i in range(count)]

    def sync_hand_out() -> tuple[float, float]:
        msgs, best = hand_out_msgs(), float("inf")
        cons = DoqClient("127.0.0.1:9").consumer(q, prefetch=1000)  # never connects
        for _ in range(5):
            cons._call, cons._tag = object(), object()  # a stream that delivered a frame
            cons._buffer.extend(msgs)
            c0 = time.process_time()
            for _ in range(count):
                m = cons.next()
                assert m is not None
                cons.ack(m)
                if cons._urgent:
                    with cons._lock:
                        cons._took()
            best = min(best, time.process_time() - c0)
        return best, best

    async def async_hand_out() -> tuple[float, float]:
        msgs, best = hand_out_msgs(), float("inf")
        cons = AsyncDoqClient("127.0.0.1:9").consumer(q, prefetch=1000)
        for _ in range(5):
            cons._call, cons._tag = object(), object()
            cons._buffer.extend(msgs)
            c0 = time.process_time()
            for _ in range(count):
                m = await cons.next()
                assert m is not None
                cons.ack(m)
                if cons._urgent:
                    cons._took()
            best = min(best, time.process_time() - c0)
        return best, best

    if mode == "sync_hand_out":
        cpu, wall = sync_hand_out()
    elif mode == "async_hand_out":
        cpu, wall = asyncio.run(async_hand_out())
    elif mode == "sync_producer":
        cpu, wall = sync_producer()
    elif mode == "async_producer":
        cpu, wall = asyncio.run(async_producer())
    elif mode == "sync_consumer":
        cpu, wall = sync_consumer()
    else:
        cpu, wall = asyncio.run(async_consumer())
    return {"mode": mode, "cpu_us_per_msg": round(cpu * 1e6 / count, 2), "msg_per_s": round(count / wall)}


# -- the driver ----------------------------------------------------------------------------
def _run_child(checkout: str, target: str, mode: str, count: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", checkout, target, mode, str(count)],
                         check=True, capture_output=True, text=True, timeout=600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="client_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", help="checkout A (the baseline)")
    p.add_argument("--after", default=str(REPO), help="checkout B (default: this one)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--count", type=int, default=30000, help="messages per run")
    p.add_argument("--modes", default="sync_consumer,async_consumer")
    p.add_argument("--json", help="write every run to this file")
    p.add_argument("--child", nargs=4, metavar=("CHECKOUT", "TARGET", "MODE", "COUNT"), help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        print(json.dumps(_child(ns.child[0], ns.child[1], ns.child[2], int(ns.child[3]))))
        return 0
    if not ns.before:
        p.error("--before DIR is needed")
    modes = ns.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        p.error(f"unknown mode(s) {bad}: choose from {', '.join(MODES)}")
    sys.path.insert(0, str(REPO))
    from bench.side_by_side import doq_server

    sides = {"before": ns.before, "after": ns.after}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="doq-client-cpu-") as tmp:
        with doq_server(Path(tmp)) as srv:
            for rnd in range(1, ns.rounds + 1):
                for mode in modes:
                    order = ["before", "after"] if rnd % 2 else ["after", "before"]
                    load = os.getloadavg()[0]
                    pair = {}
                    for side in order:
                        pair[side] = _run_child(sides[side], srv.addr, mode, ns.count)
                        runs.append({"round": rnd, "side": side, "load_1m": load, **pair[side]})
                    b, a = pair["before"], pair["after"]
                    print(f"round {rnd} {mode} (load {load:.1f}, {order[0]} first): "
                          f"before {b['cpu_us_per_msg']} us/msg {b['msg_per_s']:,} msg/s; "
                          f"after {a['cpu_us_per_msg']} us/msg {a['msg_per_s']:,} msg/s", flush=True)
    for mode in modes:
        mine = {s: [r for r in runs if r["mode"] == mode and r["side"] == s] for s in sides}
        cpu = {s: statistics.median(r["cpu_us_per_msg"] for r in mine[s]) for s in sides}
        rate = {s: statistics.median(r["msg_per_s"] for r in mine[s]) for s in sides}
        ratios = [a["cpu_us_per_msg"] / b["cpu_us_per_msg"] for b, a in zip(mine["before"], mine["after"], strict=True)]
        print(f"{mode}: median CPU {cpu['before']} -> {cpu['after']} us/msg "
              f"(median per-pair ratio {statistics.median(ratios):.3f}); "
              f"median rate {rate['before']:,.0f} -> {rate['after']:,.0f} msg/s")
    loads = [r["load_1m"] for r in runs]
    print(f"load average (1 min) before the pairs: {min(loads):.1f} .. {max(loads):.1f}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
