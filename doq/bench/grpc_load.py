"""`doq bench`: a load generator for a running doq node or cluster (uses `doq_client` only).

Workloads (each run prints one JSON line):
- `enqueue`: producers stream messages; latency = submit -> durable acknowledgement.
- `dequeue`: pre-fills `--count` messages, then consumers dequeue and ack them in the
  stream; the run ends when the server reports the queue empty (every ack applied).
- `mixed`: producers and consumers at once; latency = enqueue submit -> delivery (e2e).
- `echo`: the `enqueue` workload against a bare grpc.aio server started as a child process
  that answers each frame with a canned response: the per-frame gRPC ceiling of this
  machine. `--with-echo` runs it right after any enqueue run and adds the ratio.

`--frames single` uses EnqueueStream / DequeueStream (one message per frame); `batched`
uses EnqueueBatchStream / DequeueBatchStream with `--batch` messages per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from doq_proto.v1 import doq_pb2 as pb

from doq.bench.args import add_arguments
from doq_client import (
    AlreadyExists,
    AsyncConsumer,
    AsyncDoqClient,
    AsyncProducer,
    DoqClientError,
    PermissionDenied,
    enqueue_request,
    key_interceptors,
)
from doq_client._auth import resolve_key
from doq_client.client import CHANNEL_OPTIONS

_TS = struct.Struct("<q")


@dataclass
class BenchArgs:
    """Parameters of one run (mirrors the command line)."""

    workload: str = "enqueue"
    frames: str = "single"
    server: str = "127.0.0.1:10000"
    ca_file: str | None = None  # TLS, verified with this CA (a secure node's ca.crt)
    tls: bool = False  # TLS with the system's roots when no ca_file
    queue: str = "bench"
    batch: int = 100
    concurrency: int = 1
    payload_bytes: int = 100
    count: int = 0
    duration_s: float = 0.0
    rate: float = 0.0
    window: int = 0
    prefetch: int = 0
    purge: bool = True
    with_echo: bool = False
    show_progress: bool = False  # count the run's messages on stderr (`doq.progress`)
    live: list[Stats] = field(default_factory=list)  # the measured runs' counters, read by the progress

    @property
    def batched(self) -> bool:
        return self.frames == "batched"

    @property
    def frame_size(self) -> int:
        return self.batch if self.batched else 1

    def effective_window(self) -> int:
        if self.window:
            return self.window
        return 16 * self.batch if self.batched else 1000

    def effective_prefetch(self) -> int:
        if self.prefetch:
            return self.prefetch
        return 10 * self.batch if self.batched else 500


@dataclass
class Stats:
    """Counters and latency samples (seconds) of one run."""

    messages: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    def record(self, latency_s: float, n: int = 1) -> None:
        self.messages += n
        if n == 1:
            self.latencies.append(latency_s)
        else:
            self.latencies.extend([latency_s] * n)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def result_line(args: BenchArgs, workload: str, stats: Stats, seconds: float) -> dict[str, Any]:
    """The JSON record of a run (latencies in ms; null when the workload has none)."""
    lat = sorted(stats.latencies)

    def ms(q: float) -> float | None:
        return round(percentile(lat, q) * 1000, 3) if lat else None

    return {
        "workload": workload,
        "frames": args.frames,
        "batch": args.batch if args.batched else 1,
        "concurrency": args.concurrency,
        "payload_bytes": args.payload_bytes,
        "rate": args.rate or None,
        "messages": stats.messages,
        "errors": stats.errors,
        "seconds": round(seconds, 4),
        "msg_per_s": round(stats.messages / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": ms(50),
        "p90_ms": ms(90),
        "p99_ms": ms(99),
    }


# -- pacing -------------------------------------------------------------------------------
class Budget:
    """Shared stop condition: a message count, a duration, or both (first reached wins)."""

    def __init__(self, count: int, duration_s: float) -> None:
        self.left = count if count > 0 else -1
        self.deadline = time.perf_counter() + duration_s if duration_s > 0 else float("inf")

    def take(self, n: int) -> int:
        """Claim up to `n` messages to send; 0 when the run is over."""
        if time.perf_counter() >= self.deadline or self.left == 0:
            return 0
        if self.left < 0:
            return n
        got = min(n, self.left)
        self.left -= got
        return got


async def pace(start: float, sent_frames: int, frames_per_s: float) -> None:
    """Sleep until frame number `sent_frames` is due at `frames_per_s` (open loop)."""
    if frames_per_s <= 0:
        return
    due = start + sent_frames / frames_per_s
    delay = due - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _channel(target: str, args: BenchArgs | None = None) -> grpc.aio.Channel:
    # one TCP connection per worker
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    interceptors = key_interceptors(resolve_key(None))  # `--key` / $DOQ_KEY
    if args is not None and (args.tls or args.ca_file):
        ca = open(args.ca_file, "rb").read() if args.ca_file else None  # noqa: SIM115 - small file
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca), options=options,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


def _payload(size: int) -> bytes:
    return (b"x" * size)[: max(size, 0)]


# -- workloads ----------------------------------------------------------------------------
async def _produce(
    args: BenchArgs, target: str, budget: Budget, stats: Stats, stamp: bool, rate_per_worker: float
) -> None:
    """One producer stream: send until the budget is spent, record submit->ack latency."""
    channel = _channel(target, args)
    producer = AsyncProducer(channel, window=args.effective_window(), batch=args.batch if args.batched else 0)
    payload = _payload(args.payload_bytes)
    fixed = [enqueue_request(args.queue, payload) for _ in range(args.frame_size)]
    start = time.perf_counter()
    frames = 0
    perf = time.perf_counter

    def done(fut: asyncio.Future[Any], t0: float, n: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            stats.errors += n
            return
        if n > 1:
            bad = sum(1 for o in fut.result() if not hasattr(o, "id"))
            stats.errors += bad
            stats.record(perf() - t0, n - bad)
        else:
            stats.record(perf() - t0)

    try:
        while (n := budget.take(args.frame_size)) > 0:
            await pace(start, frames, rate_per_worker / args.frame_size)
            if stamp:
                reqs = [
                    enqueue_request(args.queue, _TS.pack(time.perf_counter_ns()) + payload[8:])
                    for _ in range(n)
                ]
            else:
                reqs = fixed if n == len(fixed) else fixed[:n]
            t0 = perf()
            fut: asyncio.Future[Any] = await (
                producer.enqueue_many(reqs) if args.batched else producer.send(reqs[0])
            )
            fut.add_done_callback(functools.partial(done, t0=t0, n=n))
            frames += 1
        await producer.flush()
    finally:
        await producer.close()
        await channel.close()


async def _consume(
    args: BenchArgs,
    target: str,
    want: Callable[[int], int],
    stats: Stats,
    stamped: bool,
    stop: asyncio.Event,
) -> None:
    """One consumer stream: take and ack messages until `want` says the run is over."""
    channel = _channel(target, args)
    consumer = AsyncConsumer(
        channel,
        args.queue,
        prefetch=args.effective_prefetch(),
        batched=args.batched,
        max_batch=args.batch,
        close_grace_s=0.2,
    )
    try:
        async for batch in _frames_until(consumer, stop):
            if stamped:
                now = time.perf_counter_ns()
                for m in batch:
                    stats.latencies.append((now - _TS.unpack_from(m.content)[0]) / 1e9)
            stats.messages += len(batch)
            consumer.ack_many(batch)
            if want(len(batch)) <= 0:
                stop.set()
    finally:
        await asyncio.sleep(0)
        await consumer.close()
        await channel.close()


async def _frames_until(consumer: AsyncConsumer, stop: asyncio.Event) -> Any:
    """Frames from the consumer until `stop` is set (checked while waiting too)."""
    it = consumer.batches().__aiter__()
    while not stop.is_set():
        nxt = asyncio.ensure_future(it.__anext__())
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if nxt not in done:
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            return
        try:
            yield nxt.result()
        except StopAsyncIteration:
            return


async def _ensure_queue(client: AsyncDoqClient, args: BenchArgs) -> None:
    with contextlib.suppress(AlreadyExists, PermissionDenied):  # a key without admin: the queue as it is
        await client.create_queue(args.queue)
    if args.purge:
        await client.purge_queue(args.queue)


async def _wait_empty(client: AsyncDoqClient, queue: str, timeout_s: float = 60.0) -> None:
    """Until the server has applied every ack (nothing ready or in flight)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        q = await client.get_queue(queue)
        if q.stats.total == 0:
            return
        await asyncio.sleep(0.002)
    raise TimeoutError(f"queue {queue!r} not empty after {timeout_s}s")


