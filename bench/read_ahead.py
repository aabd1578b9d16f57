"""The read-ahead of a delayed or fair queue's bodies, on and off, side by side in one process.

`python bench/read_ahead.py --messages 1000000 --drain 200000 --kinds random` fills two
StateStores on LMDB with the same backlog (`bench/backlog_apply.py`'s fill), one with the
read-ahead of bodies (`doq.storage.state._TxnSink.upcoming`) and one without, then drains
both as `bench/backlog_apply.py` does (each durable commit acks the previous `--batch`
deliveries and takes `--batch` more), alternating between them every `--round` commits so
that both see the same machine load. Prints, per kind, the CPU per drained message
(`time.process_time` of the commits) of each and their ratio, the longest commit's CPU, and
the load average. Both drains must deliver the same ids in the same order (checked).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.backlog import loadavg, messages
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore


class _Side:
    def __init__(self, root: Path, name: str, ahead: bool) -> None:
        self.env = open_env(root / name, map_size=1 << 34)
        self.st = StateStore(self.env)
        if not ahead:
            self.st._sink.upcoming = None
        self.idx = 0
        self.cpu = 0.0
        self.longest = 0.0
        self.prev: tuple[list[int], list[int]] = ([], [])
        self.ids: list[int] = []

    def commit(self, now: int, *entries: list[Any]) -> list[list[object]]:
        ents = []
        for cmds in entries:
            self.idx += 1
            ents.append((self.idx, encode_batch(c.CommandBatch(now, cmds))))
        t = time.process_time()
        with self.st.write() as txn:
            out = self.st.apply_entries(txn, ents)
        t = time.process_time() - t
        self.cpu += t
        self.longest = max(self.longest, t)
        return out

    def step(self, now: int, batch: int) -> int:
        cmds: list[c.Command] = [c.Dequeue("q", batch, visibility_timeout_ms=3_600_000)]
        if self.prev[0]:
            cmds.insert(0, c.Ack("q", self.prev[0], self.prev[1]))
        views = self.commit(now, cmds)[0][-1]
        assert isinstance(views, list)
        self.prev = ([v.id for v in views], [v.lease_id for v in views])
        self.ids += self.prev[0]
        return len(views)


def run_kind(kind: str, n: int, m: int, batch: int, rounds: int, per_group: int, root: Path) -> dict[str, Any]:
    now = int(time.time() * 1000)
    sides = {"ahead": _Side(root, kind + "-ahead", True), "without": _Side(root, kind + "-without", False)}
    qtype = "fair" if kind.startswith("fair") else "delayed"
    items = list(messages(kind, n, per_group))
    body = b"x" * 100
    for s in sides.values():
        s.commit(now, [c.CreateQueue("q", qtype, QueueSettings())])
        for i in range(0, n, 10_000):
            s.commit(now, *[[c.EnqueueColumns(
                "q", [body] * len(part), groups=[g for _, g in part] if qtype == "fair" else [],
                priorities=[p for p, _ in part] if kind != "plain" and qtype != "fair" else [])]
                for part in (items[j : j + 1000] for j in range(i, min(i + 10_000, n), 1000))])
        s.cpu = s.longest = 0.0
    del items
    load0 = loadavg()
    taken = 0
    order = list(sides.values())
    while taken < m:
        got = 0
        for s in order:  # the same commits on each, the first of a round alternating
            got = sum(s.step(now, batch) for _ in range(rounds))
        taken += got
        order.reverse()
        if not got:
            break
    a, w = sides["ahead"], sides["without"]
    assert a.ids == w.ids, "the read-ahead changed the deliveries"
    for s in sides.values():
        s.env.close()
    return {"kind": kind, "messages": n, "drained": len(a.ids),
            "ahead_cpu_us_per_msg": a.cpu / len(a.ids) * 1e6, "without_cpu_us_per_msg": w.cpu / len(w.ids) * 1e6,
            "ratio": a.cpu / w.cpu, "ahead_longest_commit_cpu_ms": a.longest * 1e3,
            "without_longest_commit_cpu_ms": w.longest * 1e3, "load": f"{load0} -> {loadavg()}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--drain", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--round", type=int, default=10, help="commits on one side before the other's")
    p.add_argument("--kinds", default="random,timestamps,fair-blocks")
    p.add_argument("--per-group", type=int, default=100)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="doq-ahead-") as tmp:
        for kind in a.kinds.split(","):
            print(json.dumps(run_kind(kind, a.messages, a.drain, a.batch, a.round, a.per_group, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
