"""From a checkout: `python bench/e2e_stages.py ...` runs `python -m doq.bench.e2e_stages ...`
(where the end-to-end time goes, per stage; the code and its options are in
doq/bench/e2e_stages.py)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.e2e_stages", run_name="__main__", alter_sys=True)
