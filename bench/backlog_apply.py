"""The storage cost of draining a large backlog, without the server: StateStore on LMDB.

`python bench/backlog_apply.py --messages 1000000 --drain 50000` fills one queue per
kind (`bench/backlog.py`'s kinds) to `--messages` (EnqueueColumns entries of 1000
messages, ten entries per durable commit), then drains `--drain` messages as a consumer
acking each one does on a busy server: every durable commit applies one entry with the
Ack of the previous `--batch` deliveries and a Dequeue of the next `--batch`. Prints, per
kind: fill and drain msg/s, the ratio to `plain`, CPU per message of the fill and the drain
(`time.process_time`: steadier than msg/s on a shared machine; of the drain also the system
part and the minor page faults), bytes this process wrote to disk per drained message
(`/proc/self/io`), the mean and longest commit time of the drain (and, in CPU time, its
longest `apply_entries` with the keys its sweep handled, its longest GC pause and the GC CPU
per drained message), and the load average;
with `--restart`, the seconds (wall and CPU) a fresh process takes to open the store (the
rebuild of a restart) and its RSS per queued message; with `--py-spy PREFIX`, each kind's
drain profiled by py-spy (200 Hz, raw; `--py-spy-args` for more options) into PREFIX-KIND-drain.txt;
with `--keep DIR`, each kind's filled store is kept in DIR/KIND-N and a later run with the same DIR
and N drains a copy of it (opened as a restart does: the index rebuilt) instead of filling again.
Runs the code on `sys.path`, so the same command measures two checkouts back to back.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from bench.backlog import KINDS, _py_spy, loadavg, messages
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore


def _written() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def run_kind(kind: str, n: int, m: int, batch: int, per_group: int, root: Path,
             restart: bool = False, profile: str | None = None, keep: Path | None = None,
             spy_args: tuple[str, ...] = ()) -> dict[str, Any]:
    if kind == "timestamps":
        m = min(m, n // 2)  # the due half
    kept = keep / f"{kind}-{n}" if keep else None
    if kept and kept.exists():  # a filled store kept by an earlier run: drain a copy of it
        subprocess.run(["cp", "-a", str(kept), str(root / kind)], check=True)
    env = open_env(root / kind, map_size=1 << 34)
    st = StateStore(env)
    now = int(time.time() * 1000)
    idx = 0
    longest_apply = [0.0, 0]  # the drain's longest apply_entries (s) and its sweep's keys
    gc_pause = [0.0, 0.0, 0.0, 0.0]  # start of the collection under way, the longest pause, all pauses (s), collections

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_pause[0] = time.process_time()
        else:
            pause = time.process_time() - gc_pause[0]
            gc_pause[1] = max(gc_pause[1], pause)
            gc_pause[2] += pause
            gc_pause[3] += 1

    def commit(*entries: list[Any]) -> list[list[object]]:
        nonlocal idx
        ents = []
        for cmds in entries:
            idx += 1
            ents.append((idx, encode_batch(c.CommandBatch(now, cmds))))
        with st.write() as txn:
            t = time.process_time()  # CPU: a wall time is the machine's load on a shared machine
            out = st.apply_entries(txn, ents)
            t = time.process_time() - t
            if t > longest_apply[0]:
                longest_apply[:] = [t, getattr(st, "sweep_keys", -1)]
            return out

    qtype = "fair" if kind.startswith("fair") else "delayed"
    fill_s = fill_cpu_s = float("nan")  # a kept store's fill is not measured again
    if st.applied_index:
        idx = st.applied_index
    else:
        commit([c.CreateQueue("q", qtype, QueueSettings())])
        body = b"x" * 100
        items = list(messages(kind, n, per_group))
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(0, n, 10_000):
            chunk = [items[j : j + 1000] for j in range(i, min(i + 10_000, n), 1000)]
            commit(*[[c.EnqueueColumns("q", [body] * len(part), groups=[g for _, g in part] if qtype == "fair" else [],
                                       priorities=[p for p, _ in part] if kind != "plain" and qtype != "fair" else [])]
                     for part in chunk])
        fill_s = time.perf_counter() - t0
        fill_cpu_s = time.process_time() - cpu0
        if kept:  # every commit was durable: the files are a consistent store
            kept.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", str(root / kind), str(kept)], check=True)
    w0 = _written()
    longest_apply[:] = [0.0, 0]
    gc.freeze()  # as a server does once started: the fill's objects (here the bench's message list) out of full collections
    gc.callbacks.append(on_gc)
    spy = _py_spy(os.getpid(), f"{profile}-{kind}-drain.txt" if profile else None, spy_args)
    spy.__enter__()  # noqa: PLC2801 (the drain's span, not a block's)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    commit_s = 0.0
    commits = 0
    longest_s = 0.0
    prev: tuple[list[int], list[int]] = ([], [])
    taken = 0
    while taken < m:
        cmds: list[c.Command] = [c.Dequeue("q", min(batch, m - taken), visibility_timeout_ms=60_000)]
        if prev[0]:
            cmds.insert(0, c.Ack("q", prev[0], prev[1]))
        t1 = time.perf_counter()
        out = commit(cmds)[0]
        commit_s += time.perf_counter() - t1
        longest_s = max(longest_s, time.perf_counter() - t1)
        commits += 1
        views = out[-1]
        assert isinstance(views, list) and views, out
        prev = ([v.id for v in views], [v.lease_id for v in views])
        taken += len(views)
    commit(*[[c.Ack("q", prev[0], prev[1])]])
    drain_s = time.perf_counter() - t0
    drain_cpu_s = time.process_time() - cpu0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    spy.__exit__(None, None, None)
    gc.callbacks.remove(on_gc)
    gc.unfreeze()
    written = _written() - w0
    env.close()
    rec = {"kind": kind, "messages": n, "drained": m, "fill_msg_per_s": n / fill_s,
           "drain_msg_per_s": m / drain_s, "drain_cpu_us_per_msg": drain_cpu_s / m * 1e6,
           "fill_cpu_us_per_msg": fill_cpu_s / n * 1e6, "drain_write_bytes_per_msg": written / m,
           "drain_commit_ms": commit_s / commits * 1e3, "drain_longest_commit_ms": longest_s * 1e3,
           "drain_longest_apply_cpu_ms": longest_apply[0] * 1e3, "drain_longest_apply_sweep_keys": longest_apply[1],
           "drain_longest_gc_cpu_ms": gc_pause[1] * 1e3, "drain_gc_cpu_us_per_msg": gc_pause[2] / m * 1e6,
           "drain_gc_collections": int(gc_pause[3]),
           "drain_sys_us_per_msg": (ru1.ru_stime - ru0.ru_stime) / m * 1e6,
           "drain_minflt_per_msg": (ru1.ru_minflt - ru0.ru_minflt) / m, "load": loadavg()}
    if restart:
        rec.update(_reopen(root / kind, n - m))
    return rec


_REOPEN = """
import json, sys, time
from doq.storage.env import open_env
from doq.storage.state import StateStore
def kb(f):
    for line in open("/proc/self/status"):
        if line.startswith(f + ":"):
            return int(line.split()[1])
