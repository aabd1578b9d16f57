"""One chaos run end to end: ``python -m tools.chaos --nodes 1|3 --kills N --duration S``.

Starts `--nodes` real `doq serve` processes on 127.0.0.1 (free ports, a temporary data
directory), creates the queues, runs the workload for `--duration` seconds while the
nemesis injects its faults spread over it, lets retries settle, stops the workload, drains
every queue and checks the history. Prints one line of JSON (the summary) on stdout and
exits 0 when the checker found no anomaly, 1 when it found one, 2 when the run could not be
carried out. On 1 or 2 the working directory (node logs, `history.jsonl`) is kept and named
on stderr, with a few examples of each anomaly.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doq_client import DoqClientError
from tools.chaos.checker import ANOMALIES, Op, check, failover_times_ms
from tools.chaos.nemesis import KILL_LEADER, PAUSE_LEADER, Nemesis, make_plan
from tools.chaos.procs import DEFAULT_SERVER_CMD, Cluster, HarnessError
from tools.chaos.workload import Endpoint, History, Targets, Workload, WorkloadConfig

EXIT_OK, EXIT_ANOMALY, EXIT_ERROR = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    nodes: int = 1
    kills: int = 3
    pauses: int = 1
    duration_s: float = 20.0
    seed: int = 0
    down_s: float = 0.5
    pause_s: float = 3.0  # longer than the election timeout (1-2 s by default)
    settle_s: float = 3.0
    drain_timeout_s: float = 30.0
    skew_margin_ms: int = 100
    server_cmd: tuple[str, ...] = DEFAULT_SERVER_CMD
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


@dataclass(slots=True)
class Outcome:
    summary: dict[str, Any]
    history: list[Op]
    examples: dict[str, list[str]]

    @property
    def exit_code(self) -> int:
        if "error" in self.summary:
            return EXIT_ERROR
        return EXIT_OK if self.summary["valid"] else EXIT_ANOMALY


def run(cfg: ChaosConfig, workdir: Path) -> Outcome:
    """Carry out one run in `workdir` (see the module docstring). Never leaves a node running."""
    t_start = time.monotonic()
    cluster = Cluster(workdir, cfg.nodes, cfg.server_cmd)
    history = History()
    targets = Targets([Endpoint(n.node_id, n.grpc_addr, n.http_addr) for n in cluster.nodes])
    workload = Workload(cfg.workload, targets, history)
    rng = random.Random(cfg.seed)
    plan = make_plan(cfg.kills, cfg.pauses, cfg.nodes, rng)
    nemesis: Nemesis | None = None
    undrained: dict[str, int] = {}
    error = ""
    try:
        cluster.start()
        workload.setup()
        workload.start()
        t0 = time.monotonic()
        nemesis = Nemesis(cluster, plan, start_t=t0, spacing_s=cfg.duration_s / (len(plan) + 1),
                          down_s=cfg.down_s, pause_s=cfg.pause_s, seed=cfg.seed)
        nemesis.start()
        nemesis.join(cfg.duration_s + 120.0 * (len(plan) + 1))
        if nemesis.is_alive():
            nemesis.stop.set()
            nemesis.join(120.0)
        time.sleep(max(0.0, t0 + cfg.duration_s - time.monotonic()) + cfg.settle_s)
        workload.stop()
        if nemesis.crash is not None:
            raise HarnessError(f"nemesis: {nemesis.crash!r}")
        if crashes := workload.crashes():
            raise HarnessError(f"workers crashed: {crashes}")
        undrained = workload.drain(cfg.drain_timeout_s)
    except (RuntimeError, OSError, DoqClientError) as e:  # HarnessError is a RuntimeError
        error = str(e)
    finally:
        for w in workload.workers:
            w.stop.set()
        if nemesis is not None:
            nemesis.stop.set()
        cluster.stop()
    ops = history.ops()
    faults = nemesis.faults if nemesis is not None else []
    report = check(ops, skew_margin_ms=cfg.skew_margin_ms)
    failover = failover_times_ms(ops, [f.t for f in faults if f.kind == KILL_LEADER])
    recovery = failover_times_ms(ops, [f.t for f in faults if f.kind == PAUSE_LEADER])
    known = [x for x in failover if x is not None]
    summary: dict[str, Any] = {
        "valid": report.valid and not error,
        **{a: getattr(report, a) for a in ANOMALIES},
        "redeliveries": report.redeliveries,
        "unknown_delivered": report.unknown_delivered,
        "enqueue_ok": report.enqueue_ok,
        "enqueue_unknown": report.enqueue_unknown,
        "enqueue_failed": report.enqueue_failed,
        "enqueue_retried": report.enqueue_retried,
        "delivered": report.delivered,
        "acks_ok": report.acks_ok,
        "undrained": sum(v for v in undrained.values() if v > 0),
        "nodes": cfg.nodes,
        "kills": sum(1 for f in faults if f.kind != PAUSE_LEADER),
        "faults": dict(Counter(f.kind for f in faults)),
        "failover_ms": failover,
        "failover_median_ms": round(statistics.median(known), 1) if known else None,
        "pause_recovery_ms": recovery,
        "reconnects": sum(max(0, w.sessions - 1) for w in workload.workers),
        "duration_s": round(time.monotonic() - t_start, 1),
        "seed": cfg.seed,
    }
    if error:
        summary["error"] = error
    return Outcome(summary, ops, report.examples)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--nodes", type=int, default=1, help="doq serve processes (1, or 3 for a cluster)")
    a("--kills", type=int, default=3, help="kill -9s (a quarter of followers with several nodes)")
    a("--pauses", type=int, default=None, help="SIGSTOP/SIGCONT of the leader (default kills // 4)")
    a("--duration", type=float, default=20.0, help="seconds of load; the faults are spread over it")
    a("--seed", type=int, default=None, help="random seed (default: from the clock; printed)")
    a("--rate", type=float, default=100.0, help="enqueues a second per producer")
    a("--producers", type=int, default=2)
    a("--consumers", type=int, default=2, help="consumers per queue")
    a("--visibility-timeout-ms", type=int, default=2000, help="lease length of the consumers")
    a("--down-s", type=float, default=0.5, help="how long a killed node stays down")
    a("--pause-s", type=float, default=3.0, help="how long a paused leader stays stopped")
    a("--drain-timeout-s", type=float, default=30.0)
    a("--skew-margin-ms", type=int, default=100, help="lease overlap tolerated as clock skew")
    a("--server-cmd", default=shlex.join(DEFAULT_SERVER_CMD),
      help="command that runs doq (followed by `serve ...`)")
    a("--workdir", type=Path, default=None, help="keep data, logs and history here")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    seed = ns.seed if ns.seed is not None else int(time.time())
    cfg = ChaosConfig(
        nodes=ns.nodes, kills=ns.kills, pauses=ns.kills // 4 if ns.pauses is None else ns.pauses,
        duration_s=ns.duration, seed=seed, down_s=ns.down_s, pause_s=ns.pause_s,
        drain_timeout_s=ns.drain_timeout_s, skew_margin_ms=ns.skew_margin_ms,
        server_cmd=tuple(shlex.split(ns.server_cmd)),
        workload=WorkloadConfig(producers=ns.producers, rate_per_s=ns.rate,
                                consumers_per_queue=ns.consumers,
                                visibility_timeout_ms=ns.visibility_timeout_ms, seed=seed),
    )
    workdir = ns.workdir or Path(tempfile.mkdtemp(prefix="doq-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = run(cfg, workdir)
    code = out.exit_code
    if code != EXIT_OK or ns.workdir is not None:
        with open(workdir / "history.jsonl", "w") as f:
            for op in out.history:
                f.write(json.dumps(op.to_json()) + "\n")
    if code != EXIT_OK:
        for anomaly, examples in out.examples.items():
            for ex in examples:
                print(f"{anomaly}: {ex}", file=sys.stderr)
        print(f"doq chaos: kept {workdir} (node logs, history.jsonl)", file=sys.stderr)
    elif ns.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out.summary, separators=(",", ":")), flush=True)
    return code
