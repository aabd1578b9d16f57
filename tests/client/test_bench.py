"""`doq bench` smoke runs: the JSON line has every field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.proc import NodeProc

FIELDS = {"workload", "frames", "messages", "seconds", "msg_per_s", "p50_ms", "p90_ms", "p99_ms"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "doq", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def _bench(*args: str) -> dict[str, object]:
    out = _run("--json", *args)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    assert len(lines) == 1
    line = lines[0]
    assert FIELDS <= set(line), line
    return line


@pytest.mark.parametrize(
    ("workload", "frames", "extra"),
    [
        ("enqueue", "single", ["--rate", "2000"]),
        ("enqueue", "batched", ["--batch", "10", "--concurrency", "2"]),
        ("dequeue", "batched", ["--batch", "10"]),
        ("mixed", "single", []),
    ],
)
def test_bench_smoke(node: NodeProc, workload: str, frames: str, extra: list[str]) -> None:
    line = _bench(
        "--server",
        "grpc://" + node.grpc_addr,
        "--workload",
        workload,
        "--frames",
        frames,
        "--count",
        "200",
        "--queue",
        f"bench-{workload}-{frames}",
        *extra,
    )
    assert (line["workload"], line["frames"], line["messages"], line["errors"]) == (
        workload,
        frames,
        200,
        0,
    )
    assert isinstance(line["seconds"], float) and line["seconds"] > 0
    assert isinstance(line["msg_per_s"], float) and line["msg_per_s"] > 0
    if workload != "dequeue":
        p50, p90, p99 = line["p50_ms"], line["p90_ms"], line["p99_ms"]
        assert isinstance(p50, float) and isinstance(p90, float) and isinstance(p99, float)
        assert 0 < p50 <= p90 <= p99


def test_bench_echo_ceiling() -> None:
    line = _bench("--workload", "echo", "--count", "300")
    assert line["workload"] == "echo" and line["messages"] == 300


def test_bench_prints_a_human_line_by_default(node: NodeProc) -> None:
    out = _run("--server", "grpc://" + node.grpc_addr, "--count", "100", "--queue", "bench-human")
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    assert line.startswith("enqueue: 100 messages in ") and " msg/s (single frames, 1 streams" in line
    assert "latency p50 " in line and not line.startswith("{")


def test_bench_counts_its_messages_on_a_terminal_only(node: NodeProc) -> None:
    """DOQ_PROGRESS=1 stands in for a terminal; a pipe gets nothing on stderr."""
    args = ["--server", "grpc://" + node.grpc_addr, "--count", "3000", "--queue", "bench-progress"]
    shown = subprocess.run([sys.executable, "-m", "doq", "bench", *args], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "DOQ_PROGRESS": "1"})
    assert shown.returncode == 0, shown.stderr
    assert "enqueue" in shown.stderr and "messages" in shown.stderr
    assert shown.stdout.startswith("enqueue: 3000 messages in ")
    quiet = subprocess.run([sys.executable, "-m", "doq", "bench", *args], capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in os.environ.items() if k != "DOQ_PROGRESS"})
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
