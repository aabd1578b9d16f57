"""bench/side_by_side.py smoke run (doq only, tiny counts, one node and a three-node
cluster): every workload completes through the clients as users write them, and the
summary has a figure for each. Benchmarks only: nothing here is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from doq.bench.side_by_side import Args, format_summary, side_by_side

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("nodes", [1, 3])
def test_side_by_side_doq_only(nodes: int) -> None:
    args = Args(count=300, consume_count=300, e2e_count=100, calls_count=50, rate=2000.0, runs=1,
                nodes=nodes)
    record = side_by_side(args, ["doq"], log=lambda _line: None)
    runs = record["runs"]
    assert runs["doq/producer"][0]["messages"] == 300
    assert runs["doq/consumer"][0]["messages"] == 300
    assert runs["doq/e2e"][0]["messages"] == 100
    assert runs["doq/calls"][0]["messages"] == 50
    figures = {(r["workload"], r["figure"]): r["doq"] for r in record["summary"]}
    assert set(figures) >= {("producer", "msg_per_s"), ("consumer", "msg_per_s"),
                            ("e2e", "p50_ms"), ("e2e", "p99_ms"), ("calls", "p50_ms"),
                            ("calls", "calls_per_s")}
    assert all(figures[k] > 0 for k in [("producer", "msg_per_s"), ("consumer", "msg_per_s"),
                                        ("e2e", "p50_ms"), ("e2e", "p99_ms"), ("calls", "p50_ms")])
    # the server's CPU per message may read 0 (None) for so few messages (10 ms clock ticks)
    summary = format_summary(record, ["doq"])
    assert "| producer | msg_per_s |" in summary and f"{nodes} node(s) per system" in summary


def test_side_by_side_script_without_rabbitmq_says_how_to_get_it() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "side_by_side.py"), "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "rabbitmq-server" in out.stdout
