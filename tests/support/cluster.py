"""Helpers for tests against a real cluster of `doq serve` processes (tests/support/proc.py)."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support.proc import NodeProc


def http_call(base_url: str, method: str, path: str, body: Any = None, timeout_s: float = 30) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded body or None)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def until(what: str, fn: Callable[[], Any], timeout_s: float = 60) -> Any:
    """Poll `fn` (OSError counts as "not yet") until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            v = fn()
        except OSError:
            v = None
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s}s")
        time.sleep(0.05)


def voters(base_url: str) -> list[str]:
    """The voters `GET /cluster` of the node at `base_url` lists ([] if it does not answer)."""
    status, body = http_call(base_url, "GET", "/cluster")
    return sorted(m["node_id"] for m in body["members"] if m["role"] == "voter") if status == 200 else []


def cluster_view(base_url: str) -> dict[str, Any]:
    """`GET /cluster` of the node at `base_url`."""
    status, body = http_call(base_url, "GET", "/cluster")
    assert status == 200, body
    return dict(body)


@contextlib.contextmanager
def three_nodes(data: Path) -> Iterator[list[NodeProc]]:
    """node-1 bootstraps, node-2 and node-3 join it (`--join`); yields once all three are
    voters; kill -9s all three at the end."""
    nodes = [NodeProc(data, node_id=f"node-{i}") for i in (1, 2, 3)]
    try:
        nodes[0].start()
        for n in nodes[1:]:
            n.extra_args = ["--join", f"127.0.0.1:{nodes[0].http_port}"]
            n.start(timeout_s=90)
        until("three voters", lambda: voters(nodes[0].http_url) == ["node-1", "node-2", "node-3"])
        yield nodes
    finally:
        for n in nodes:
            n.kill9()
