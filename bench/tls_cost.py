"""What security (`doq serve --secure`: TLS on the client port, a key checked per stream)
costs the per-message producer and consumer of `bench/side_by_side.py`, as many
interleaved pairs of runs in one go, so the machine's load drifts over both alike.

    python bench/tls_cost.py [--pairs 15] [--count 50000] [--consume-count 30000] [--json FILE]

Two fresh one-node servers, `doq` (loopback, plain gRPC, no key) and `doq-tls`
(`--secure`: the clients verify the node with the cluster CA and present the admin key);
each pair is one run of a workload on each (the order alternates pair by pair). Prints, per
workload and figure (msg/s; server CPU µs per message), each system's median, quartiles
and range, and the median of the per-pair ratios `doq-tls / doq` with their quartiles (a
pair's two runs are seconds apart: the ratio cancels most of the load's drift); and the
load average over the run. `--json FILE` writes every run and the summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from bench import side_by_side as sbs

SYSTEMS = ["doq", "doq-tls"]
WORKLOADS = ("producer", "consumer")
FIGURES = ("msg_per_s", "server_cpu_us_per_msg")


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile) of `values` (at least one)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def summarize_pairs(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per workload and figure: each system's quartiles and range, and the
    quartiles of the per-pair ratios doq-tls / doq (pair i: run i of each)."""
    rows = []
    for w in WORKLOADS:
        plain, tls = runs.get(f"doq/{w}", []), runs.get(f"doq-tls/{w}", [])
        for fig in FIGURES:
            row: dict[str, Any] = {"workload": w, "figure": fig, "pairs": min(len(plain), len(tls))}
            for name, rs in (("doq", plain), ("doq-tls", tls)):
                vals = [float(r[fig]) for r in rs if r.get(fig)]
                if vals:
                    q1, med, q3 = _quartiles(vals)
                    row[name] = {"median": med, "q1": q1, "q3": q3, "min": min(vals), "max": max(vals)}
            ratios = [float(b[fig]) / float(a[fig]) for a, b in zip(plain, tls, strict=False) if a.get(fig) and b.get(fig)]
            if ratios:
                q1, med, q3 = _quartiles(ratios)
                row["ratio"] = {"median": med, "q1": q1, "q3": q3, "min": min(ratios), "max": max(ratios)}
            rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]], record: dict[str, Any]) -> str:
    def cell(d: dict[str, float] | None, unit: str) -> str:
        if not d:
            return "-"
        fmt = (lambda v: f"{v / 1000:.1f}k") if unit == "k" else (lambda v: f"{v:.2f}")
        return f"{fmt(d['median'])} (IQR {fmt(d['q1'])}-{fmt(d['q3'])}, range {fmt(d['min'])}-{fmt(d['max'])})"

    lines = ["| workload | figure | doq | doq-tls | per-pair doq-tls / doq: median (IQR, range) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        unit = "k" if r["figure"] == "msg_per_s" else ""
        ratio = r.get("ratio")
        rtext = (f"{ratio['median']:.3f} (IQR {ratio['q1']:.3f}-{ratio['q3']:.3f}, range {ratio['min']:.2f}-"
                 f"{ratio['max']:.2f})") if ratio else "-"
        lines.append(f"| {r['workload']} | {r['figure']} | {cell(r.get('doq'), unit)} | "
                     f"{cell(r.get('doq-tls'), unit)} | {rtext} |")
    loads = [r["loadavg"] for rs in record["runs"].values() for r in rs]
    lb, la = record["loadavg_before"], record["loadavg_after"]
    lines.append(f"{rows[0]['pairs']} pairs per workload; commit {record['commit']}; load average (1 min) before "
                 f"{lb[0]:.2f}, during {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f}), "
                 f"after {la[0]:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tls_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=15, help="runs of each workload on each system")
    p.add_argument("--count", type=int, default=50_000, help="messages per producer run")
    p.add_argument("--consume-count", type=int, default=30_000, help="messages per consumer run")
    p.add_argument("--payload-bytes", type=int, default=sbs.Args.payload_bytes)
    p.add_argument("--json", metavar="FILE", help="also write every run and the summary here")
    a = p.parse_args(argv)
    args = sbs.Args(count=a.count, consume_count=a.consume_count, payload_bytes=a.payload_bytes, runs=a.pairs,
                    workloads=WORKLOADS)
    record = sbs.side_by_side(args, SYSTEMS, log=lambda line: print(line, file=sys.stderr, flush=True))
    record["pairs_summary"] = summarize_pairs(record["runs"])
    print(format_rows(record["pairs_summary"], record))
    if a.json:
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
