"""From a checkout: `python bench/e2e_floor.py ...` runs `python -m doq.bench.e2e_floor ...`
(what the bare parts of the end-to-end path cost here; the code and its options are in
doq/bench/e2e_floor.py)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.e2e_floor", run_name="__main__", alter_sys=True)
