"""`doq bench` on the `doq` command line: its arguments (`doq.bench.args`); the load
generator is imported only when the command runs, so building the `doq` command line
(every `doq serve`, `doq backup`...) does not import the client stack."""

from __future__ import annotations

import argparse
from typing import Any

from doq.bench.args import add_arguments


def _cmd_bench(ns: argparse.Namespace) -> int:
    from doq.bench.grpc_load import run_from_args

    return run_from_args(ns)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `doq bench` on the `doq` command's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench", help="load generator: throughput and latency (a line per run, or JSON with --json)"
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_bench)
    return p
