"""What `doq serve` makes of the flags a Kubernetes pod is started with: a node that listens
on one address and is reached at another (a pod listening on 0.0.0.0, reached at its
doq-internal DNS name) announces the name (`--advertise-host`); `--election-timeout-ms`
is the Raft node's election timeout; a bad `--admin-key-file` (the Kubernetes Secret's admin
key) stops the start with a message that never shows the file's content."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import running_node


@pytest.mark.integration
def test_the_node_announces_its_advertise_host_with_its_listen_ports(tmp_path: Path) -> None:
    with running_node(tmp_path / "data", node_id="doq-0", extra_args=["--advertise-host", "localhost"]) as node:
        with grpc.insecure_channel(node.grpc_addr) as ch:
            answer = pb_grpc.DOQStub(ch).ListServers(pb.ListServersRequest(), timeout=10)
    [me] = answer.servers
    assert (me.id, me.grpc_addr, me.http_addr, me.raft_addr) == (
        "doq-0", f"localhost:{node.grpc_port}", f"localhost:{node.http_port}", f"localhost:{node.raft_port}")


async def test_the_election_timeout_reaches_the_raft_node(tmp_path: Path) -> None:
    from doq.config import ServeConfig
    from doq.server import open_runtime

    for timeout_ms, ticks in [(1000, 10), (2500, 25), (500, 5)]:
        config = ServeConfig(node_id=f"n{ticks}", data_dir=str(tmp_path), election_timeout_ms=timeout_ms)
        rt = await open_runtime(config)
        try:
            assert rt.node.cfg.election_tick * rt.node.cfg.tick_ms == timeout_ms  # type: ignore[attr-defined]
            assert rt.node.cfg.election_tick == ticks  # type: ignore[attr-defined]
        finally:
            rt.close(discard=True)


@pytest.mark.integration
def test_a_bad_admin_key_file_stops_the_start_naming_the_file_never_its_content(tmp_path: Path) -> None:
    bad = tmp_path / "admin.key"
    bad.write_text("doq_not a key s3cr3t\n")
    for path in (bad, tmp_path / "missing.key"):
        out = subprocess.run([sys.executable, "-m", "doq", "serve", "--secure", "--data-dir", str(tmp_path / "d"),
                              "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0",
                              "--admin-key-file", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and f"--admin-key-file {path}" in out.stderr, out.stderr
        assert "s3cr3t" not in out.stdout + out.stderr
        assert not (tmp_path / "d").exists()  # nothing made
