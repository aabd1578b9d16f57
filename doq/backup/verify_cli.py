"""`doq verify` (hooked into `doq.cli` by `add_parser`); `backup/verify_job.py` runs `main`
under spark-submit with the same arguments.

    doq verify FILE [FILE ...] | --dir DIR [--against URL] [--master local[*]]
               [--report out.json] [--json] [--conf KEY=VALUE ...]

Prints the JSON report (to stdout, or to --report FILE and a summary line on stdout) and,
when stderr is a terminal, progress lines there (records, frames, rate, time left). Exit status: 0 only when everything verified, 1 when something did
not (the report names it), 2 for bad arguments or when Spark is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from doq.client_cli import SERVER_ENV, add_key_argument

MAX_FAILURE_LINES = 20


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the `verify` subcommand."""
    p = sub.add_parser(
        "verify", help="verify a chain of backup files with Spark (rebuild the state, prove its digest)",
        description="Verify backup files with the PySpark job (backup/): checksums, counts and chain "
                    "rules, then rebuild the state the chain describes and prove its digest equal to "
                    "the one the node recorded (and, with --against, to a live node's state now).")
    add_arguments(p)
    p.set_defaults(func=cmd_verify)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help="the chain in order: the full backup, then incrementals")
    p.add_argument("--dir", metavar="DIR", help="verify the chain kept in DIR (written by `doq backup --dir`)")
    p.add_argument("--against", metavar="URL",
                   help="also take an incremental from this live node since the chain's last version and "
                        f"prove the chain equal to its state now (URL as --server elsewhere; ${SERVER_ENV} "
                        "is not used implicitly)")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default: the configured one, e.g. by spark-submit, else local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    p.add_argument("--report", metavar="FILE", help="write the JSON report to FILE (stdout gets one summary line)")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout (the default without --report)")
    p.add_argument("--frames-per-task", type=int, default=None,
                   help="frames per Spark task (default: ~64 MB of frames, at least 3 tasks per core)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (shown only on a terminal anyway)")
    p.add_argument("--timeout", type=float, default=3600.0, help="HTTP timeout for --against, seconds")
    add_key_argument(p)


def progress_shown(ns: argparse.Namespace) -> bool:
    """Progress lines on stderr: when it is a terminal (or DOQ_PROGRESS=1), not with
    `--quiet` or `--json` (`doq.progress.wanted`)."""
    from doq import progress

    return not ns.quiet and progress.wanted(ns.json)


def _fail(message: str, code: int = 2) -> int:
    print(f"doq verify: {message}", file=sys.stderr)
    return code


def cmd_verify(ns: argparse.Namespace) -> int:
    from doq.backup.chain_dir import chain_files

    if bool(ns.files) == bool(ns.dir):
        return _fail("give the backup files in order, or --dir DIR (one of them)")
    if ns.dir is not None:
        d = Path(ns.dir)
        if not d.is_dir():
            return _fail(f"{d} is not a directory")
        paths = [str(p) for p in chain_files(d)]
        if not paths:
            return _fail(f"{d} holds no backup chain (files NNNNNN-*.bak written by `doq backup --dir`)", 1)
    else:
        paths = list(ns.files)
    if ns.frames_per_task is not None and ns.frames_per_task < 1:
        return _fail("--frames-per-task must be >= 1")
    conf = {}
    for item in ns.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _fail(f"--conf needs KEY=VALUE, got {item!r}")
        conf[key] = value
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return _fail("PySpark is not installed: pip install 'doq-server[spark]' (and a Java runtime)")
    from pyspark.sql import SparkSession

    from doq.backup.spark import spark_session
    from doq.backup.verify import verify

    progress = sys.stderr if progress_shown(ns) else None
    active = SparkSession.getActiveSession()  # in-process callers (tests) bring their own
    spark = active if active is not None else spark_session(ns.master, conf)
    try:
        report = verify(paths, spark=spark, against=ns.against, frames_per_task=ns.frames_per_task,
                        progress=progress, timeout_s=ns.timeout)
    finally:
        if active is None:
            spark.stop()
    doc = report.to_dict()
    text = json.dumps(doc, indent=2)
    if ns.report:
        Path(ns.report).write_text(text + "\n")
    if ns.json or not ns.report:
        print(text, flush=True)
    else:
        print(report.summary_line(), flush=True)
    if not ns.quiet:
        for f in report.failures[:MAX_FAILURE_LINES]:
            print(f"doq verify: {f.line()}", file=sys.stderr)
        more = len(report.failures) - MAX_FAILURE_LINES + report.failures_dropped
        if more > 0:
            print(f"doq verify: ... and {more} more failures (see the report)", file=sys.stderr)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """`spark-submit backup/verify_job.py ARGS` (the same arguments as `doq verify`)."""
    p = argparse.ArgumentParser(prog="verify_job.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    ns = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return cmd_verify(ns)
