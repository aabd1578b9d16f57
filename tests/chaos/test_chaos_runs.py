"""`python -m tools.chaos` against real `doq serve` processes: short runs with kill -9s and
a pause find no anomaly, on one node and on a three-node cluster (leader and follower
kills, a leader paused longer than the election timeout), and the one-node run against a
server with a planted bug (acks before commit) is caught by the checker."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.chaos.nemesis import KILL_FOLLOWER, KILL_LEADER, PAUSE_LEADER, make_plan

ROOT = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).with_name("planted_server.py")


def chaos(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "tools.chaos", "--workdir", str(tmp_path), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    lines = r.stdout.strip().splitlines()
    assert lines, f"no summary; stderr:\n{r.stderr[-3000:]}"
    return r.returncode, json.loads(lines[-1]), r.stderr


@pytest.mark.integration
def test_a_short_run_with_kills_and_a_pause_finds_no_anomaly(tmp_path: Path) -> None:
    code, s, err = chaos(tmp_path, "--nodes", "1", "--kills", "3", "--pauses", "1",
                         "--duration", "12", "--seed", "7")
    assert code == 0, (s, err[-3000:])
    assert (s["lost"], s["duplicated"], s["unexpected"], s["double_leased"], s["dedup_failed"]) == (0,) * 5
    assert s["valid"] and "error" not in s and s["undrained"] == 0
    assert s["kills"] == 3 and s["faults"] == {KILL_LEADER: 3, PAUSE_LEADER: 1}
    assert s["enqueue_ok"] > 300 and s["delivered"] >= s["enqueue_ok"]
    assert len(s["failover_ms"]) == 3 and all(x is not None for x in s["failover_ms"])
    # producers came back after every kill (failover_ms above); the client reopens its
    # streams on the leader itself, so workers start new sessions (`reconnects`) only after
    # a stall or when the client gives up: their number is not a measure of recovery
    assert (tmp_path / "history.jsonl").stat().st_size > 0


@pytest.mark.integration
def test_a_short_run_on_three_nodes_with_leader_and_follower_kills_and_a_pause_finds_no_anomaly(
        tmp_path: Path) -> None:
    code, s, err = chaos(tmp_path, "--nodes", "3", "--kills", "4", "--pauses", "1",
                         "--duration", "12", "--seed", "7")
    assert code == 0, (s, err[-3000:])
    assert (s["lost"], s["duplicated"], s["unexpected"], s["double_leased"], s["dedup_failed"]) == (0,) * 5
    assert s["valid"] and "error" not in s and s["undrained"] == 0
    assert s["kills"] == 4 and s["faults"] == {KILL_LEADER: 3, KILL_FOLLOWER: 1, PAUSE_LEADER: 1}
    assert s["enqueue_ok"] > 1000 and s["delivered"] >= s["enqueue_ok"]
    assert len(s["failover_ms"]) == 3 and all(x is not None for x in s["failover_ms"])
    assert len(s["pause_recovery_ms"]) == 1 and s["pause_recovery_ms"][0] is not None
    logs = "".join((tmp_path / "data" / f"node-{i}.log").read_text() for i in (1, 2, 3))
    assert "joined the cluster" in logs  # a real cluster: node-2 and node-3 joined node-1


@pytest.mark.integration
def test_the_checker_catches_acks_before_commit_under_kill9(tmp_path: Path) -> None:
    code, s, err = chaos(tmp_path, "--nodes", "1", "--kills", "2", "--pauses", "0",
                         "--duration", "6", "--seed", "7",
                         "--server-cmd", f"{sys.executable} {PLANTED}")
    assert "planted: ack before commit" in (tmp_path / "data" / "node-1.log").read_text()
    assert code == 1 and "error" not in s, (s, err[-3000:])
    assert s["lost"] > 0 and not s["valid"]
    assert "lost: " in err  # examples of the anomaly on stderr


def test_the_plan_has_the_kills_and_pauses_asked_for() -> None:
    plan = make_plan(8, 2, 3, random.Random(1))
    assert sorted(plan) == sorted([KILL_LEADER] * 6 + [KILL_FOLLOWER] * 2 + [PAUSE_LEADER] * 2)
    assert make_plan(8, 2, 1, random.Random(1)).count(KILL_LEADER) == 8  # no followers alone
