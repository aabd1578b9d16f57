"""The summary of benches that alternate clients run by run against one baseline
(`bench/keys_cost.py`, `bench/dashboard_cost.py`): per workload and client, the median
rate and the mean server CPU time per message, each with its difference to the baseline."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

Runs = dict[str, dict[str, list[dict[str, Any]]]]
"""client name -> workload -> the `side_by_side.run_once` records of its runs"""


def summarize(runs: Runs, names: Sequence[str], workloads: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(summary for the JSON file, one printed line per workload); `names[0]` is the baseline."""
    summary: dict[str, dict[str, Any]] = {}
    lines = []
    for workload in workloads:
        base = statistics.median(r["msg_per_s"] for r in runs[names[0]][workload])
        base_cpu = statistics.mean(r["server_cpu_us_per_msg"] or 0 for r in runs[names[0]][workload])
        parts = []
        for name in names:
            rate = statistics.median(r["msg_per_s"] for r in runs[name][workload])
            cpu = statistics.mean(r["server_cpu_us_per_msg"] or 0 for r in runs[name][workload])
            summary.setdefault(workload, {})[name] = {"msg_per_s": rate, "server_cpu_us_per_msg_mean": cpu}
            parts.append(f"{name} {rate:,.0f} msg/s ({(rate - base) / base * 100:+.1f} %), server {cpu:.2f} us/msg"
                         + (f" ({(cpu - base_cpu) / base_cpu * 100:+.1f} %)" if base_cpu else ""))
        lines.append(f"{workload}: " + "; ".join(parts))
    return summary, lines
