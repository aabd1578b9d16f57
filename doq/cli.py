"""The `doq` command: serve | k8s-start | bench | backup | restore | verify | cluster | keys |
join-token | tls | queues | enqueue | dequeue | peek | top."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from doq import __version__
from doq.config import ServeConfig, add_serve_arguments, load_config
from doq.errors import DoqError

DEFAULT_SECRET_POLL_S = 10.0  # how often a pod looks for an updated TLS Secret (kubelet: ~1 min)


def _cmd_serve(ns: argparse.Namespace) -> int:
    try:
        config = load_config(ns)
    except DoqError as e:
        print(f"doq serve: {e.message}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return _serve(config)


def _cmd_k8s_start(ns: argparse.Namespace) -> int:
    """`doq k8s-start`: decide restart / join / bootstrap (`doq.k8s_start`), then serve."""
    from doq import k8s_start

    try:
        config = load_config(ns)
        seed = ns.seed or os.environ.get("DOQ_SEED") or k8s_start.default_seed(config.node_id)
    except (DoqError, ValueError) as e:
        print(f"doq k8s-start: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    secret = None
    try:
        if tls_dir := ns.tls_secret_dir or os.environ.get("DOQ_K8S_TLS_DIR"):
            k8s_start.install_tls(config, Path(tls_dir))
            poll_s = ns.tls_secret_poll_s or _positive_seconds(os.environ.get("DOQ_K8S_TLS_POLL_S")
                                                               or str(DEFAULT_SECRET_POLL_S))
            secret = (Path(tls_dir), poll_s)
        config, decision = k8s_start.plan(config, seed)
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"doq k8s-start: {e}", file=sys.stderr)
        return 2
    print(f"doq k8s-start: {config.node_id} (seed {seed}): {decision.action}: {decision.why}", flush=True)
    return _serve(config, tls_secret=secret)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _serve(config: ServeConfig, tls_secret: tuple[Path, float] | None = None) -> int:
    import asyncio

    from doq.server import StartupError, serve

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config, tls_secret=tls_secret))
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
    k8s = sub.add_parser(
        "k8s-start", help="a StatefulSet pod's start: restart, join, or (the seed, once) bootstrap",
        description="Decide how this pod starts, then run `doq serve`: a store with data restarts; "
                    "any pod but the seed joins (--join); the seed with an empty store bootstraps only "
                    "when every other --join address answers that its store is empty, joins when any "
                    "belongs to a cluster, and waits while any is silent. Takes the flags of `doq serve`.",
    )
    add_serve_arguments(k8s)
    k8s.add_argument("--seed", default=None, help="node id of the pod that may bootstrap (env DOQ_SEED; "
                                                  "default: ordinal 0 of --node-id, e.g. doq-0)")
    k8s.add_argument("--tls-secret-dir", default=None,
                     help="directory of the cluster's TLS Secret (ca.crt, NODE_ID.crt, NODE_ID.key), installed "
                          "as this node's tls/ at every start and taken again when kubelet updates it "
                          "(env DOQ_K8S_TLS_DIR; docs/deploy.md)")
    k8s.add_argument("--tls-secret-poll-s", type=_positive_seconds, default=None,
                     help="how often to look for an updated --tls-secret-dir while serving (env "
                          f"DOQ_K8S_TLS_POLL_S; default {DEFAULT_SECRET_POLL_S:g})")
    k8s.set_defaults(func=_cmd_k8s_start)
    from doq.bench import cli as bench_cli

    bench_cli.add_parser(sub)
    from doq.backup import cli as backup_cli  # doq backup | doq restore

    backup_cli.add_parser(sub)
    from doq.backup import verify_cli  # doq verify

    verify_cli.add_parser(sub)
    from doq import cluster_cli  # doq cluster status | remove | transfer

    cluster_cli.add_parser(sub)
    from doq import join_token_cli  # doq join-token create

    join_token_cli.add_parser(sub)
    from doq import keys_cli  # doq keys create | list | revoke

    keys_cli.add_parser(sub)
    from doq import tls_cli  # doq tls status | renew | reload | ca-rotate

    tls_cli.add_parser(sub)
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
    from doq.client_cli import KeyInClear

    if ns.command != "serve":
        from doq.client_cli import use_key

        use_key(getattr(ns, "key", None))  # commands without --key still honour $DOQ_KEY
    if getattr(ns, "ca_file", None):  # a client command: HTTPS verified with the cluster CA
        from doq.client_cli import use_ca_file

        try:
            use_ca_file(ns.ca_file)
        except DoqError as e:
            print(f"doq: {e.message}", file=sys.stderr)
            return 2
    if getattr(ns, "connect_timeout", None) is not None:  # a client command (`--server`)
        from doq.client_cli import use_connect_timeout

        try:
            use_connect_timeout(ns.connect_timeout)
        except DoqError as e:
            print(f"doq {ns.command}: {e.message}", file=sys.stderr)
            return 2
    try:
        return int(ns.func(ns) or 0)
    except KeyInClear as e:  # raised by any request of the command (the key would go in clear)
        print(f"doq {ns.command}: {e.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `doq cluster status | head -1`: the reader left; not an error of ours
        # stdout is gone: point it at /dev/null so the interpreter's final flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped


if __name__ == "__main__":
    sys.exit(main())
