"""The simulator's queue workload (tools.sim.queues): the real queue state machine with
redrives under the simulated faults (crashes, partitions, leader changes, snapshots)
stays identical on every replica and conserves every payload; and the check catches a
redrive that duplicates messages or that paces by something other than replicated state."""

from __future__ import annotations

import random

import pytest

from doq.queues import redrive as RD
from doq.queues.machine import QueueMachine
from tests.support.mutation import MUTATION
from tools.sim.runner import SimOptions, run_seed

SEEDS = range(12)
CLEAN_SEEDS = range(4) if MUTATION else SEEDS  # mutation runs (tests/support/mutation.py): fewer


def test_redrives_under_faults_are_deterministic_and_conserve_messages() -> None:
    opts = SimOptions(queues=True)
    moved = 0
    for seed in CLEAN_SEEDS:
        r = run_seed(seed, opts)
        assert r.violations == [], f"seed {seed}: {r.violations}"
        moved += r.redrive_moved
    assert moved > 0  # redrives did move messages (the last task of each seed, summed)
    a, b = run_seed(3, opts), run_seed(3, opts)
    assert a == b and a.trace_hash == b.trace_hash


def _first_violation(opts: SimOptions) -> list[str]:
    for seed in SEEDS:
        r = run_seed(seed, opts)
        if r.violations:
            return r.violations
    return []


def test_a_redrive_that_duplicates_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    move = QueueMachine.move_messages

    def twice(self: QueueMachine, src: object, ids: list[int], dst: object) -> None:
        recs = {i: self.get_message(src.name, i) for i in ids}  # type: ignore[attr-defined]
        move(self, src, ids, dst)  # type: ignore[arg-type]
        for v in recs.values():  # and a copy of each
            from doq.queues import commands as c
            self._enqueue_items(dst, [c.EnqueueItem(v.content, v.group)])  # type: ignore[arg-type]

    monkeypatch.setattr(QueueMachine, "move_messages", twice)
    found = _first_violation(SimOptions(queues=True))
    assert any("twice" in v for v in found), found


def test_pacing_by_a_local_source_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that consults something other than replicated state (here a random number,
    as a local clock would be) makes replicas diverge: the state-machine hash differs."""
    local = random.Random(1)
    step = RD.Redrives._step

    def flaky(self: RD.Redrives, m: RD.QueueMachine, t: RD.RedriveTask) -> None:
        if local.random() < 0.5:
            step(self, m, t)

    monkeypatch.setattr(RD.Redrives, "_step", flaky)
    found = _first_violation(SimOptions(queues=True))
    assert any("state machine safety" in v for v in found), found