async def run_enqueue(args: BenchArgs, target: str, workload: str = "enqueue") -> dict[str, Any]:
    if workload != "echo":
        async with AsyncDoqClient(target, ca_file=args.ca_file) as client:
            await _ensure_queue(client, args)
    stats = Stats()
    args.live.append(stats)
    budget = Budget(args.count, args.duration_s)
    rate = args.rate / args.concurrency if args.rate else 0.0
    t0 = time.perf_counter()
    await asyncio.gather(
        *(_produce(args, target, budget, stats, False, rate) for _ in range(args.concurrency))
    )
    return result_line(args, workload, stats, time.perf_counter() - t0)


async def prefill(args: BenchArgs, target: str, count: int) -> None:
    """Enqueue `count` messages fast (batched frames), without measuring."""
    fill = BenchArgs(**{**args.__dict__, "frames": "batched", "batch": max(args.batch, 100), "rate": 0})
    budget = Budget(count, 0)
    await asyncio.gather(*(_produce(fill, target, budget, Stats(), False, 0) for _ in range(2)))


async def run_dequeue(args: BenchArgs, target: str) -> dict[str, Any]:
    if args.count <= 0:
        raise SystemExit("doq bench: the dequeue workload needs --count (messages to pre-fill)")
    async with AsyncDoqClient(target, ca_file=args.ca_file) as client:
        await _ensure_queue(client, args)
        await prefill(args, target, args.count)
        stats = Stats()
        args.live.append(stats)
        remaining = [args.count]

        def want(n: int) -> int:
            remaining[0] -= n
            return remaining[0]

        stop = asyncio.Event()
        t0 = time.perf_counter()
        workers = [
            asyncio.create_task(_consume(args, target, want, stats, False, stop))
            for _ in range(args.concurrency)
        ]
        await stop.wait()
        await _wait_empty(client, args.queue)
        seconds = time.perf_counter() - t0
        await asyncio.gather(*workers, return_exceptions=True)
    return result_line(args, "dequeue", stats, seconds)


