"""The nemesis: faults injected into the nodes on a schedule, each healed before the next.

Kinds: `kill-leader` (kill -9 the leader; on one node, the node), `kill-follower`
(kill -9 a node that is not the leader; only with several nodes) — each restarted after
`down_s` — and `pause-leader` (SIGSTOP the leader for `pause_s`, longer than the election
timeout, then SIGCONT). After healing, the nemesis waits until every node is up and a
leader is known. Every fault is recorded with the monotonic time of its signal.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from tools.chaos.procs import Cluster, HarnessError, NodeProcess

KILL_LEADER, KILL_FOLLOWER, PAUSE_LEADER = "kill-leader", "kill-follower", "pause-leader"


@dataclass(slots=True)
class Fault:
    kind: str
    node_id: str
    t: float  # monotonic time of the signal
    healed_t: float = 0.0


def make_plan(kills: int, pauses: int, nodes: int, rng: random.Random) -> list[str]:
    """`kills` kill -9s (a quarter of them followers when there are followers) and
    `pauses` leader pauses, in a seeded random order."""
    followers = kills // 4 if nodes > 1 else 0
    plan = [KILL_LEADER] * (kills - followers) + [KILL_FOLLOWER] * followers + [PAUSE_LEADER] * pauses
    rng.shuffle(plan)
    return plan


class Nemesis(threading.Thread):
    """Runs `plan` against `cluster`: fault i at `start_t + (i + 1) * spacing_s` (or as soon
    as the previous one healed, `min_gap_s` later). `crash` holds what stopped it early."""

    def __init__(self, cluster: Cluster, plan: list[str], *, start_t: float, spacing_s: float,
                 down_s: float, pause_s: float, min_gap_s: float = 1.0,
                 ready_timeout_s: float = 60.0, seed: int = 0) -> None:
        super().__init__(name="chaos-nemesis", daemon=True)
        self.cluster, self.plan = cluster, plan
        self.start_t, self.spacing_s, self.min_gap_s = start_t, spacing_s, min_gap_s
        self.down_s, self.pause_s, self.ready_timeout_s = down_s, pause_s, ready_timeout_s
        self.rng = random.Random(seed)
        self.faults: list[Fault] = []
        self.stop = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            healed = time.monotonic()
            for i, kind in enumerate(self.plan):
                due = max(self.start_t + (i + 1) * self.spacing_s, healed + self.min_gap_s)
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                self._inject(kind)
                healed = time.monotonic()
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.crash = e

    def _inject(self, kind: str) -> None:
        leader = self.cluster.wait_leader(self.ready_timeout_s)
        if leader is None:
            raise HarnessError("no leader before a fault")
        target = leader
        if kind == KILL_FOLLOWER:
            target = self.rng.choice([n for n in self.cluster.nodes if n is not leader])
        fault = Fault(kind, target.node_id, time.monotonic())
        self.faults.append(fault)
        try:
            if kind == PAUSE_LEADER:
                target.pause()
                time.sleep(self.pause_s)
            else:
                target.kill9()
                time.sleep(self.down_s)
        finally:
            self._heal(target)
        fault.healed_t = time.monotonic()
        if self.cluster.wait_leader(self.ready_timeout_s) is None:
            raise HarnessError(f"no leader within {self.ready_timeout_s} s after {kind}")

    def _heal(self, node: NodeProcess) -> None:
        if node.paused:
            node.resume()
        if not node.alive:
            node.start(self.ready_timeout_s)
