"""A node that listens on one address and is reached at another (a pod listening on 0.0.0.0,
reached at its doq-internal DNS name) announces the name: `--advertise-host`."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import running_node

pytestmark = pytest.mark.integration


def test_the_node_announces_its_advertise_host_with_its_listen_ports(tmp_path: Path) -> None:
    with running_node(tmp_path / "data", node_id="doq-0", extra_args=["--advertise-host", "localhost"]) as node:
        with grpc.insecure_channel(node.grpc_addr) as ch:
            answer = pb_grpc.DOQStub(ch).ListServers(pb.ListServersRequest(), timeout=10)
    [me] = answer.servers
    assert (me.id, me.grpc_addr, me.http_addr, me.raft_addr) == (
        "doq-0", f"localhost:{node.grpc_port}", f"localhost:{node.http_port}", f"localhost:{node.raft_port}")
