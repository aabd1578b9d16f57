"""Smoke test of `bench/pairlist_fill.py` (the figures themselves are in docs/benchmarks.md):
it runs, reports every tenth and the totals, counts the chunk sorts, and leaves
`PairList._fix` as it found it."""

from __future__ import annotations

import pytest

from bench import pairlist_fill as F
from doq.queues.pairlist import PairList


def test_fill_runs_reports_and_restores_the_sort(capsys: pytest.CaptureFixture[str]) -> None:
    fix = PairList._fix
    assert F.main(["--messages", "20000", "--batch", "1000", "--drain", "3000"]) == 0
    assert PairList._fix is fix
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 11
    assert all("µs a pair" in line and "pairs sorted a pair added" in line and "chunks" in line for line in out[:10])
    assert out[-1].startswith("fill ") and "pop_front" in out[-1]
    # 20k uniform pairs pass the first wave (4 chunks of ~250 reach UNSORTED_LOADS * LOAD at ~16k)
    assert float(out[-1].split("(")[1].split()[0]) > 0
