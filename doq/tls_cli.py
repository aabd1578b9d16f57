"""`doq tls`: certificates of a secure cluster, without downtime (docs/security.md,
"Rotating certificates"). Every subcommand asks `--server` for the members (`GET
/cluster`), then talks to each member's HTTP address in turn, over HTTPS verified with
`--ca-file`, with an admin key (`--key`, `$DOQ_KEY`; `status` takes any key):

    doq tls status [--json]                     each member's certificate, expiry, trusted CAs
    doq tls renew [--node ID ...]               new key and certificate, served at once (no restart)
    doq tls reload [--node ID ...]              take tls/ files replaced by hand
    doq tls ca-rotate begin --out bundle.crt    1. a new CA on the CA holder; every member trusts old+new
    doq tls ca-rotate reissue                   2. the new CA signs; every member's certificate renewed
    doq tls ca-rotate finish --out ca.crt       3. every member drops the old CA

The CA holder is the member that holds `tls/ca.key` (the leader if it does; during a
rotation, the member where it began): it makes the next CA and signs every renewal.
Between the steps, give clients the file `begin` wrote as `--ca-file` (it verifies old and
new certificates); after `finish`, the new CA alone. Each step can be run again after a
failure (a member that was down): it does again only what is left. Exit status: 0 done,
1 refused or unreachable (the message names the member), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from doq import cluster_client as cc
from doq.client_cli import add_json_argument, add_server_argument, server_url
from doq.errors import InvalidArgument


class Failed(Exception):
    """A step could not be done; the message says where and what to do."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "tls", help="certificates of a secure cluster (status, renew, reload, ca-rotate)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="tls_command", required=True)
    s = sub.add_parser("status", help="each member's certificate, its expiry and the CAs it trusts")
    add_json_argument(s)
    for name, what in (("renew", "a new key and certificate for each member (or --node), no restart"),
                       ("reload", "each member (or --node) takes its tls/ files as they are now")):
        c = sub.add_parser(name, help=what)
        c.add_argument("--node", action="append", default=[], metavar="ID", help="only this member (repeatable)")
        add_json_argument(c)
    r = sub.add_parser("ca-rotate", help="rotate the cluster CA in three rolling steps")
    r.add_argument("step", choices=("begin", "reissue", "finish"),
                   help="begin: trust old+new; reissue: sign with the new CA, renew every member; "
                        "finish: drop the old CA")
    r.add_argument("--out", metavar="FILE", help="begin: write the trust bundle (old+new) for clients; "
                                                  "finish: write the new CA certificate")
    add_json_argument(r)
    for c in (s, *(sub.choices[n] for n in ("renew", "reload")), r):
        add_server_argument(c, "any member")
        c.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each answer")
    p.set_defaults(func=run)
    return p


