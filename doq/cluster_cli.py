"""`doq cluster status | remove ID | transfer [ID]`: membership and leadership of a running cluster.

    doq cluster status [--server URL] [--json]     members, roles, reachability, last contact,
                                                   match index and lag, addresses, leader, indexes
                                                   ("?": the answering node cannot know: a
                                                   follower knows itself and its leader; ask the
                                                   leader for everyone)
    doq cluster remove ID [--server URL] [--json]  remove a member
    doq cluster transfer [ID] [--server URL] [--json]
                                                   hand leadership to ID (default: the most
                                                   up-to-date voter)

`--server` is any member's HTTP URL (or HOST:PORT): default `$DOQ_SERVER`, else
http://127.0.0.1:8000. Exit status: 0 done, 1 refused or unreachable, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doq import cluster_client as cc
from doq.client_cli import add_json_argument, add_server_argument, server_url
from doq.errors import InvalidArgument
from doq.node.cluster import ClusterStatus
from doq.units import format_size


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `doq cluster` on the `doq` command's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "cluster", help="cluster membership and leadership (status | remove ID | transfer [ID])",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    add_server_argument(common, "member to ask (any)")
    add_json_argument(common)
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    sub = p.add_subparsers(dest="cluster_command", required=True)
    sub.add_parser("status", parents=[common], help="members, roles, addresses, leader, term and indexes")
    rm = sub.add_parser("remove", parents=[common], help="remove a member from the cluster")
    rm.add_argument("node_id", metavar="ID")
    tr = sub.add_parser("transfer", parents=[common], help="transfer leadership (to ID, or the best voter)")
    tr.add_argument("node_id", metavar="ID", nargs="?", default=None)
    p.set_defaults(func=run)
    return p


def run(ns: argparse.Namespace) -> int:
    try:
        server = server_url(str(ns.server))
    except InvalidArgument as e:
        print(f"doq cluster {ns.cluster_command}: {e.message}", file=sys.stderr)
        return 2
    try:
        if ns.cluster_command == "status":
            status = cc.get_status(server, ns.timeout)
            print(json.dumps(cc.status_to_json(status), indent=2) if ns.json else format_status(status))
        elif ns.cluster_command == "remove":
            cc.remove_member(server, ns.node_id, ns.timeout)
            print(json.dumps({"success": True, "removed": ns.node_id}) if ns.json else f"removed {ns.node_id}")
        else:
            leader = cc.transfer_leader(server, ns.node_id, ns.timeout)
            print(json.dumps({"success": True, "leader_id": leader}) if ns.json else f"leader is now {leader}")
    except cc.ClusterError as e:
        where = f" (leader: {e.leader})" if e.leader else ""
        print(f"doq cluster {ns.cluster_command}: {e}{where}", file=sys.stderr)
        return 1
    except ValueError as e:  # a 2xx answer that is not what /cluster answers
        print(f"doq cluster {ns.cluster_command}: {cc.base_url(server)}: {e}", file=sys.stderr)
        return 1
    return 0


def _num(n: int | None) -> str:
    return "?" if n is None else str(n)


def _ago(ms: int) -> str:
    if ms == 0:
        return "-"
    return f"{ms} ms ago" if ms < 10_000 else f"{ms // 1000} s ago"


def format_status(s: ClusterStatus) -> str:
    """The human form of a status: a summary line, then one row per member."""
    leader = s.leader_id or "(none known)"
    lines = [
        f"leader {leader}, term {s.term}; seen by {s.node_id} ({s.role}): "
        f"commit {s.commit_index}, applied {s.applied_index}",
    ]
    rows = [("NODE", "ROLE", "REACHABLE", "LAST CONTACT", "MATCH", "LAG", "RAFT", "GRPC", "HTTP")]
    for m in s.members:
        role = f"{m.role}, leader" if m.node_id == s.leader_id else m.role
        reachable = "?" if m.reachable is None else ("yes" if m.reachable else "NO")
        contact = "?" if m.last_contact_ms is None else _ago(m.last_contact_ms)
        rows.append((m.node_id, role, reachable, contact, _num(m.match_index), _num(m.lag),
                     m.addrs.raft_addr or "-", m.addrs.grpc_addr or "-", m.addrs.http_addr or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if s.storage is not None:
        u = s.storage
        free = "not measured yet" if u.disk_free_bytes is None else f"{format_size(u.disk_free_bytes)} free"
        lines.append(f"storage of {s.node_id}: {format_size(u.used_bytes)} of {format_size(u.max_bytes)} "
                     f"used; disk {free} (limit {format_size(u.disk_free_limit_bytes)})")
    lines += [f"ALARM {node} {reason}: {message}" for node, reason, message in s.alarms]
    return "\n".join(lines)
