"""Fill and drain cost of each queue kind with a large backlog, clients as users write them.

`python bench/backlog.py --messages 1000000 --drain 100000` runs, for each kind, a fresh
`doq serve` (one node, durable) in a temp dir, fills one queue to `--messages` with a
producer as users write it (`p = c.producer(); p.enqueue(q, body, priority=...,
group=...)` per message, every future's result read), then drains `--drain` messages
with a consumer acking each (`for m in c.consumer(q, prefetch=1000): cons.ack(m)`), and
stops the server. Kinds:

- `plain`: a delayed queue, priority 0 (the reference: delivery order = id order);
- `random`: a delayed queue, random priorities in 0..1e9-1;
- `timestamps`: a delayed queue whose priorities are Unix timestamps (seconds), half in
  the past (due, delivered in timestamp order), half an hour or more in the future;
  the drain takes only due ones (`--drain` is capped at half the backlog);
- `fair-blocks`: a fair queue, `--per-group` messages per group, each group filled as a
  block (all of group 0, then group 1, ...): round-robin delivery jumps between blocks;
- `fair-interleaved`: a fair queue, the same groups filled round-robin.

Per kind it prints: fill and drain msg/s, and their ratio to `plain` of the same run;
the server's CPU per filled and per drained message (steadier than msg/s on a shared machine);
server RSS per queued message after the fill, less the fresh server's (anonymous memory and mapped file pages
apart: `/proc/PID/status` RssAnon, RssFile), bytes the server wrote to disk per message
(`/proc/PID/io` write_bytes) during the fill and the drain, and the load average before
and after; then restarts the server on the same data (the backlog less the drained
messages) and prints the seconds until it is ready (and the CPU seconds it used: steadier on a
shared machine) and its RSS per queued message. 100-byte messages unless `--payload-bytes`. `--json FILE` writes the record.
`--py-spy PREFIX` records the server with py-spy (200 Hz, raw) during each kind's fill and drain
apart, into `PREFIX-KIND-fill.txt` and `PREFIX-KIND-drain.txt`.
Of the fill it also prints where the CPU went: the producer's (this process: the client and the
messages' generation, `time.process_time`; of it the cyclic GC's) and the server's per thread kind (`loop`, `grpc`,
`other`: `bench/quorum_cpu.py`'s split) per message, and the messages per applied command (a
columns frame) and per durable write (the server's `/metrics`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from bench.quorum_cpu import thread_cpu_s
from bench.side_by_side import _doq, doq_server

RESTART_TIMEOUT_S = 900.0  # the restart step's wait for /readyz: a measurement, not a limit

KINDS = ("plain", "random", "timestamps", "fair-blocks", "fair-interleaved")
PREFETCH = 1000
WINDOW = 1024


def _proc_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process used so far (0 if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _write_bytes(pid: int) -> int:
    """Bytes the process caused to be written to storage so far (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _counters(http_url: str) -> dict[str, float]:
    """The server's commands applied and durable writes (with commands) so far (`/metrics`)."""
    import re
    import urllib.request

    try:
        with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for name in ("doq_commands_applied_total", "doq_batches_committed_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def messages(kind: str, n: int, per_group: int, seed: int = 1) -> Iterator[tuple[int, str]]:
    """(priority, group) of the `n` messages of `kind`, in fill order."""
    rnd = random.Random(seed)
    if kind == "plain":
        for _ in range(n):
            yield 0, ""
    elif kind == "random":
        for _ in range(n):
            yield rnd.randrange(1_000_000_000), ""
    elif kind == "timestamps":
        now_s = int(time.time())
        for i in range(n):
            if i % 2:
                yield now_s + 3600 + rnd.randrange(86_400), ""
            else:
                yield now_s - 1 - rnd.randrange(86_400), ""
    elif kind == "fair-blocks":
        for i in range(n):
            yield 0, f"g{i // per_group:07d}"
    elif kind == "fair-interleaved":
        groups = max(1, n // per_group)
        for i in range(n):
            yield 0, f"g{i % groups:07d}"
    else:
        raise ValueError(f"unknown kind {kind!r}")


class _GcClock:
    """CPU seconds this process spent in the cyclic GC (any thread) while installed, and
    the collections of each generation (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.cpu_s += time.thread_time() - self._t0
            self.collections[info["generation"]] += 1

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def fill(addr: str, queue: str, kind: str, n: int, per_group: int, payload: int) -> float:
    """Seconds to enqueue the `n` messages of `kind`, one `enqueue` each, all confirmed."""
    body = b"x" * payload
    with _doq(addr) as c:
        c.create_queue(queue, "fair" if kind.startswith("fair") else "delayed")
        p = c.producer(window=WINDOW)
        t0 = time.perf_counter()
        pending = []
        for prio, group in messages(kind, n, per_group):
            pending.append(p.enqueue(queue, body, priority=prio, group=group))
            if len(pending) >= 10_000:
                for f in pending:
                    f.result()
                pending.clear()
        for f in pending:
            f.result()
        seconds = time.perf_counter() - t0
        p.close()
    return seconds


def drain(addr: str, queue: str, count: int) -> float:
    """Seconds to take and ack `count` messages, one `ack` each, until the server has them."""
    with _doq(addr) as c:
        before = c.get_queue(queue).stats.total
        n = 0
        t0 = time.perf_counter()
        cons = c.consumer(queue, prefetch=PREFETCH)
        for m in cons:
            cons.ack(m)
            n += 1
            if n == count:
                break
        cons.close()
        deadline = time.monotonic() + 120
        while c.get_queue(queue).stats.total > before - count and time.monotonic() < deadline:
            time.sleep(0.001)
        return time.perf_counter() - t0


@contextlib.contextmanager
def _py_spy(pid: int, out: str | None, extra: tuple[str, ...] = ()) -> Iterator[None]:
    """`py-spy record` of the server `pid` into `out` (raw, 200 Hz unless `extra` says otherwise:
    more `py-spy record` options) while the block runs (nothing if `out` is None)."""
    if out is None:
        yield
        return
    import signal
    import subprocess

    spy = str(Path(sys.executable).with_name("py-spy"))
    rate = () if "--rate" in extra else ("--rate", "200")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), *rate, *extra, "--format", "raw", "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # let it attach
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait()


def run_kind(kind: str, n: int, m: int, per_group: int, payload: int, root: Path,
             profile: str | None = None, spy_args: tuple[str, ...] = ()) -> dict[str, Any]:
    queue = "bench"
    if kind == "timestamps":
        m = min(m, n // 2)
    with doq_server(root / kind) as server:
        pid = server.pids[0]
        rss0, anon0, file0 = (_proc_kb(pid, f) for f in ("VmRSS", "RssAnon", "RssFile"))
        w0 = _write_bytes(pid)
        cpu0 = _cpu_s(pid)
        threads0, counters0 = thread_cpu_s(pid), _counters(server.http_url)
        client0 = time.process_time()
        with _py_spy(pid, f"{profile}-{kind}-fill.txt" if profile else None, spy_args), _GcClock() as gc_clock:
            fill_s = fill(server.addr, queue, kind, n, per_group, payload)
        client_cpu_s = time.process_time() - client0  # this process: the producer (and the generator)
        fill_cpu_s = _cpu_s(pid) - cpu0  # the server's, until the last confirmation
        threads1, counters1 = thread_cpu_s(pid), _counters(server.http_url)
        time.sleep(1.0)  # let the last commits land before reading memory
        w1 = _write_bytes(pid)
        rss1, anon1, file1 = (_proc_kb(pid, f) for f in ("VmRSS", "RssAnon", "RssFile"))
        cpu1 = _cpu_s(pid)
        with _py_spy(pid, f"{profile}-{kind}-drain.txt" if profile else None, spy_args):
            drain_s = drain(server.addr, queue, m)
        drain_cpu_s = _cpu_s(pid) - cpu1  # the server's, until it holds every ack
        w2 = _write_bytes(pid)
    t0 = time.perf_counter()
    # the same data dir: a restart (at 5M on a loaded machine it can take minutes)
    with doq_server(root / kind, ready_timeout_s=RESTART_TIMEOUT_S) as server:
        restart_s = time.perf_counter() - t0
        time.sleep(1.0)  # as after the fill: what the start does once ready (a release of its pages) lands
        rss2, anon2, file2 = (_proc_kb(server.pids[0], f) for f in ("VmRSS", "RssAnon", "RssFile"))
        restart_cpu_s = _cpu_s(server.pids[0])
    left = n - m
    rec = {
        "kind": kind, "messages": n, "drained": m,
        "fill_msg_per_s": n / fill_s, "drain_msg_per_s": m / drain_s,
        "fill_server_cpu_us_per_msg": fill_cpu_s / n * 1e6,
        "fill_client_cpu_us_per_msg": client_cpu_s / n * 1e6,
        "fill_client_gc_us_per_msg": gc_clock.cpu_s / n * 1e6, "fill_client_gc_collections": gc_clock.collections,
        "fill_thread_cpu_us_per_msg": {k: (v - threads0.get(k, 0.0)) / n * 1e6 for k, v in threads1.items()},
        "fill_msgs_per_command": n / max(counters1.get("doq_commands_applied_total", 0.0)
                                         - counters0.get("doq_commands_applied_total", 0.0), 1.0),
        "fill_msgs_per_write": n / max(counters1.get("doq_batches_committed_total", 0.0)
                                       - counters0.get("doq_batches_committed_total", 0.0), 1.0),
        "drain_server_cpu_us_per_msg": drain_cpu_s / m * 1e6,
        "rss_bytes_per_msg": (rss1 - rss0) * 1024 / n,
        "rss_anon_bytes_per_msg": (anon1 - anon0) * 1024 / n,
        "rss_file_bytes_per_msg": (file1 - file0) * 1024 / n,
        "fill_write_bytes_per_msg": (w1 - w0) / n, "drain_write_bytes_per_msg": (w2 - w1) / m,
        "restart_s": restart_s, "restart_rss_anon_bytes_per_msg": (anon2 - anon0) * 1024 / max(left, 1),
        "restart_rss_file_bytes_per_msg": (file2 - file0) * 1024 / max(left, 1),
        "restart_cpu_s": restart_cpu_s,
    }
    return rec


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="backlog", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000, help="backlog to fill (N)")
    p.add_argument("--drain", type=int, default=50_000, help="messages to drain (M)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma separated, of {', '.join(KINDS)}")
    p.add_argument("--per-group", type=int, default=100, help="fair queues: messages per group")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--json", metavar="FILE", help="also write the record here")
    p.add_argument("--keep", metavar="DIR", type=Path,
                   help="fill under DIR/KIND and keep the data dirs (for `bench/restart_time.py DIR/KIND`)")
    p.add_argument("--py-spy", metavar="PREFIX",
                   help="profile the server's fill and drain with py-spy into PREFIX-KIND-{fill,drain}.txt (raw)")
    p.add_argument("--py-spy-args", default="",
                   help="more py-spy record options, e.g. '--rate 500 --native' (default: 200 Hz)")
    ns = p.parse_args(argv)
    kinds = [k for k in ns.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            p.error(f"unknown kind {k!r}")
    record: dict[str, Any] = {"messages": ns.messages, "drain": ns.drain, "load_before": loadavg(), "runs": []}
    print(f"backlog {ns.messages}, drain {ns.drain}, load average {record['load_before']}", flush=True)
    with contextlib.ExitStack() as stack:
        tmp = ns.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="doq-backlog-")))
        for kind in kinds:
            rec = run_kind(kind, ns.messages, ns.drain, ns.per_group, ns.payload_bytes, tmp, ns.py_spy,
                           tuple(ns.py_spy_args.split()))
            rec["load_after"] = loadavg()
            record["runs"].append(rec)
            print(json.dumps(rec), flush=True)
    record["load_after"] = loadavg()
    plain = next((r for r in record["runs"] if r["kind"] == "plain"), None)
    print("\n| kind | fill msg/s | vs plain | drain msg/s | vs plain | RSS B/msg (anon, file) "
          "| written B/msg fill / drain | restart s |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in record["runs"]:
        fr = r["fill_msg_per_s"] / plain["fill_msg_per_s"] if plain else float("nan")
        dr = r["drain_msg_per_s"] / plain["drain_msg_per_s"] if plain else float("nan")
        print(f"| {r['kind']} | {r['fill_msg_per_s'] / 1e3:.1f}k | {fr:.2f} | {r['drain_msg_per_s'] / 1e3:.1f}k "
              f"| {dr:.2f} | {r['rss_bytes_per_msg']:.0f} ({r['rss_anon_bytes_per_msg']:.0f}, "
              f"{r['rss_file_bytes_per_msg']:.0f}) | {r['fill_write_bytes_per_msg']:.0f} / "
              f"{r['drain_write_bytes_per_msg']:.0f} | {r['restart_s']:.1f} ({r['restart_cpu_s']:.1f} CPU) |")
    print("server CPU per filled message: " + ", ".join(
        f"{r['kind']} {r['fill_server_cpu_us_per_msg']:.1f} µs" for r in record["runs"]))
    print("fill, µs of CPU per message: " + "; ".join(
        f"{r['kind']}: client {r['fill_client_cpu_us_per_msg']:.1f} (GC {r['fill_client_gc_us_per_msg']:.1f}), server "
        + " ".join(f"{k} {v:.1f}" for k, v in sorted(r["fill_thread_cpu_us_per_msg"].items()))
        + f"; {r['fill_msgs_per_command']:.0f} msgs a command, {r['fill_msgs_per_write']:.0f} a write"
        for r in record["runs"]))
    print("server CPU per drained message: " + ", ".join(
        f"{r['kind']} {r['drain_server_cpu_us_per_msg']:.1f} µs" for r in record["runs"]))
    print(f"load average before {record['load_before']}, after {record['load_after']}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
