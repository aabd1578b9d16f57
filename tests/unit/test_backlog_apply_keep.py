"""Smoke test of `bench/backlog_apply.py --keep DIR` (the figures themselves are in
docs/benchmarks.md): the first run keeps each kind's filled store, a second run drains a
copy of it (no fill: its fill figures are nan) and leaves the kept store as it was."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import backlog_apply as B


def _runs(out: str) -> dict[str, dict[str, object]]:
    return {r["kind"]: r for r in map(json.loads, (line for line in out.splitlines() if line.startswith("{")))}


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_keep_fills_once_and_drains_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "keep"
    args = ["--messages", "3000", "--drain", "1000", "--kinds", "plain,random", "--keep", str(keep),
            "--dir", str(tmp_path)]
    assert B.main(args) == 0
    first = _runs(capsys.readouterr().out)
    assert sorted(p.name for p in keep.iterdir()) == ["plain-3000", "random-3000"]
    kept = {k: _files(keep / f"{k}-3000") for k in ("plain", "random")}
    assert B.main(args) == 0
    second = _runs(capsys.readouterr().out)
    for kind in ("plain", "random"):
        assert not math.isnan(first[kind]["fill_msg_per_s"])  # type: ignore[arg-type]
        assert math.isnan(second[kind]["fill_msg_per_s"])  # type: ignore[arg-type]
        assert second[kind]["drained"] == first[kind]["drained"] == 1000
        assert _files(keep / f"{kind}-3000") == kept[kind]  # the drain ran on a copy
