"""A real three-node cluster of `doq serve` processes on 127.0.0.1: formed by --join, a
message enqueued through one node is dequeued through another, kill -9 of any node
leaves the other two serving, and a restarted node catches up to identical state."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def call(node: NodeProc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def until(what: str, fn: Callable[[], Any], timeout_s: float = 60) -> Any:
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
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NodeProc]]:
    data = tmp_path / "data"
    nodes = [NodeProc(data, node_id=f"node-{i}") for i in (1, 2, 3)]
    try:
        nodes[0].start()
        join = ["--join", f"127.0.0.1:{nodes[0].http_port}"]
        for n in nodes[1:]:
            n.extra_args = join
            n.start(timeout_s=90)
        until("three voters", lambda: _voters(nodes[0]) == ["node-1", "node-2", "node-3"])
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


def _voters(node: NodeProc) -> list[str]:
    status, body = call(node, "GET", "/cluster")
    return sorted(m["node_id"] for m in body["members"] if m["role"] == "voter") if status == 200 else []


def _leader(nodes: list[NodeProc]) -> str:
    for n in nodes:
        if n.proc and n.proc.poll() is None:
            status, body = call(n, "GET", "/cluster")
            if status == 200 and body.get("leader_id"):
                return str(body["leader_id"])
    return ""


def test_seed_style_cluster_serves_through_any_node_and_survives_kill9(cluster: list[NodeProc]) -> None:
    n1, n2, n3 = cluster
    status, _ = call(n2, "POST", "/API/v1/queues", {"name": "jobs"})  # forwarded to the leader
    assert status in (200, 201), status
    status, body = call(n2, "POST", "/API/v1/queues/jobs/messages", {"content": "hello"})
    assert status in (200, 201), body
    status, body = call(n3, "GET", "/API/v1/queues/jobs/messages?ack=true")
    assert status == 200, body
    assert body["content"] == "hello"

    by_id = {n.node_id: n for n in cluster}
    victim = by_id[until("a leader", lambda: _leader(cluster))]
    victim.kill9()
    rest = [n for n in cluster if n is not victim]

    def enqueue_ok() -> bool:
        status, _ = call(rest[0], "POST", "/API/v1/queues/jobs/messages", {"content": "after"})
        return status in (200, 201)

    until("the two others serve", enqueue_ok)
    victim.start(timeout_s=90)  # rejoins from its own data

    def caught_up() -> bool:
        indexes = {call(n, "GET", "/cluster")[1]["applied_index"] for n in cluster}
        return len(indexes) == 1

    until("the restarted node catches up", caught_up)
    for n in cluster:
        status, body = call(n, "GET", "/API/v1/queues/jobs")
        assert status == 200, body
