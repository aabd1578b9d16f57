"""The `doq` command: serve | bench | backup | restore | verify | cluster | queues | enqueue |
dequeue | top."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from doq import __version__
from doq.config import add_serve_arguments, load_config
from doq.errors import DoqError


def _cmd_serve(ns: argparse.Namespace) -> int:
    import asyncio

    from doq.server import StartupError, serve

    try:
        config = load_config(ns)
    except DoqError as e:
        print(f"doq serve: {e.message}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config))
    except StartupError as e:
        print(f"doq serve: {e}", file=sys.stderr)
        return 1
    # Everything is committed and closed. Skip the interpreter's final garbage collection
    # of the web/gRPC stacks' objects: it costs seconds of CPU and holds up restarts.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for on/off flags and options without one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default is None or action.default == []:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every `doq` command's parser: `--help` shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="doq", description="doq: a durable, replicated queue service",
                     epilog="Flags without a command run `doq serve` with them, so the seed's "
                            "`doq --storage.data_dir data --cluster.node_id node-1 --http.port 8001 ...` "
                            "runs a node.")
    parser.add_argument("--version", action="version", version=f"doq {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser(
        "serve", help="run a node (single-node cluster by default)",
        description="Run a node. Each flag is also DOQ_<FLAG> in the environment or a key in the "
                    "--config TOML file (flags > environment > file > defaults).",
    )
    add_serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)
    from doq.bench import cli as bench_cli

    bench_cli.add_parser(sub)
    from doq.backup import cli as backup_cli  # doq backup | doq restore

    backup_cli.add_parser(sub)
    from doq.backup import verify_cli  # doq verify

    verify_cli.add_parser(sub)
    from doq import cluster_cli  # doq cluster status | remove | transfer

    cluster_cli.add_parser(sub)
    from doq import queue_cli  # doq queues ... | enqueue | dequeue | top

    queue_cli.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `doq`; flags without a command (the seed's `doq --cluster.node_id ...`) mean `serve`."""
    parser = build_parser()
    args = sys.argv[1:] if argv is None else argv
    if args and args[0].startswith("--") and args[0] not in ("--help", "--version"):
        args = ["serve", *args]
    ns = parser.parse_args(args)
    try:
        return int(ns.func(ns) or 0)
    except BrokenPipeError:
        # The reader went away (`doq queues list | head -1`): not an error of ours. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
