"""From a checkout: `python bench/delivery_index_cost.py ...` runs `python -m doq.bench.delivery_index_cost ...`
(the code lives in doq/bench/delivery_index_cost.py; see its docstring for options)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.delivery_index_cost", run_name="__main__", alter_sys=True)
