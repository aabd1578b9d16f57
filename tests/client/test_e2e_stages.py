"""bench/e2e_stages.py smoke run (tiny count): the probes still find the functions they
wrap, every message is stamped at every stage, and the report adds up. Benchmarks only:
nothing here is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.e2e_stages import ORDER, run_once

pytestmark = pytest.mark.integration


def test_every_message_is_stamped_at_every_stage(tmp_path: Path) -> None:
    r = run_once(tmp_path, 0, count=60, rate=500.0)
    assert r["messages"] == 60 and r["measured"]["messages"] == 60
    assert [s["step"].split(" -> ")[1] for s in r["steps"]] == list(ORDER)
    assert r["leased_by_their_own_commit"] <= 60 and r["writes"] > 0
    assert "EnqueueColumns" in "".join(r["write_kinds"])
