"""What checking client keys costs the data path: the per-message producer and consumer of
`bench/side_by_side.py` (one enqueue and one confirmation per message; one ack per
message), alternating run by run in one run.

    python bench/keys_cost.py [--runs 3] [--count 100000] [--consume-count 50000]

A loopback node without `--secure` requires no key but checks a presented one exactly as a
secure node does (authentication once per call or stream, scopes and queue prefixes per
request), so the check itself is measured on one node: "keys off" (no key), "keys on" (a
`produce`+`consume` key) and "prefix key" (`produce:sbs-` and `consume:sbs-`: the
costliest check, a prefix test per request frame). A fourth client, "secure", runs against
a second node started with `--secure` (TLS on every port, keys required) with a
`produce`+`consume` key: the whole price of security, encryption included. Prints the
median rate and the mean server CPU time per message, with the differences to
"keys off"; `--json FILE` writes every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import ssl
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from bench import alternating
from bench import side_by_side as sbs


@contextlib.contextmanager
def _key_env(key: str) -> Iterator[None]:
    saved = os.environ.get("DOQ_KEY")
    if key:
        os.environ["DOQ_KEY"] = key
    else:
        os.environ.pop("DOQ_KEY", None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DOQ_KEY", None)
        else:
            os.environ["DOQ_KEY"] = saved


def _create_key(http_url: str, admin: str, scopes: list[str], context: ssl.SSLContext | None = None) -> str:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {admin}"} if admin else {})}
    req = urllib.request.Request(f"{http_url}/API/v1/keys", data=json.dumps({"scopes": scopes}).encode(),
                                 method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        return str(json.loads(r.read())["key"])


def _queue(workload: str, run: int) -> str:
    return f"sbs-{workload}-{run}-{os.getpid()}"  # the name `side_by_side.run_once` uses


def _create_queue(server: sbs.Server, queue: str, admin: str) -> None:
    """Create the queue `run_once` will use (its clients' keys may not create queues)."""
    from doq_client import AlreadyExists, DoqClient

    with DoqClient(server.addr, key=admin or None, ca_file=server.ca_file) as c, \
            contextlib.suppress(AlreadyExists):
        c.create_queue(queue)


def _delete_queue(server: sbs.Server, queue: str, admin: str) -> None:
    """Delete it after the run (as `run_once` does with its clients' key), so no node
    keeps more messages than the other."""
    from doq_client import DoqClient, NotFound

    with DoqClient(server.addr, key=admin or None, ca_file=server.ca_file) as c, contextlib.suppress(NotFound):
        c.delete_queue(queue)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--consume-count", type=int, default=50_000)
    p.add_argument("--json", metavar="FILE")
    ns = p.parse_args(argv)
    args = sbs.Args(count=ns.count, consume_count=ns.consume_count, runs=ns.runs, workloads=("producer", "consumer"))
    names = ("keys off", "keys on", "prefix key", "secure")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in names}
    with tempfile.TemporaryDirectory(prefix="doq-keys-cost-") as tmp, \
            sbs.doq_server(Path(tmp) / "open") as open_node, \
            sbs.doq_server(Path(tmp) / "secure", secure=True) as secure_node:
        open_url = open_node.http_url
        client_key = _create_key(open_url, "", ["produce:sbs-", "consume:sbs-"])
        produce_consume = _create_key(open_url, "", ["produce", "consume"])
        admin = (Path(tmp) / "secure" / "data" / "admin.key").read_text().strip()
        assert secure_node.ca_file
        secure_key = _create_key(secure_node.http_url, admin, ["produce", "consume"],
                                 ssl.create_default_context(cafile=secure_node.ca_file))
        systems = [("keys off", open_node, "", ""), ("keys on", open_node, produce_consume, ""),
                   ("prefix key", open_node, client_key, ""), ("secure", secure_node, secure_key, admin)]
        for run in range(ns.runs):
            for workload in args.workloads:
                for i, (name, server, key, admin_key) in enumerate(systems if run % 2 == 0 else systems[::-1]):
                    run_id = run * 10 + i  # a queue of its own for each run of each client
                    _create_queue(server, _queue(workload, run_id), admin_key)
                    with _key_env(key):
                        r = sbs.run_once("doq", server, workload, run_id, args)
                    _delete_queue(server, _queue(workload, run_id), admin_key)
                    runs[name].setdefault(workload, []).append(r)
                    print(f"{name:10} {workload:8} run {run}: {r['msg_per_s']:,.0f} msg/s, server "
                          f"{r['server_cpu_us_per_msg']} us/msg", file=sys.stderr)
    summary, lines = alternating.summarize(runs, names, args.workloads)
    print("\n".join(lines))
    if ns.json:
        Path(ns.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
