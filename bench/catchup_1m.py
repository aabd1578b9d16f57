"""Catch-up by snapshot: how long a follower N messages behind takes to catch up.

Usage (from a checkout): python bench/catchup_1m.py [--messages 1000000]
       [--snapshot-every 1000] [--keep-entries 500] [--workdir DIR]

Starts three `doq serve` processes on 127.0.0.1 (node-1 bootstraps, the others join; the
compaction settings go to every node as DOQ_SNAPSHOT_EVERY / DOQ_KEEP_ENTRIES), kills -9
one follower, enqueues N 100-byte messages through the leader (`doq bench`, batched; not
timed), then starts the follower again and times until it has applied the leader's commit
index (the start of the process included). `by_snapshot` says whether the leader's log was
compacted past the follower's, so that only a snapshot could bring it up to date. Prints
one JSON line. Every process it started is killed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]

from doq.node.wal_log import WalLogStorage  # noqa: E402
from doq.storage.env import node_dir, open_env  # noqa: E402
from tools.chaos.procs import Cluster, HarnessError, NodeProcess  # noqa: E402


def _log_bounds(node: NodeProcess) -> tuple[int, int]:
    """(first, last) index of a stopped node's Raft log, read from its files."""
    env = open_env(node_dir(node.data_dir, node.node_id) / "doq.lmdb")
    try:
        log = WalLogStorage(env)
        try:
            return log.first_index(), log.last_index()
        finally:
            log.close()
    finally:
        env.close()


def _applied(node: NodeProcess) -> int:
    status = node.cluster_status()
    return int(status["applied_index"]) if status else -1


def fill(leader: NodeProcess, messages: int) -> dict[str, Any]:
    """Enqueue `messages` through `leader` with `doq bench` (kept in the queue)."""
    cmd = [sys.executable, "-m", "doq", "bench", "--server", f"grpc://{leader.grpc_addr}",
           "--workload", "enqueue", "--frames", "batched", "--batch", "1000", "--concurrency", "2",
           "--count", str(messages), "--no-purge", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return record


def run(workdir: Path, messages: int, timeout_s: float) -> dict[str, Any]:
    cluster = Cluster(workdir, 3)
    try:
        cluster.start()
        leader = cluster.wait_leader(60)
        if leader is None:
            raise HarnessError("no leader")
        follower = next(n for n in cluster.nodes if n is not leader)
        follower.kill9()
        _, follower_last = _log_bounds(follower)
        filled = fill(leader, messages)
        status = leader.cluster_status() or {}
        target = int(status.get("commit_index", 0))
        t0 = time.monotonic()
        follower.start(timeout_s)
        ready_s = time.monotonic() - t0
        deadline = t0 + timeout_s
        while _applied(follower) < target:
            if time.monotonic() > deadline:
                raise HarnessError(f"{follower.node_id} not caught up within {timeout_s} s")
            time.sleep(0.05)
        caught_up_s = time.monotonic() - t0
    finally:
        cluster.stop()
    leader_first, _ = _log_bounds(leader)
    return {
        "messages": messages, "fill_msg_per_s": filled.get("msg_per_s"),
        "entries_behind": target - follower_last, "leader_log_first_index": leader_first,
        "by_snapshot": leader_first > follower_last + 1,
        "ready_s": round(ready_s, 2), "caught_up_s": round(caught_up_s, 2),
        "snapshot_every": int(os.environ["DOQ_SNAPSHOT_EVERY"]),
        "keep_entries": int(os.environ["DOQ_KEEP_ENTRIES"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python bench/catchup_1m.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--snapshot-every", type=int, default=1000, help="applied entries between snapshots")
    ap.add_argument("--keep-entries", type=int, default=500, help="entries kept behind a snapshot")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="give up on the catch-up after this")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and node logs here")
    a = ap.parse_args()
    os.environ["DOQ_SNAPSHOT_EVERY"] = str(a.snapshot_every)  # inherited by the nodes
    os.environ["DOQ_KEEP_ENTRIES"] = str(a.keep_entries)
    if a.workdir is not None:
        a.workdir.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run(a.workdir, a.messages, a.timeout_s)))
        return
    with tempfile.TemporaryDirectory(prefix="doq-catchup-") as tmp:
        print(json.dumps(run(Path(tmp), a.messages, a.timeout_s)))


if __name__ == "__main__":
    main()
