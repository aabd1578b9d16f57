"""From a checkout: `python bench/group_fairness.py ...` runs `python -m doq.bench.group_fairness ...`
(the code lives in doq/bench/group_fairness.py; see its docstring for options)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.group_fairness", run_name="__main__", alter_sys=True)
