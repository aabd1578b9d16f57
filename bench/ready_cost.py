"""What each Ready of a leader costs, one call at a time on three nodes, in CPU.

    python bench/ready_cost.py [--calls 1000]

Three production `RaftNode`s in this process (`tests/node/raftnet.py`: an in-memory
network, virtual time, the writer and apply "threads" inline, real LMDB and segment
logs), `--calls` enqueues of 100 bytes one at a time on the leader. Per kind of the
leader's Ready (`append`: entries, nothing committed; `commit`: committed entries, no new
entry), the CPU time (`time.thread_time`: user + system, the fdatasyncs' kernel work
included, their waits not) of the loop's part (`_handle_ready` without the write) and of
its write (`_write`), and the loop's `_feed` (stepping the followers' answers) per call.
No gRPC, no thread hand-offs: what is left is the driver's own work. The in-memory
network encodes and decodes each message (a part of the `append` Ready's loop figure).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.node.raft_node import RaftNode, RaftNodeConfig, _Job  # noqa: E402
from doq.queues import commands as c  # noqa: E402
from doq.queues.model import QueueSettings  # noqa: E402
from doq.raft.core import RaftCore  # noqa: E402
from doq.raft.types import Ready  # noqa: E402
from tests.node.raftnet import Cluster, retry  # noqa: E402

# the simulated loop's module is not typed for mypy's strict run over bench/: imported by name
simloop: Any = importlib.import_module("tests.node.simloop")

cpu_s: dict[str, float] = collections.defaultdict(float)
readies: collections.Counter[str] = collections.Counter()


class _Probe:
    leader = ""  # the probed node's id
    write_s = 0.0  # CPU time of its writes so far


probed = _Probe()


class _ProbedNode(RaftNode):
    """Adds the CPU time of the leader's Readies, writes and feeds to `cpu_s`."""

    async def _handle_ready(self, core: RaftCore, rd: Ready) -> None:
        if self.node_id != probed.leader:
            await super()._handle_ready(core, rd)
            return
        kind = ("append" if not rd.committed_entries else "commit") if not (
            rd.entries and rd.committed_entries) else "append+commit"
        if not rd.entries and not rd.committed_entries:
            kind = "other"
        t0, w0 = time.thread_time(), probed.write_s
        await super()._handle_ready(core, rd)
        written = probed.write_s - w0
        cpu_s[f"{kind} loop"] += time.thread_time() - t0 - written
        cpu_s[f"{kind} write"] += written
        readies[kind] += 1

    def _write(self, job: _Job) -> None:
        t0 = time.thread_time()
        super()._write(job)
        if self.node_id == probed.leader:
            probed.write_s += time.thread_time() - t0

    def _feed(self, core: RaftCore) -> None:
        t0 = time.thread_time()
        super()._feed(core)
        if self.node_id == probed.leader:
            cpu_s["feed"] += time.thread_time() - t0


def _inline(node: RaftNode) -> None:
    node._writer = node._applier = node._snapshots.executor = simloop.InlineExecutor()  # type: ignore[assignment]


async def _run(root: Path, calls: int) -> None:
    loop = asyncio.get_running_loop()
    cfg = RaftNodeConfig(tick_ms=25, election_tick=10, heartbeat_tick=1)
    cl = Cluster(root, cfg, _ProbedNode, prepare=_inline,
                 clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        ld = await cl.grow("n2", "n3")
        while any(n.applied_index < ld.cluster_status().commit_index for n in cl.nodes.values()):
            await asyncio.sleep(0.025)  # virtual: a tick
        probed.leader = ld.node_id
        for _ in range(calls):  # one call at a time, each waiting for its confirmation
            await ld.propose(c.Enqueue("q", [c.EnqueueItem(b"x" * 100)]))
    finally:
        await cl.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    ns = p.parse_args()
    loop = simloop.VirtualTimeLoop()
    try:
        with tempfile.TemporaryDirectory(prefix="doq-ready-cost-") as tmp:
            loop.run_until_complete(_run(Path(tmp), ns.calls))
    finally:
        loop.close()
    out: dict[str, Any] = {}
    for kind, n in sorted(readies.items()):
        out[kind] = {"readies": n, "loop_us": round(cpu_s[f"{kind} loop"] / n * 1e6, 1),
                     "write_us": round(cpu_s[f"{kind} write"] / n * 1e6, 1)}
        print(f"{kind:14s} {n:6d} Readies; per Ready: loop {out[kind]['loop_us']:7.1f} us, "
              f"write {out[kind]['write_us']:7.1f} us")
    print(f"feed (the followers' answers stepped) per call: {cpu_s['feed'] / ns.calls * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