async def run_mixed(args: BenchArgs, target: str) -> dict[str, Any]:
    if args.payload_bytes < 8:
        raise SystemExit("doq bench: the mixed workload needs --payload-bytes >= 8 (timestamp)")
    async with AsyncDoqClient(target, ca_file=args.ca_file) as client:
        await _ensure_queue(client, args)
    produced = Stats()
    consumed = Stats()
    args.live.append(consumed)
    budget = Budget(args.count, args.duration_s)
    stop = asyncio.Event()
    rate = args.rate / args.concurrency if args.rate else 0.0
    t0 = time.perf_counter()
    consumers = [
        asyncio.create_task(_consume(args, target, lambda n: 1, consumed, True, stop))
        for _ in range(args.concurrency)
    ]
    await asyncio.gather(
        *(_produce(args, target, budget, produced, True, rate) for _ in range(args.concurrency))
    )
    deadline = time.monotonic() + 30
    while consumed.messages < produced.messages and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    seconds = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*consumers, return_exceptions=True)
    line = result_line(args, "mixed", consumed, seconds)
    line["enqueue_errors"] = produced.errors
    return line


# -- echo server (the per-frame gRPC ceiling) ---------------------------------------------
_ECHO_SINGLE = pb.EnqueueResponse(success=True, id=123456789, group="", priority=0).SerializeToString()


def _echo_batch_reply(raw: bytes) -> bytes:
    n = len(pb.EnqueueBatchRequest.FromString(raw).messages)
    return pb.EnqueueBatchResponse(
        results=[pb.EnqueueResponse(success=True, id=123456789 + i) for i in range(n)]
    ).SerializeToString()