a0, f0 = kb("RssAnon"), kb("RssFile")
t0, c0 = time.perf_counter(), time.process_time()
st = StateStore(open_env(sys.argv[1], map_size=1 << 34))
s, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps([s, (kb("RssAnon") - a0) * 1024, (kb("RssFile") - f0) * 1024, cpu]))
"""


def _reopen(path: Path, left: int) -> dict[str, float]:
    """A fresh process opens the store (the rebuild of a restart): seconds, and its RSS
    (anonymous, mapped file) per queued message."""
    out = subprocess.run([sys.executable, "-c", _REOPEN, str(path)], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    s, anon, file, cpu = json.loads(out)
    return {"restart_s": s, "restart_cpu_s": cpu, "restart_rss_anon_bytes_per_msg": anon / left,
            "restart_rss_file_bytes_per_msg": file / left}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="backlog_apply", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--drain", type=int, default=50_000)
    p.add_argument("--batch", type=int, default=100, help="deliveries (and acks) per commit")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--per-group", type=int, default=100)
    p.add_argument("--dir", help="where the temp dirs go (default: the system's)")
    p.add_argument("--restart", action="store_true",
                   help="then time a fresh process opening the store (rebuild) and its RSS per message")
    p.add_argument("--keep", metavar="DIR",
                   help="keep each kind's filled store in DIR/KIND-N (copied there after the fill); a later run "
                        "with the same DIR and N drains a copy of it instead of filling (fill figures: nan)")
    p.add_argument("--py-spy-args", default="",
                   help="more py-spy record options, e.g. '--rate 500 --native' (default: 200 Hz)")
    p.add_argument("--py-spy", metavar="PREFIX",
                   help="profile each kind's drain with py-spy (200 Hz, raw) into PREFIX-KIND-drain.txt")
    ns = p.parse_args(argv)
    print(f"backlog {ns.messages}, drain {ns.drain}, load average {loadavg()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="doq-backlog-apply-", dir=ns.dir) as tmp:
        for kind in ns.kinds.split(","):
            runs.append(run_kind(kind, ns.messages, ns.drain, ns.batch, ns.per_group, Path(tmp), ns.restart, ns.py_spy,
                                 Path(ns.keep) if ns.keep else None, tuple(ns.py_spy_args.split())))
            print(json.dumps(runs[-1]), flush=True)
    plain = next((r for r in runs if r["kind"] == "plain"), None)
    for r in runs:
        ratio = r["drain_msg_per_s"] / plain["drain_msg_per_s"] if plain else float("nan")
        print(f"{r['kind']:>16}: fill {r['fill_msg_per_s'] / 1e3:.1f}k/s, drain {r['drain_msg_per_s'] / 1e3:.1f}k/s "
              f"({ratio:.2f} of plain), {r['drain_write_bytes_per_msg'] / 1e3:.1f} KB written and "
              f"{r['drain_commit_ms']:.1f} ms per commit (longest {r['drain_longest_commit_ms']:.0f} ms)"
              + (f"; restart {r['restart_s']:.1f} s ({r['restart_cpu_s']:.1f} s CPU), RSS {r['restart_rss_anon_bytes_per_msg']:.0f} B anon + "
                 f"{r['restart_rss_file_bytes_per_msg']:.0f} B file per message" if "restart_s" in r else ""))
    print(f"load average after {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
