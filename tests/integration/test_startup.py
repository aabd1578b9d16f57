"""Starting `doq serve`: one process per node directory (an OS lock the kernel releases when
the holder dies), and a failed start leaves nothing on disk that was not there before."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.proc import NodeProc, free_port

pytestmark = pytest.mark.integration


def _serve(data_dir: Path, *, grpc_port: int | None = None, http_port: int | None = None,
           node_id: str = "node-1") -> subprocess.CompletedProcess[str]:
    """Run a `doq serve` that is expected to fail at start (bounded by a timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "doq", "serve", "--data-dir", str(data_dir), "--node-id", node_id,
         "--grpc-addr", f"127.0.0.1:{grpc_port or free_port()}",
         "--http-addr", f"127.0.0.1:{http_port or free_port()}",
         "--raft-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )


def _post(url: str, body: dict[str, object]) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_second_serve_on_one_node_dir_refuses_until_the_first_dies(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = NodeProc(data).start()
    try:
        assert _post(first.http_url + "/API/v1/queues", {"name": "kept", "type": "fair"}) == 201
        assert first.proc is not None
        second = _serve(data)
        assert second.returncode != 0
        assert str((data / "node-1").absolute()) in second.stderr
        assert f"pid {first.proc.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.proc.poll() is None  # the holder is untouched
        # Another node id in the same data dir is another node directory: not blocked.
        other = NodeProc(data, node_id="node-2").start()
        other.kill9()
    finally:
        first.kill9()  # SIGKILL: the kernel releases the lock, the stale file stays
    assert (data / "node-1" / "doq.lock").exists()
    again = NodeProc(data).start()
    try:
        with urllib.request.urlopen(again.http_url + "/API/v1/queues/kept", timeout=10) as r:
            assert json.loads(r.read())["type"] == "fair"
    finally:
        again.kill9()


@pytest.mark.parametrize("busy", ["http", "grpc"])
def test_failed_start_leaves_no_directory_behind(tmp_path: Path, busy: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ports = {"http_port": port} if busy == "http" else {"grpc_port": port}
        # A fresh data dir (and its missing parent): nothing may remain.
        r = _serve(tmp_path / "new" / "data", **ports)
        assert r.returncode != 0 and f"127.0.0.1:{port}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "new").exists()
        # A data dir shared with another node: that node's files stay, no new node dir.
        shared = tmp_path / "shared"
        NodeProc(shared, node_id="node-2").start().terminate()
        before = _tree(shared)
        r = _serve(shared, **ports)
        assert r.returncode != 0 and _tree(shared) == before
        # An existing node directory stays as it was (its data included).
        r = _serve(shared, node_id="node-2", **ports)
        assert r.returncode != 0 and _tree(shared) == before


def test_a_first_start_whose_port_was_taken_meanwhile_moves_to_fresh_ports(tmp_path: Path) -> None:
    """Suites run side by side: a port chosen free may be taken before the node binds it.
    The test harness's first start then picks fresh ports (a restart keeps its own)."""
    node = NodeProc(tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", node.raft_port))
        taken.listen()
        port = node.raft_port
        node.start()
        try:
            assert node.raft_port != port
            # gRPC says "Address already in use"/"Failed to bind"; asyncio's listener (the
            # Raft port) "address already in use"
            assert "address already in use" in node.log().lower() or "Failed to bind" in node.log()
        finally:
            node.kill9()
