"""Storage alarm figures (docs/benchmarks.md, "Storage alarms"): from a checkout, as root
(the disk part mounts a 24 MiB tmpfs), `python bench/storage_alarms.py`.

Real `doq serve` processes (tests/support/proc.py). For one node with `--max-data-size
4MiB` (three runs) and a three-node cluster whose node-3 alone has that limit: 16 kB
enqueues over HTTP until refused, the node's RSS before and when full, the median time of
a refusal, and the time from a purge to the next accepted enqueue. Then on the tmpfs: a
ballast file leaves 8 MiB; enqueues until the alarm (NOSPACE with `--disk-free-limit 0`,
DISK_FREE_LIMIT with 4 MiB); the time from removing the ballast to the next accepted
enqueue."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])  # the nodes too

from tests.support.cluster import call, http_call, leader, node_procs, running_cluster  # noqa: E402
from tests.support.proc import NodeProc, running_node  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fill_and_purge(node: NodeProc, entry: NodeProc) -> dict[str, float]:
    assert node.proc is not None
    call(entry, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})
    rss0 = rss_mib(node.proc.pid)
    n = 0
    while call(entry, "POST", "/API/v1/queues/bulk/messages", {"content": "x" * 16000})[0] in (200, 201):
        n += 1
    refusals = []
    for _ in range(50):
        t = time.monotonic()
        status, body = call(entry, "POST", "/API/v1/queues/bulk/messages", {"content": "x"})
        refusals.append(time.monotonic() - t)
        assert status == 507, (status, body)
    rss1 = rss_mib(node.proc.pid)
    t = time.monotonic()
    assert call(entry, "POST", "/API/v1/queues/bulk/purge")[0] == 200
    while call(entry, "POST", "/API/v1/queues/bulk/messages", {"content": "after"})[0] not in (200, 201):
        pass
    return {"taken": n, "refusal_ms_median": round(statistics.median(refusals) * 1000, 2),
            "purge_to_resume_ms": round((time.monotonic() - t) * 1000, 1),
            "rss_before_mib": round(rss0, 1), "rss_full_mib": round(rss1, 1)}


def reasons(node: NodeProc) -> list[str]:
    return [a["reason"] for a in call(node, "GET", "/readyz")[1]["alarms"]]


def disk(tmp: Path, limit: str) -> tuple[list[str], float]:
    fs = tmp / f"fs-{limit}"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(fs)], check=True)
    try:
        with running_node(fs / "data", extra_args=["--disk-free-limit", limit]) as node:
            call(node, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})
            with open(fs / "ballast", "wb") as f:
                os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(fs).free - (8 << 20))
            seen = threading.Event()

            def producer() -> None:
                while not seen.is_set():
                    status, _ = http_call(node.http_url, "POST", "/API/v1/queues/bulk/messages",
                                          {"content": "x" * 16000}, timeout_s=600)
                    if status not in (200, 201):
                        return

            t = threading.Thread(target=producer, daemon=True)
            t.start()
            while not reasons(node):
                time.sleep(0.01)
            seen.set()
            on = reasons(node)
            time.sleep(3)
            t0 = time.monotonic()
            os.unlink(fs / "ballast")
            while call(node, "POST", "/API/v1/queues/bulk/messages", {"content": "after"})[0] not in (200, 201):
                time.sleep(0.005)
            resume_ms = (time.monotonic() - t0) * 1000
            t.join(30)
            return on, resume_ms
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(3):
            with running_node(tmp / f"one{i}", extra_args=["--max-data-size", "4MiB", "--disk-free-limit", "0"]) as n:
                print("one node, --max-data-size 4MiB:", fill_and_purge(n, n), flush=True)
        nodes = node_procs(tmp / "three", ["--disk-free-limit", "0"])
        nodes[2].extra_args += ["--max-data-size", "4MiB"]
        with running_cluster(nodes) as cluster:
            print("three nodes, node-3 at 4MiB, through the leader:",
                  fill_and_purge(nodes[2], leader(cluster)), flush=True)
        if os.geteuid() == 0:
            for limit in ("0", "4MiB"):
                on, ms = disk(tmp, limit)
                print(f"tmpfs 24 MiB, --disk-free-limit {limit}: alarms {on}, "
                      f"ballast removed -> enqueue taken in {ms:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
