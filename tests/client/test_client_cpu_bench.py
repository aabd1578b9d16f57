"""bench/client_cpu.py smoke run (tiny counts, this checkout against itself): every mode
runs in its child processes, A and B alternate, and the JSON holds a figure for each run.
Benchmarks only: nothing here is timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.client_cpu import MODES, main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_every_mode_runs_for_both_checkouts(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    assert main(["--before", str(ROOT), "--after", str(ROOT), "--rounds", "2", "--count", "200",
                 "--modes", ",".join(MODES), "--json", str(out)]) == 0
    runs = json.loads(out.read_text())
    assert len(runs) == 2 * 2 * len(MODES)
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        assert [r["side"] for r in mine] == ["before", "after", "after", "before"]  # alternating
        assert all(r["cpu_us_per_msg"] > 0 and r["msg_per_s"] > 0 for r in mine)