async def _echo_serve(addr: str) -> None:
    async def single(it: Any, _ctx: Any) -> Any:
        async for _ in it:
            yield _ECHO_SINGLE

    async def batched(it: Any, _ctx: Any) -> Any:
        async for raw in it:
            yield _echo_batch_reply(raw)

    handler = grpc.method_handlers_generic_handler(
        "doq.v1.DOQ",
        {
            "EnqueueStream": grpc.stream_stream_rpc_method_handler(single),
            "EnqueueBatchStream": grpc.stream_stream_rpc_method_handler(batched),
        },
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(addr)
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """Start the echo server as a child process (uvloop if installed, like `doq serve`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "doq.bench.grpc_load", "--echo-serve", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        env={**os.environ},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError("echo server did not start")
        yield f"127.0.0.1:{int(line)}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- entry points -------------------------------------------------------------------------
async def run(args: BenchArgs) -> list[dict[str, Any]]:
    """Run one workload (plus the echo comparison if asked); returns the JSON records."""
    runners: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "enqueue": lambda: run_enqueue(args, args.server),
        "dequeue": lambda: run_dequeue(args, args.server),
        "mixed": lambda: run_mixed(args, args.server),
    }
    if args.workload == "echo":
        with echo_server() as target:
            return [await run_enqueue(args, target, "echo")]
    line = await _with_progress(args, runners[args.workload]())
    if args.with_echo and args.workload == "enqueue":
        with echo_server() as target:
            echo = await run_enqueue(args, target, "echo")
        line["echo_msg_per_s"] = echo["msg_per_s"]
        line["ratio_to_echo"] = round(line["msg_per_s"] / echo["msg_per_s"], 3) if echo["msg_per_s"] else None
        return [line]
    return [line]


async def _with_progress(args: BenchArgs, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`work`, its messages counted on stderr four times a second when `args.show_progress`
    (read from `args.live`: nothing is added to the per-message path)."""
    from doq import progress

    total = args.count or None
    with progress.count_progress(args.workload, total, "messages", enabled=args.show_progress) as advance:
        if not args.show_progress:
            return await work

        async def poll() -> None:
            shown = 0
            while True:
                await asyncio.sleep(0.25)
                done = sum(st.messages for st in args.live)
                advance(done - shown)
                shown = done

        poller = asyncio.create_task(poll())
        try:
            return await work
        finally:
            poller.cancel()


def _install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def run_from_args(ns: argparse.Namespace) -> int:
    """Run `doq bench` with parsed arguments (see `doq.bench.cli`)."""
    fields = BenchArgs.__dataclass_fields__
    args = BenchArgs(**{k: v for k, v in vars(ns).items() if k in fields})
    if args.count <= 0 and args.duration_s <= 0:
        args.count = 10_000 if args.workload != "dequeue" else 10_000
    if args.concurrency < 1 or args.batch < 1:
        print("doq bench: --concurrency and --batch must be >= 1", file=sys.stderr)
        return 2
    if args.workload != "echo":
        from doq.client_cli import grpc_target, grpc_uses_tls
        from doq.errors import DoqError

        try:
            args.server = grpc_target(ns.server)
            args.tls = grpc_uses_tls(ns.server, args.ca_file)
        except DoqError as e:
            print(f"doq bench: {e.message}", file=sys.stderr)
            return 1
    _install_uvloop()
    from doq import progress

    args.show_progress = progress.wanted(ns.json)
    for _ in range(max(1, ns.runs)):
        args.live.clear()
        try:
            lines = asyncio.run(run(args))
        except (DoqClientError, grpc.RpcError) as e:
            print(f"doq bench: gRPC {args.server} (from --server {ns.server}): {e}", file=sys.stderr)
            return 1
        for line in lines:
            print(json.dumps(line) if ns.json else human_line(line), flush=True)
    return 0


def human_line(line: dict[str, Any]) -> str:
    """One run as a sentence (the default output; `--json` prints the record itself)."""
    frames = f"{line['frames']} frames" + (f" of {line['batch']}" if line["batch"] > 1 else "")
    text = (f"{line['workload']}: {line['messages']} messages in {line['seconds']:.2f} s = "
            f"{line['msg_per_s']:,.0f} msg/s ({frames}, {line['concurrency']} streams, "
            f"{line['payload_bytes']} B)")
    if line.get("p50_ms") is not None:
        text += f"; latency p50 {line['p50_ms']} / p90 {line['p90_ms']} / p99 {line['p99_ms']} ms"
    if line.get("errors"):
        text += f"; {line['errors']} errors"
    if line.get("ratio_to_echo") is not None:
        text += f"; {line['ratio_to_echo']:.0%} of the echo ceiling ({line['echo_msg_per_s']:,.0f}/s)"
    return text


def _main() -> int:
    p = argparse.ArgumentParser(prog="doq-bench")
    p.add_argument("--echo-serve", metavar="HOST:PORT", help=argparse.SUPPRESS)
    add_arguments(p)
    ns = p.parse_args()
    if ns.echo_serve:
        _install_uvloop()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_echo_serve(ns.echo_serve))
        return 0
    return run_from_args(ns)


if __name__ == "__main__":
    sys.exit(_main())
