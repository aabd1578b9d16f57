"""Everyday queue work from the shell, over a node's HTTP gateway (`/API/v1`).

    doq queues list                                   every queue with its counts
    doq queues create NAME --type delayed|fair [settings...]
    doq queues delete NAME
    doq queues purge NAME                             remove every message, keep the queue
    doq queues stats NAME                             one queue's settings and counts
    doq queues redrive NAME [--to QUEUE] [--rate N] [--wait]
                                                      move a dead-letter queue's messages back
    doq queues redrive NAME --status | --cancel       its progress; stop it
    doq enqueue QUEUE CONTENT [--group G] [--priority P] [--delay-ms N] [--dedup-id ID]
    doq dequeue QUEUE [-n N] [--ack] [--wait-ms MS]   lease (or with --ack take) messages
    doq peek QUEUE [-n N] [--state S] [--offset K]    look at messages without taking them
    doq top [--interval S]                            live view of the queues table

Every command takes `--server URL` (any member; default `$DOQ_SERVER`, else
http://127.0.0.1:8000) and prints a table for people or, with `--json`, one JSON document.
Exit status: 0 done, 1 refused by the server or unreachable, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from doq.client_cli import add_json_argument, add_server_argument, describe_error, server_url
from doq.errors import InvalidArgument

API = "/API/v1"
QUEUE_COLUMNS = ("NAME", "TYPE", "READY", "DELAYED", "IN FLIGHT", "DEAD", "TOTAL")


class CommandFailed(Exception):
    """A request the server refused or that could not be sent; the message names the URL."""


@dataclass(frozen=True)
class Gateway:
    """A node's HTTP gateway: JSON requests with one timeout; errors as `CommandFailed`."""

    base_url: str
    timeout_s: float

    def call(self, method: str, path: str, body: Any = None) -> Any:
        url = self.base_url + API + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
        except (OSError, ValueError) as e:
            raise CommandFailed(describe_error(url, e)) from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise CommandFailed(f"{url}: the answer is not JSON (is this a doq node's HTTP address?)") from None


def queue_path(name: str, *rest: str) -> str:
    return "/queues/" + "/".join(urllib.parse.quote(p, safe="") for p in (name, *rest))


# -- the commands -----------------------------------------------------------------------------
def all_queues(gw: Gateway) -> list[dict[str, Any]]:
    """Every queue, by name: the pages of `GET /queues` followed to the last."""
    queues: list[dict[str, Any]] = []
    token = None
    while True:
        doc = gw.call("GET", "/queues" + (f"?page_token={urllib.parse.quote(token)}" if token else ""))
        queues += doc.get("queues", [])
        token = doc.get("next_page_token")
        if not token:
            return queues


