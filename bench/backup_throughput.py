"""From a checkout: `python bench/backup_throughput.py ...` runs `python -m doq.bench.backup ...`
(the code lives in doq/bench/backup.py; see its docstring for options)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.backup", run_name="__main__", alter_sys=True)
