"""Where the end-to-end time goes: per-stage timestamps of the side-by-side e2e run.

`python bench/e2e_stages.py [--count N] [--rate R] [--runs K]` starts a fresh `doq serve`
and the e2e consumer and producer of `bench/side_by_side.py` (a producer paced at R msg/s
with `c.producer()`, a consumer in another process acking each message), every process
started with probes (`install`) that stamp each message at each stage of its path, keyed
by the send time it carries (the machine's monotonic clock, shared by the processes):

- `p_take`: producer, the message is taken into a frame (by the stream's sender thread);
- `s_recv`: server, its frame is read (gRPC handler, event loop);
- `s_prop`: server, the Raft driver takes its proposal into a Ready;
- `s_write` / `s_written`: server, the writer thread starts / ends that Ready's
  transaction (apply and commit with fsync);
- `s_back`: server, the event loop resumes after that write;
- `s_leased`: server, the dequeue that leased it gets its result;
- `s_frame`: server, its dequeue frame is built;
- `c_recv`: consumer, the frame is received.

The server's garbage collections (`gc.callbacks`) while messages were sent are counted
and timed per generation.

It prints, per run, the distribution of each step, the writes (commits) and the commands
they carried (`RaftSnapshot`: the node's own snapshot recorded; `RaftCompact`: log
entries discarded), the longest writes, and how many messages were leased by the commit
that stored them. The stamps come through supported hooks, the server's
(`doq.node.stages.observer`) and the client's (`doq_client.stages.observer`), both None
unless a tool sets them: no probe wraps a private function. Probes cost a few µs per
message.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import collections
import gc
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

_TS = struct.Struct("<q")
ORDER = ("p_take", "s_recv", "s_prop", "s_write", "s_written", "s_back", "s_leased", "s_frame", "c_recv")
ENV = "DOQ_E2E_STAGES"  # where a probed process writes its stamps: <prefix>-<pid>.json
BOOT = ("import runpy, sys\nfrom bench import e2e_stages\ne2e_stages.install()\n"
        "mod = sys.argv[1]\nsys.argv = [mod, *sys.argv[2:]]\n"
        "runpy.run_module(mod, run_name='__main__', alter_sys=True)\n")


# -- probes (in the measured processes) -----------------------------------------------------
def install() -> None:
    """Wrap the functions of the path with stamps; write them at exit and on SIGUSR1."""
    stamps: list[tuple[str, int, int]] = []
    writes: list[tuple[int, int, list[str]]] = []
    collections: list[tuple[int, int, int]] = []  # (generation, start, end) of each GC run
    now = time.monotonic_ns
    gc_start = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = now()
        else:
            collections.append((info["generation"], gc_start[0], now()))

    gc.callbacks.append(on_gc)

    def rec(stage: str, contents: Any) -> None:
        t = now()
        for c in contents:
            if len(c) >= 8:
                stamps.append((stage, _TS.unpack_from(c)[0], t))

    def dump(*_: object) -> None:
        with open(f"{os.environ[ENV]}-{os.getpid()}.json", "w") as f:
            json.dump({"stamps": stamps, "writes": writes, "gc": collections}, f)

    atexit.register(dump)
    signal.signal(signal.SIGUSR1, dump)

    from doq_client import stages as client_stages

    class ClientObserver:
        """The clients' stamps, through the client's supported hook (`doq_client.stages`)."""

        def frame_taken(self, contents: Any) -> None:
            rec("p_take", contents)

        def frame_received(self, messages: Any) -> None:
            rec("c_recv", [m.content for m in messages])

    client_stages.observer = ClientObserver()

    from doq.node import stages
    from doq.queues.commands import EnqueueColumns

    class Observer:
        """The server's stamps, through the node's supported hook (`doq.node.stages`)."""

        def __init__(self) -> None:
            self.job_contents: dict[int, list[bytes]] = {}
            self.started: dict[int, int] = {}
            self.kinds: dict[int, list[str]] = {}

        def frame_received(self, contents: Any) -> None:
            rec("s_recv", contents)  # a columns frame as the server receives it

        def proposed(self, commands: Any) -> None:
            rec("s_prop", [c for cmd in commands if isinstance(cmd, EnqueueColumns) for c in cmd.contents])

        def write_started(self, write_id: int, commands: Any) -> None:
            contents = [c for cmd in commands if isinstance(cmd, EnqueueColumns) for c in cmd.contents]
            self.started[write_id] = now()
            self.job_contents[write_id] = contents
            rec("s_write", contents)
            self.kinds[write_id] = [type(cmd).__name__ for cmd in commands]

        def write_ended(self, write_id: int, notes: Any) -> None:
            rec("s_written", self.job_contents.get(write_id, []))
            writes.append((self.started.pop(write_id, now()), now(), [*self.kinds.pop(write_id, []), *notes]))

        def back_on_loop(self, write_id: int) -> None:
            rec("s_back", self.job_contents.pop(write_id, []))

        def resolved(self, results: Any) -> None:
            for res in results:
                for r in res:
                    if isinstance(r, list):
                        rec("s_leased", [m.content for m in r if hasattr(m, "content")])

        def frame_built(self, messages: Any) -> None:
            rec("s_frame", [m.content for m in messages])

    stages.observer = Observer()


# -- the run and its report ---------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else float("nan")


def report(prefix: str) -> dict[str, Any]:
    """Read the stamps of every process of one run (`prefix`-*.json): the step table."""
    at: dict[int, dict[str, int]] = collections.defaultdict(dict)
    writes: list[tuple[int, int, list[str]]] = []
    server_gc: list[tuple[int, int, int]] = []
    for f in Path(prefix).parent.glob(Path(prefix).name + "-*.json"):
        d = json.loads(f.read_text())
        for stage, key, t in d["stamps"]:
            at[key].setdefault(stage, t)  # the first time (a released message comes again)
        writes += [tuple(w) for w in d["writes"]]  # type: ignore[misc]
        if d["writes"]:  # the server's file (the only process that writes)
            server_gc = [tuple(g) for g in d.get("gc", ())]  # type: ignore[misc]
    full = [k for k, st in at.items() if all(s in st for s in ORDER)]
    steps = []
    last = None
    for s in ORDER:
        ds = [(at[k][s] - (at[k][last] if last else k)) / 1e6 for k in full]
        steps.append({"step": f"{last or 'enqueue'} -> {s}", "p50_ms": round(_pct(ds, 50), 3),
                      "p90_ms": round(_pct(ds, 90), 3), "p99_ms": round(_pct(ds, 99), 3)})
        last = s
    total = [(at[k]["c_recv"] - k) / 1e6 for k in full]
    writes.sort()
    starts = [w[0] for w in writes]
    same = 0  # leased before the next write began: by the commit that stored it
    for k in full:
        i = bisect.bisect_right(starts, at[k]["s_write"])
        same += at[k]["s_leased"] < (starts[i] if i < len(starts) else float("inf"))
    span_s = (writes[-1][1] - writes[0][0]) / 1e9 if writes else 0.0
    snaps = [(a, b) for a, b, k in writes if "RaftSnapshot" in k]  # sent 0.5 s before to 0.1 s after
    near_snapshot = [(at[k]["c_recv"] - k) / 1e6 for k in full
                     if any(a - 500_000_000 <= k <= b + 100_000_000 for a, b in snaps)]
    kinds = collections.Counter("+".join(sorted(set(w[2]))) or "-" for w in writes)
    return {
        "messages": len(full), "steps": steps,
        "total": {"p50_ms": round(_pct(total, 50), 3), "p90_ms": round(_pct(total, 90), 3),
                  "p99_ms": round(_pct(total, 99), 3)},
        "leased_by_their_own_commit": same,
        "writes": len(writes), "writes_per_s": round(len(writes) / span_s) if span_s else None,
        "write_ms": {"p50": round(_pct([(b - a) / 1e6 for a, b, _ in writes], 50), 3),
                     "p99": round(_pct([(b - a) / 1e6 for a, b, _ in writes], 99), 3)},
        "writer_busy": round(sum(b - a for a, b, _ in writes) / 1e9 / span_s, 2) if span_s else None,
        "write_kinds": dict(kinds.most_common(6)),
        "longest_writes": [(round((b - a) / 1e6, 1), "+".join(sorted(set(k))))
                           for a, b, k in sorted(writes, key=lambda w: w[0] - w[1])[:3]],
        "slower_than_8_ms": sum(1 for t in total if t > 8),
        "raft_writes_ms": {kind: _spread([(b - a) / 1e6 for a, b, k in writes if kind in k])
                           for kind in ("RaftSnapshot", "RaftCompact")},
        "near_snapshot_ms": _spread(near_snapshot, with_p99=True),
        "server_gc": _gc_report(server_gc, (min(at_k for at_k in at), max(at_k for at_k in at)) if at else (0, 0)),
    }


def _spread(ms: list[float], with_p99: bool = False) -> dict[str, Any]:
    """Count, p50 (p99) and max of some durations (ms)."""
    out = {"count": len(ms), "p50": round(_pct(ms, 50), 3) if ms else None,
           "max": round(max(ms), 3) if ms else None}
    if with_p99:
        out["p99"] = round(_pct(ms, 99), 3) if ms else None
    return out


def _gc_report(runs: list[tuple[int, int, int]], span: tuple[int, int]) -> dict[str, Any]:
    """The server's garbage collections while messages were sent: count and pause
    (p50 / max, ms) per generation."""
    out: dict[str, Any] = {}
    for gen in (0, 1, 2):
        ms = sorted((b - a) / 1e6 for g, a, b in runs if g == gen and span[0] <= a <= span[1])
        out[f"gen{gen}"] = {"count": len(ms), "p50_ms": round(_pct(ms, 50), 3) if ms else None,
                            "max_ms": round(ms[-1], 3) if ms else None}
    return out


def run_once(tmp: Path, n: int, count: int, rate: float) -> dict[str, Any]:
    """One probed e2e run on a fresh server; its report."""
    from bench import side_by_side as sbs

    prefix = str(tmp / f"stamps-{n}")
    env = {**sbs.child_env(), ENV: prefix}
    boot = [sys.executable, "-c", BOOT]
    args = sbs.Args(e2e_count=count, rate=rate)
    saved = dict(os.environ)
    os.environ.update(env)  # the server inherits it
    try:
        with sbs.doq_server(tmp / f"doq-{n}", launcher=(*boot, "doq")) as server:
            queue = "stages"
            sbs._doq_queue(server.addr, queue)

            def child(workload: str) -> list[str]:
                cmd = sbs._child_cmd("doq", workload, server.addr, queue, count, args)
                return [*boot, "bench.side_by_side", *cmd[3:]]

            cons = subprocess.Popen(child("e2e-consumer"), stdout=subprocess.PIPE, text=True, env=env)
            try:
                assert cons.stdout is not None
                if cons.stdout.readline().strip() != "ready":
                    raise RuntimeError("the e2e consumer did not start")
                time.sleep(0.5)
                subprocess.run(child("e2e-producer"), check=True, env=env, capture_output=True)
                line = cons.stdout.readline()
                cons.wait(60)
            finally:
                if cons.poll() is None:
                    cons.kill()
                    cons.wait()
            os.kill(server.pids[0], signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not list(tmp.glob(f"stamps-{n}-{server.pids[0]}.json")) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = report(prefix)
    out["measured"] = json.loads(line)
    out["loadavg"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="e2e_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=5000, help="messages per run")
    p.add_argument("--rate", type=float, default=1000.0, help="producer rate, msg/s")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="also write the reports here")
    ns = p.parse_args(argv)
    reports = []
    with tempfile.TemporaryDirectory(prefix="doq-stages-") as tmp:
        for n in range(ns.runs):
            r = run_once(Path(tmp), n, ns.count, ns.rate)
            reports.append(r)
            print(f"run {n + 1}: load {r['loadavg']:.2f}, {r['messages']} messages, "
                  f"{r['leased_by_their_own_commit']} leased by their own commit; "
                  f"{r['writes']} writes ({r['writes_per_s']}/s, {r['write_ms']['p50']} ms p50, "
                  f"writer busy {r['writer_busy']}): {r['write_kinds']}; longest writes (ms): "
                  f"{r['longest_writes']}; messages slower than 8 ms: {r['slower_than_8_ms']}; "
                  f"Raft snapshot / compaction writes (ms): {r['raft_writes_ms']}; messages sent "
                  f"0.5 s before to 0.1 s after a snapshot write (ms): {r['near_snapshot_ms']}; "
                  f"server GC while sending: {r['server_gc']}")
            print("| step | p50 ms | p90 ms | p99 ms |\n| --- | --- | --- | --- |")
            for s in [*r["steps"], {"step": "**total**", **r["total"]}]:
                print(f"| {s['step']} | {s['p50_ms']} | {s['p90_ms']} | {s['p99_ms']} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