def cmd_list(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    queues = all_queues(gw)
    return queues_table(queues), {"queues": queues}


def cmd_create(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    settings = {k: v for k, v in (
        ("visibility_timeout_ms", ns.visibility_timeout_ms),
        ("max_attempts", ns.max_attempts),
        ("dead_letter_queue", ns.dead_letter_queue),
        ("max_unacked_per_group", ns.max_unacked_per_group),
        ("dedup_window_ms", ns.dedup_window_ms),
        ("default_group_weight", ns.default_group_weight),
        ("default_group_max_per_second", ns.default_group_max_per_second),
    ) if v is not None}
    body: dict[str, Any] = {"name": ns.name, "type": ns.type}
    if settings:
        body["settings"] = settings
    doc = gw.call("POST", "/queues", body)
    return f"created {ns.type} queue {ns.name}", doc.get("queue", doc)


def cmd_delete(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    gw.call("DELETE", queue_path(ns.name))
    return f"deleted queue {ns.name}", {"success": True, "deleted": ns.name}


def cmd_purge(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    doc = gw.call("POST", queue_path(ns.name, "purge"))
    n = int(doc.get("purged", 0))
    return f"purged {n} message{'s' if n != 1 else ''} from {ns.name}", doc


def cmd_stats(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    q = gw.call("GET", queue_path(ns.name))
    stats, settings = q.get("stats", {}), q.get("settings", {})
    rows = [("queue", q.get("name", ns.name)), ("type", q.get("type", "?"))]
    rows += [(k.replace("_", " "), str(v)) for k, v in stats.items()]
    rows += [(k.replace("_", " "), str(v)) for k, v in settings.items()]
    return render_table(("FIELD", "VALUE"), rows), q


def _redrive_line(t: dict[str, Any]) -> str:
    rate = f"{t.get('max_per_second')}/s" if t.get("max_per_second") else "no rate limit"
    why = f" ({t['reason']})" if t.get("reason") else ""
    return (f"redrive {t.get('queue')} -> {t.get('to')}: {t.get('state')}{why}, moved {t.get('moved')}, "
            f"remaining {t.get('remaining')} of {t.get('total')}, {rate}")


def cmd_redrive(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    """Start (POST), read (--status: GET) or cancel (--cancel: DELETE) a queue's redrive;
    --wait follows it until it ends (printing its progress on stderr)."""
    path = queue_path(ns.name, "redrive")
    if ns.cancel or ns.status:
        if ns.to is not None or ns.rate is not None:
            raise InvalidArgument("--to and --rate start a redrive: not with --status or --cancel")
        t = gw.call("DELETE" if ns.cancel else "GET", path)
    else:
        body: dict[str, Any] = {}
        if ns.to is not None:
            body["to"] = ns.to
        if ns.rate is not None:
            body["max_per_second"] = ns.rate
        t = gw.call("POST", path, body)
    while ns.wait and t.get("state") == "running":
        print(_redrive_line(t), file=sys.stderr)
        time.sleep(ns.interval)
        t = gw.call("GET", path)
    return _redrive_line(t), t


def cmd_enqueue(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    body: dict[str, Any] = {"content": ns.content, "group": ns.group, "priority": ns.priority,
                            "delay_ms": ns.delay_ms}
    if ns.dedup_id:
        body["dedup_id"] = ns.dedup_id
    doc = gw.call("POST", queue_path(ns.queue, "messages"), body)
    dup = " (duplicate: the original message)" if doc.get("duplicate") else ""
    return f"enqueued {doc.get('id')} to {ns.queue}{dup}", doc


def cmd_dequeue(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    body = {"max_messages": ns.n, "wait_ms": ns.wait_ms, "ack": ns.ack}
    doc = gw.call("POST", queue_path(ns.queue, "messages:dequeue"), body)
    messages = doc.get("messages", [])
    if not messages:
        return f"no message ready in {ns.queue}", {"messages": []}
    return messages_table(messages, leased=not ns.ack), {"messages": messages}


def cmd_peek(gw: Gateway, ns: argparse.Namespace) -> tuple[str, Any]:
    query = urllib.parse.urlencode({"state": ns.state, "offset": ns.offset, "limit": ns.n})
    doc = gw.call("GET", queue_path(ns.queue, "messages:peek") + "?" + query)
    messages = doc.get("messages", [])
    if not messages:
        return f"no {ns.state.replace('_', ' ')} message in {ns.queue}", doc
    return messages_table(messages, leased=ns.state == "in_flight"), doc


def queues_table(queues: Sequence[dict[str, Any]]) -> str:
    rows = []
    for q in queues:
        s = q.get("stats", {})
        rows.append((q.get("name", ""), q.get("type", ""), *(str(s.get(k, 0)) for k in
                     ("ready", "delayed", "in_flight", "dead", "total"))))
    if not rows:
        return "no queues"
    return render_table(QUEUE_COLUMNS, rows)


def messages_table(messages: Sequence[dict[str, Any]], leased: bool) -> str:
    head = ("ID", "GROUP", "PRIORITY", "ATTEMPTS", "LEASE ID", "CONTENT") if leased else \
        ("ID", "GROUP", "PRIORITY", "ATTEMPTS", "CONTENT")
    rows = []
    for msg in messages:
        row = [str(msg.get("id", "")), msg.get("group", ""), str(msg.get("priority", 0)),
               str(msg.get("attempts", 0))]
        if leased:
            row.append(str(msg.get("lease_id", "")))
        content = msg.get("content", "")
        row.append(content if msg.get("content_encoding") != "base64" else f"(base64) {content}")
        rows.append(tuple(row))
    return render_table(head, rows)


def render_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table drawn by rich: a header row, aligned columns, no colour and no box
    (easy to read, to grep and to cut)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(*head, box=None, show_edge=False, pad_edge=False, header_style="")
    for row in rows:
        table.add_row(*row)
    console = Console(width=200, no_color=True, highlight=False, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return "\n".join(line.rstrip() for line in cap.get().splitlines() if line.strip())


def cmd_top(gw: Gateway, ns: argparse.Namespace) -> int:
    """Refresh the queues table every `--interval` seconds until Ctrl-C (or `--iterations`)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()

    def frame() -> Text:
        try:
            body = queues_table(all_queues(gw))
        except CommandFailed as e:
            body = f"(refresh failed) {e}"
        stamp = time.strftime("%H:%M:%S")
        return Text(f"doq top — {gw.base_url} — {stamp} (Ctrl-C to quit)\n\n{body}")

    if ns.json:  # one JSON document per refresh, for scripts
        return _repeat(ns, lambda: print(json.dumps({"queues": all_queues(gw)}), flush=True))
    with Live(frame(), console=console, auto_refresh=False, transient=False) as live:
        return _repeat(ns, lambda: live.update(frame(), refresh=True))


def _repeat(ns: argparse.Namespace, step: Callable[[], None]) -> int:
    count = 0
    try:
        while ns.iterations <= 0 or count < ns.iterations:
            step()
            count += 1
            if ns.iterations <= 0 or count < ns.iterations:
                time.sleep(ns.interval)
    except KeyboardInterrupt:
        pass
    return 0


# -- parsers ------------------------------------------------------------------------------------
def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_server_argument(common, "node to ask (any member)")
    add_json_argument(common)
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer")
    return common


def add_parsers(sub: Any) -> None:
    """Register `doq queues`, `doq enqueue`, `doq dequeue`, `doq peek` and `doq top`."""
    common = _common()
    q = sub.add_parser("queues", help="list, create, delete, purge queues; a queue's stats",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    qs = q.add_subparsers(dest="queues_command", required=True)
    qs.add_parser("list", parents=[common], help="every queue with its counts").set_defaults(run=cmd_list)
    create = qs.add_parser("create", parents=[common], help="create a queue")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--type", choices=("delayed", "fair"), default="delayed",
                        help="delayed: by priority (and time); fair: round-robin by group")
    create.add_argument("--visibility-timeout-ms", type=int, help="lease length (default 30000)")
    create.add_argument("--max-attempts", type=int, help="deliveries before dead-lettering (0 = unlimited)")
    create.add_argument("--dead-letter-queue", metavar="QUEUE", help="where messages past max attempts go")
    create.add_argument("--max-unacked-per-group", type=int, help="fair queues: in-flight limit per group")
    create.add_argument("--dedup-window-ms", type=int, help="how long a dedup id is remembered")
    create.add_argument("--default-group-weight", type=int,
                        help="fair queues: a group's deliveries per turn unless its own (default 1)")
    create.add_argument("--default-group-max-per-second", type=int,
                        help="fair queues: a group's deliveries per second unless its own (0 = no limit)")
    create.set_defaults(run=cmd_create)
    for name, fn, text in (("delete", cmd_delete, "delete a queue and its messages"),
                           ("purge", cmd_purge, "remove every message of a queue"),
                           ("stats", cmd_stats, "a queue's counts and settings")):
        p = qs.add_parser(name, parents=[common], help=text)
        p.add_argument("name", metavar="NAME")
        p.set_defaults(run=fn)
    rd = qs.add_parser("redrive", parents=[common],
                       help="move a dead-letter queue's messages back to their queue (a task the cluster runs)")
    rd.add_argument("name", metavar="NAME", help="the dead-letter queue")
    rd.add_argument("--to", metavar="QUEUE", help="where to (default: the queue whose dead-letter queue it is)")
    rd.add_argument("--rate", type=int, metavar="N", help="at most N messages a second (default: no limit)")
    which = rd.add_mutually_exclusive_group()
    which.add_argument("--status", action="store_true", help="show the last redrive's progress")
    which.add_argument("--cancel", action="store_true", help="stop the running redrive (moved messages stay moved)")
    rd.add_argument("--wait", action="store_true", help="follow the redrive until it ends")
    rd.add_argument("--interval", type=float, default=1.0, help="with --wait: seconds between looks")
    rd.set_defaults(run=cmd_redrive)
    q.set_defaults(func=run)

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue one message (durable when answered)")
    enq.add_argument("queue", metavar="QUEUE")
    enq.add_argument("content", metavar="CONTENT", help="the message's content (UTF-8 text)")
    enq.add_argument("--group", default="", help="fair queues: the round-robin group")
    enq.add_argument("--priority", type=int, default=0, help="lower first; a future Unix timestamp delays")
    enq.add_argument("--delay-ms", type=int, default=0, help="deliver no sooner than this from now")
    enq.add_argument("--dedup-id", default="", help="idempotency key: a retry returns the original id")
    enq.set_defaults(func=run, run=cmd_enqueue)

    deq = sub.add_parser("dequeue", parents=[common],
                         help="take messages: leased until acked, or removed at once with --ack")
    deq.add_argument("queue", metavar="QUEUE")
    deq.add_argument("-n", type=int, default=1, help="at most this many messages")
    deq.add_argument("--ack", action="store_true", help="remove them at once (no lease)")
    deq.add_argument("--wait-ms", type=int, default=0, help="wait up to this long for a message")
    deq.set_defaults(func=run, run=cmd_dequeue)

    peek = sub.add_parser("peek", parents=[common],
                          help="look at messages in the order they would be delivered, without taking them")
    peek.add_argument("queue", metavar="QUEUE")
    peek.add_argument("-n", type=int, default=10, help="at most this many messages (1-100)")
    peek.add_argument("--state", choices=("ready", "delayed", "in_flight"), default="ready",
                      help="ready: in delivery order; delayed: by due time; in_flight: by lease expiry")
    peek.add_argument("--offset", type=int, default=0, help="skip this many first (pages)")
    peek.set_defaults(func=run, run=cmd_peek)

    top = sub.add_parser("top", parents=[common], help="live view of the queues table")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after this many refreshes (0 = never)")
    top.set_defaults(func=run, run=cmd_top)


def run(ns: argparse.Namespace) -> int:
    what = "doq " + " ".join(filter(None, (ns.command, getattr(ns, "queues_command", None))))
    try:
        gw = Gateway(server_url(str(ns.server)), ns.timeout)
    except InvalidArgument as e:
        print(f"{what}: {e.message}", file=sys.stderr)
        return 2
    try:
        if ns.run is cmd_top:
            return cmd_top(gw, ns)
        human, record = ns.run(gw, ns)
        print(json.dumps(record) if ns.json else human, flush=True)
    except CommandFailed as e:
        print(f"{what}: {e}", file=sys.stderr)
        return 1
    except InvalidArgument as e:  # bad usage found by a command (nothing was sent)
        print(f"{what}: {e.message}", file=sys.stderr)
        return 2
    return 0
