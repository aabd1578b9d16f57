"""Time one restart of `doq serve` on an existing data dir, as `bench/backlog.py` restarts.

`python bench/restart_time.py ROOT [--checkout DIR]` starts `doq serve` (one node) on
`ROOT/data` with the code of `--checkout` (default: this checkout), waits until `/readyz`
answers, reads the server's CPU seconds (`/proc/PID/stat`, user and system; its reaped
children's apart: a start's load worker) and, a second
later, its RSS (`/proc/PID/status` RssAnon, RssFile), stops it with SIGTERM and prints one
JSON line with the wall seconds to ready and the load average before and after. The
largest RssAnon seen while it started (`peak_rss_anon_mb`, read every 50 ms) is what a
container's memory limit must hold besides the page cache (docs/deploy.md, "Sizing a
node's memory"). Alternate
two checkouts on the same dir (A B B A) to compare them; the first run on a dir whose data
file left the page cache reads it from disk (more system CPU, much more wall).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user + system, user) CPU seconds the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck, int(fields[11]) / tck


def _children_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process's children it reaped so far (a start's
    load worker, `doq.storage.load_worker`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _rss_kb(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {ln.split(":")[0]: int(ln.split()[1]) for ln in f if ln.startswith(("RssAnon", "RssFile"))}


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="restart_time", description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="the dir holding `data/` (as bench/backlog.py leaves it)")
    p.add_argument("--checkout", type=Path, default=ROOT, help="the doq checkout to run")
    p.add_argument("--timeout-s", type=float, default=600)
    ns = p.parse_args(argv)
    co = ns.checkout.resolve()
    root = ns.root.resolve()
    env = {**os.environ, "PYTHONPATH": f"{co}{os.pathsep}{co / 'clients' / 'python'}"}
    grpc_port, http_port, raft_port = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "doq", "serve", "--node-id", "node-1", "--data-dir", str(root / "data"),
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
           "--raft-addr", f"127.0.0.1:{raft_port}", "--log-level", "warning"]
    load_before = _loadavg()
    t0 = time.perf_counter()
    with open(ns.root / "restart.log", "ab") as log:
        # run in the checkout: `python -m doq` puts the working directory first on sys.path,
        # so started from another checkout it would run that one's code, not `--checkout`'s
        proc = subprocess.Popen(cmd, env=env, cwd=co, stdout=log, stderr=subprocess.STDOUT)
    peak_anon_kb = 0
    try:
        while True:
            try:
                peak_anon_kb = max(peak_anon_kb, _rss_kb(proc.pid).get("RssAnon", 0))
            except OSError:
                pass
            if proc.poll() is not None:
                print(f"doq serve exited with {proc.returncode}: see {ns.root / 'restart.log'}", file=sys.stderr)
                return 1
            if time.perf_counter() - t0 > ns.timeout_s:
                print("not ready in time", file=sys.stderr)
                return 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.05)
        wall_s = time.perf_counter() - t0
        cpu_s, user_s = _cpu_s(proc.pid)
        children_cpu_s = _children_cpu_s(proc.pid)
        time.sleep(1.0)  # what the start does once ready (a release of its pages) lands
        rss = _rss_kb(proc.pid)
        cpu_1s, _ = _cpu_s(proc.pid)  # what the start still did right after ready
        peak_anon_kb = max(peak_anon_kb, rss["RssAnon"])
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(120)
    print(json.dumps({"checkout": str(co), "root": str(ns.root), "wall_s": round(wall_s, 2), "cpu_s": cpu_s,
                      "user_s": user_s, "children_cpu_s": children_cpu_s, "cpu_s_1s_after": cpu_1s, "rss_anon_mb": rss["RssAnon"] // 1024, "rss_file_mb": rss["RssFile"] // 1024,
                      "peak_rss_anon_mb": peak_anon_kb // 1024,
                      "load_before": load_before, "load_after": _loadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
