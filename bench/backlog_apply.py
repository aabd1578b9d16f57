"""From a checkout: `python bench/backlog_apply.py ...` runs `python -m doq.bench.backlog_apply ...`
(the code lives in doq/bench/backlog_apply.py; see its docstring for options)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.backlog_apply", run_name="__main__", alter_sys=True)
