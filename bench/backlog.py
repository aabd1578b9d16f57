"""From a checkout: `python bench/backlog.py ...` runs `python -m doq.bench.backlog ...`
(the code lives in doq/bench/backlog.py; see its docstring for options)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.backlog", run_name="__main__", alter_sys=True)
