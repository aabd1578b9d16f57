"""Helpers for tests against a real cluster of `doq serve` processes (tests/support/proc.py):
formed by --join, HTTP calls to its nodes, bounded waits, its leader, and a stopped node's
state digest read from its own files."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from doq.node.wal_log import WalLogStorage
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore
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


def call(node: NodeProc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """`http_call` to `node`."""
    return http_call(node.http_url, method, path, body)


def alive(node: NodeProc) -> bool:
    return node.proc is not None and node.proc.poll() is None


def leader_id(nodes: list[NodeProc]) -> str:
    """The leader a live node names ("" when none is known)."""
    for n in nodes:
        if alive(n):
            status, body = call(n, "GET", "/cluster")
            if status == 200 and body.get("leader_id"):
                return str(body["leader_id"])
    return ""


def leader(nodes: list[NodeProc], timeout_s: float = 60) -> NodeProc:
    by_id = {n.node_id: n for n in nodes}
    return by_id[until("a leader", lambda: leader_id(nodes), timeout_s)]


def applied_indexes(nodes: list[NodeProc]) -> dict[str, int]:
    """{node id: applied index} of the live nodes that answer `GET /cluster`."""
    out = {}
    for n in nodes:
        if alive(n):
            status, body = call(n, "GET", "/cluster")
            if status == 200:
                out[n.node_id] = int(body["applied_index"])
    return out


def node_procs(data: Path, extra_args: list[str] | None = None) -> list[NodeProc]:
    """node-1..node-3 (not started), each with `extra_args`."""
    return [NodeProc(data, node_id=f"node-{i}", extra_args=list(extra_args or [])) for i in (1, 2, 3)]


@contextlib.contextmanager
def running_cluster(nodes: list[NodeProc], start_timeout_s: float = 90) -> Iterator[list[NodeProc]]:
    """Start `nodes[0]` (it bootstraps), then the others with `--join` it; yields once all
    are voters; kill -9s every node at the end."""
    try:
        nodes[0].start()
        for n in nodes[1:]:
            n.extra_args = [*n.extra_args, "--join", f"127.0.0.1:{nodes[0].http_port}"]
            n.start(timeout_s=start_timeout_s)
        want = sorted(n.node_id for n in nodes)
        until(f"{len(nodes)} voters", lambda: voters(nodes[0].http_url) == want, start_timeout_s)
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


@contextlib.contextmanager
def three_nodes(data: Path) -> Iterator[list[NodeProc]]:
    """node-1 bootstraps, node-2 and node-3 join it (`--join`); yields once all three are
    voters; kill -9s all three at the end."""
    with running_cluster(node_procs(data)) as nodes:
        yield nodes


@contextlib.contextmanager
def node_files(node: NodeProc) -> Iterator[tuple[StateStore, WalLogStorage]]:
    """The state store and Raft log of a STOPPED node, opened from its files."""
    assert not alive(node), f"{node.node_id} still runs"
    env = open_env(node_dir(node.data_dir, node.node_id) / "doq.lmdb")
    log = None
    try:
        log = WalLogStorage(env)
        yield StateStore(env), log
    finally:
        if log is not None:
            log.close()
        env.close()


def state_dump_digest(node: NodeProc) -> str:
    """SHA-256 of the whole replicated state of a stopped node, as bytes
    (`StateStore.dump_state_bytes`: byte-identical on replicas that applied the same log)."""
    with node_files(node) as (state, _):
        return state.snapshot_digest()
