"""From a checkout: `python bench/side_by_side.py ...` runs `python -m doq.bench.side_by_side ...`
(doq next to RabbitMQ's quorum queue; the code and its options are in doq/bench/side_by_side.py)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]
runpy.run_module("doq.bench.side_by_side", run_name="__main__", alter_sys=True)
