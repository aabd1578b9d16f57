"""`doq join-token create [--ttl-s N] [--json]`: a one-time token that enrolls a new node
in a secure cluster (docs/security.md, "Join tokens"):

    doq join-token create --server https://HOST:PORT --ca-file ca.crt
    DOQ_JOIN_TOKEN=<token> doq serve --join HOST:PORT ...     (on the new node)

`--json` prints `{"token"}`. Exit status: 0 done, 1 refused or unreachable, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doq import cluster_client as cc
from doq.client_cli import add_json_argument, add_server_argument, server_url
from doq.errors import InvalidArgument

DEFAULT_TTL_S = 3600  # as doq.tls.enrollment (not imported: building the command line stays light)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "join-token", help="join tokens for new members of a secure cluster (create)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="join_token_command", required=True)
    c = sub.add_parser("create", help="a one-time token for `doq serve --join ADDR --join-token TOKEN`")
    add_server_argument(c, "leader (with an admin key)")
    add_json_argument(c)
    c.add_argument("--ttl-s", type=int, default=DEFAULT_TTL_S, help="seconds the token stays usable")
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    p.set_defaults(func=run)
    return p


def run(ns: argparse.Namespace) -> int:
    try:
        server = server_url(str(ns.server))
    except InvalidArgument as e:
        print(f"doq join-token create: {e.message}", file=sys.stderr)
        return 2
    try:
        answer = cc.request_json(server, "POST", "/cluster/join-tokens", {"ttl_s": ns.ttl_s}, timeout_s=ns.timeout)
        token = str(answer.body["token"])
    except cc.ClusterError as e:
        hint = {404: " (join tokens need a secure cluster: --server https://... --ca-file ca.crt)",
                401: " (an admin key is needed: --key KEY or $DOQ_KEY)",
                403: " (an admin key is needed; a node without keys answers only its own machine)",
                503: f" (ask the leader{': ' + e.leader if e.leader else ''})"}.get(e.status, "")
        print(f"doq join-token create: {e}{hint}", file=sys.stderr)
        return 1
    except (KeyError, TypeError) as e:
        print(f"doq join-token create: {server}: not a token answer ({e!r})", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps({"token": token}))
    else:
        print(token)
        print(f"# one-time, valid {ns.ttl_s} s: DOQ_JOIN_TOKEN=<token> doq serve --join HOST:PORT ...",
              file=sys.stderr)
    return 0