def run(ns: argparse.Namespace) -> int:
    cmd = f"doq tls {ns.tls_command}" + (f" {ns.step}" if ns.tls_command == "ca-rotate" else "")
    try:
        server = server_url(str(ns.server))
    except InvalidArgument as e:
        print(f"{cmd}: {e.message}", file=sys.stderr)
        return 2
    try:
        out = _COMMANDS[ns.tls_command](ns, server)
    except Failed as e:
        print(f"{cmd}: {e}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(out))
    return 0


def _call(addr: str, method: str, path: str, body: Any = None, timeout_s: float = 60.0) -> Any:
    try:
        return cc.request_json(addr, method, path, body, timeout_s=timeout_s).body
    except cc.ClusterError as e:
        hint = {404: " (certificates are a secure cluster's: --server https://... --ca-file ca.crt)",
                401: " (an admin key is needed: --key KEY or $DOQ_KEY)",
                403: " (an admin key is needed)"}.get(e.status, "")
        raise Failed(f"{addr}{path}: {e}{hint}") from None


def _members(server: str, timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    """The members (node id, https URL) and the leader's id."""
    doc = _call(server, "GET", "/cluster", timeout_s=timeout_s)
    scheme = server.split("://", 1)[0]
    members = [{"node_id": m["node_id"], "url": f"{scheme}://{m['http_addr']}"} for m in doc["members"]
               if m.get("http_addr")]
    return members, str(doc.get("leader_id") or "")


def _statuses(members: list[dict[str, Any]], timeout_s: float) -> dict[str, dict[str, Any]]:
    return {m["node_id"]: _call(m["url"], "GET", "/cluster/tls", timeout_s=timeout_s) for m in members}


def _holder(members: list[dict[str, Any]], leader_id: str, statuses: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The member that signs: the one where a CA rotation waits (`next_ca`), else the leader
    if it holds a CA key, else the first member (by id) that holds one."""
    waiting = [m for m in members if statuses[m["node_id"]].get("next_ca")]
    holders = [m for m in members if statuses[m["node_id"]].get("signing_ca")]
    for m in (*waiting, *(m for m in holders if m["node_id"] == leader_id), *sorted(holders, key=lambda m: m["node_id"])):
        return m
    raise Failed("no member holds a CA key (tls/ca.key): certificates cannot be signed in this cluster "
                 "(in Kubernetes the Pulumi stack holds it: see docs/deploy.md)")


def _selected(members: list[dict[str, Any]], only: list[str]) -> list[dict[str, Any]]:
    unknown = sorted(set(only) - {m["node_id"] for m in members})
    if unknown:
        raise Failed(f"not a member: {', '.join(unknown)}")
    return [m for m in members if not only or m["node_id"] in only]


def _days(doc: dict[str, Any]) -> str:
    return f"{time.strftime('%Y-%m-%d', time.gmtime(doc['not_after_s']))} ({doc['days_left']} d)"


def _status(ns: argparse.Namespace, server: str) -> dict[str, Any]:
    members, _ = _members(server, ns.timeout)
    nodes = []
    for m in members:
        try:
            nodes.append(_call(m["url"], "GET", "/cluster/tls", timeout_s=ns.timeout))
        except Failed as e:
            nodes.append({"node_id": m["node_id"], "error": str(e)})
    if not ns.json:
        print(f"{'NODE':<16} {'CERTIFICATE EXPIRES':<22} {'ISSUER':<17} {'SIGNS WITH':<17} TRUSTS")
        for n in nodes:
            if "error" in n:
                print(f"{n['node_id']:<16} unreachable: {n['error']}")
                continue
            c = n["node_cert"]
            print(f"{n['node_id']:<16} {_days(c):<22} {c['issuer'][:16]:<17} {(n['signing_ca'][:16] or '-'):<17} "
                  + ", ".join(f"{ca['fingerprint'][:16]} (until {_days(ca)})" for ca in n["trusted_cas"]))
            for w in n.get("warnings", []):
                print(f"{'':<16} warning: {w}")
    return {"nodes": nodes}


def _each(ns: argparse.Namespace, server: str, path: str) -> dict[str, Any]:
    members, leader_id = _members(server, ns.timeout)
    body = None
    if path.endswith("/renew"):
        body = {"signer": _holder(members, leader_id, _statuses(members, ns.timeout))["node_id"]}
    done = []
    for m in _selected(members, ns.node):
        doc = _call(m["url"], "POST", path, body, timeout_s=ns.timeout)
        done.append(doc)
        if not ns.json:
            print(f"{doc['node_id']}: certificate until {_days(doc['node_cert'])}, issuer "
                  f"{doc['node_cert']['issuer'][:16]}")
    return {"nodes": done}


def _renew(ns: argparse.Namespace, server: str) -> dict[str, Any]:
    return _each(ns, server, "/cluster/tls/renew")


def _reload(ns: argparse.Namespace, server: str) -> dict[str, Any]:
    return _each(ns, server, "/cluster/tls/reload")


def _write(path: str | None, pem: str) -> None:
    if path:
        with open(path, "w") as f:  # certificates are public: no secret here
            f.write(pem)


def _ca_rotate(ns: argparse.Namespace, server: str) -> dict[str, Any]:
    members, leader_id = _members(server, ns.timeout)
    statuses = _statuses(members, ns.timeout)
    say = (lambda s: None) if ns.json else print
    if ns.step == "begin":
        holder = _holder(members, leader_id, statuses)
        bundle = str(_call(holder["url"], "POST", "/cluster/tls/ca/begin", timeout_s=ns.timeout)["bundle"])
        for m in members:
            if m is not holder:
                _call(m["url"], "PUT", "/cluster/tls/trust", {"bundle": bundle}, timeout_s=ns.timeout)
                say(f"{m['node_id']}: trusts the current and the next CA")
        _write(ns.out, bundle)
        say(f"step 1 of 3 done: every member trusts both CAs ({holder['node_id']} holds the next CA's key). Give "
            f"clients {ns.out or 'this bundle'} as --ca-file, then run `doq tls ca-rotate reissue` with it as --ca-file.")
        return {"bundle": bundle}
    if ns.step == "reissue":
        holder = _holder(members, leader_id, statuses)
        if statuses[holder["node_id"]].get("next_ca"):
            _call(holder["url"], "POST", "/cluster/tls/ca/promote", timeout_s=ns.timeout)
            say(f"{holder['node_id']}: signs with the next CA")
        elif len(statuses[holder["node_id"]]["trusted_cas"]) < 2:
            raise Failed("no CA rotation is under way: run `doq tls ca-rotate begin` first")
        # else: promoted by an earlier run; renew what is left
        renewed = []
        for m in [m for m in members if m is not holder] + [holder]:
            doc = _call(m["url"], "POST", "/cluster/tls/renew", {"signer": holder["node_id"]}, timeout_s=ns.timeout)
            renewed.append(doc)
            say(f"{m['node_id']}: new certificate of {doc['node_cert']['issuer'][:16]}")
        say("step 2 of 3 done: every member holds a certificate of the new CA. Run `doq tls ca-rotate finish`.")
        return {"nodes": renewed}
    # finish: every member's certificate must be of one CA (the new one), trusted alone from now on
    issuers = {st["node_cert"]["issuer"] for st in statuses.values()}
    if any(st.get("next_ca") for st in statuses.values()):
        raise Failed("the next CA does not sign yet: run `doq tls ca-rotate reissue` first")
    if len(issuers) != 1 or "" in issuers:
        raise Failed("the members' certificates are not all of one trusted CA: run `doq tls ca-rotate reissue` "
                     "(again) first")
    [issuer] = issuers
    new_ca = next((str(ca["pem"]) for st in statuses.values() for ca in st["trusted_cas"]
                   if ca["fingerprint"] == issuer), "")
    for m in members:
        _call(m["url"], "PUT", "/cluster/tls/trust", {"bundle": new_ca}, timeout_s=ns.timeout)
        say(f"{m['node_id']}: trusts the new CA only")
    _write(ns.out, new_ca)
    say(f"step 3 of 3 done: the old CA is trusted nowhere. Clients may use {ns.out or 'the new CA'} alone.")
    return {"ca_cert": new_ca}


_COMMANDS = {"status": _status, "renew": _renew, "reload": _reload, "ca-rotate": _ca_rotate}
