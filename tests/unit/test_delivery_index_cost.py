"""Smoke test of `bench/delivery_index_cost.py` (the figures themselves are in
docs/benchmarks.md): both fills run and report every figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import delivery_index_cost as D


def test_both_fills_run_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert D.main(["--messages", "2500", "--batch", "1000", "--runs", "1", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["without index", "with index"]
    for line in out:
        assert "msg/s" in line and "µs CPU/msg" in line and "B written/msg" in line
    r = D.fill(tmp_path, 1500, 1000, True)
    assert set(r) == {"msg_per_s", "cpu_us_per_msg", "written_bytes_per_msg"} and r["msg_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # the temporary envs are gone
