"""bench/side_by_side.py smoke run (doq only, tiny counts, one node and a three-node
cluster): every workload completes through the clients as users write them, and the
summary has a figure for each. Benchmarks only: nothing here is timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.side_by_side import Args, format_summary, side_by_side

pytestmark = pytest.mark.integration

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


def test_keys_cost_runs_every_client_to_the_end(tmp_path: Path) -> None:
    """`python bench/keys_cost.py` (tiny counts): the open node's three clients and the
    secure node's all complete and are summarized (it broke silently once when the secure
    node moved to TLS)."""
    from bench.side_by_side import child_env

    out = tmp_path / "keys.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "keys_cost.py"), "--runs", "1", "--count", "200",
                           "--consume-count", "200", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    for name in ("keys off", "keys on", "prefix key", "secure"):
        for workload in ("producer", "consumer"):
            [run] = record["runs"][name][workload]
            assert run["messages"] == 200, (name, workload, run)


def test_dashboard_cost_reads_events_while_the_clients_run(tmp_path: Path) -> None:
    """`python bench/dashboard_cost.py` (tiny counts): both clients complete with and
    without a page open, and the open page read the node's events."""
    from bench.dashboard_cost import open_page
    from bench.side_by_side import child_env
    from tests.support.proc import running_node

    out = tmp_path / "dash.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dashboard_cost.py"), "--runs", "1", "--count", "200",
                           "--consume-count", "200", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    for name in ("no page", "page open"):
        for workload in ("producer", "consumer"):
            [run] = record["runs"][name][workload]
            assert run["messages"] == 200, (name, workload, run)
    with running_node(tmp_path / "n") as node, open_page("127.0.0.1", node.http_port) as events:
        from tests.support.cluster import until

        until("two events read", lambda: events[0] >= 2, timeout_s=60)
