"""`doq keys create | list | revoke`: client keys of a running cluster (needs an admin key).

    doq keys create --scope SCOPE [--scope SCOPE ...] [--json]   a new key, printed once
    doq keys list [--json]                                        ids, scopes, creation times
    doq keys revoke ID                                            every member refuses it then

Scopes: admin, produce[:PREFIX], consume[:PREFIX], backup, restore, metrics. `--server`
is any member's HTTP URL (default `$DOQ_SERVER`); `--key` the admin key (default
`$DOQ_KEY`; a bootstrapped secure node wrote it to DATA_DIR/admin.key). Exit status: 0
done, 1 refused or unreachable, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any
from urllib.parse import quote

from doq import cluster_client as cc
from doq.client_cli import add_json_argument, add_server_argument, server_url
from doq.errors import InvalidArgument


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "keys", help="client keys (create | list | revoke)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    add_server_argument(common, "member to ask (any)")
    add_json_argument(common)
    sub = p.add_subparsers(dest="keys_command", required=True)
    cr = sub.add_parser("create", parents=[common], help="create a key (printed once)")
    cr.add_argument("--scope", action="append", required=True, metavar="SCOPE",
                    help="admin | produce[:PREFIX] | consume[:PREFIX] | backup | restore | metrics (repeatable)")
    sub.add_parser("list", parents=[common], help="list keys (never the keys themselves)")
    rv = sub.add_parser("revoke", parents=[common], help="revoke a key")
    rv.add_argument("key_id", metavar="ID")
    p.set_defaults(func=run)
    return p


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def run(ns: argparse.Namespace) -> int:
    try:
        server = server_url(str(ns.server))
    except InvalidArgument as e:
        print(f"doq keys {ns.keys_command}: {e.message}", file=sys.stderr)
        return 2
    try:
        if ns.keys_command == "create":
            doc = cc.request_json(server, "POST", "/API/v1/keys", {"scopes": ns.scope}).body
            if ns.json:
                print(json.dumps({"id": doc["id"], "key": doc["key"], "scopes": doc["scopes"]}))
            else:
                print(f"key {doc['id']} ({', '.join(doc['scopes'])}); shown this once, keep it:\n{doc['key']}")
        elif ns.keys_command == "list":
            keys = cc.request_json(server, "GET", "/API/v1/keys").body["keys"]
            if ns.json:
                print(json.dumps({"keys": keys}))
            else:
                rows = [("ID", "SCOPES", "CREATED")] + [(k["id"], ",".join(k["scopes"]), _when(k["created_ms"]))
                                                        for k in keys]
                widths = [max(len(r[i]) for r in rows) for i in range(3)]
                for r in rows:
                    print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        else:
            cc.request_json(server, "DELETE", f"/API/v1/keys/{quote(ns.key_id, safe='')}")
            print(json.dumps({"success": True, "revoked": ns.key_id}) if ns.json else f"revoked {ns.key_id}")
    except cc.ClusterError as e:
        print(f"doq keys {ns.keys_command}: {e}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as e:
        print(f"doq keys {ns.keys_command}: {cc.base_url(server)}: unexpected answer: {e}", file=sys.stderr)
        return 1
    return 0
