"""The seed's three-node cluster lines, verbatim, and CONTRACT's own `doq serve` lines: each
set forms a cluster in one shared `data` dir; the seed's curl lines enqueue through node-2
and dequeue through node-3; a gRPC client pointed at any node is served.

`doq` is the installed command; each line runs in a fresh working directory (so `data` is
the test's). The only change to the lines: if one of the seed's ports (8001-8003,
9001-9003, 10001-10003) is taken on this machine, every port is replaced by a free one."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.cluster import until, voters
from tests.support.proc import NodeProc, free_port

pytestmark = pytest.mark.integration

SEED_LINES = """\
doq --storage.data_dir data --cluster.node_id node-1 --http.port 8001 --raft.address localhost:9001 --grpc.address localhost:10001
doq --storage.data_dir data --cluster.node_id node-2 --http.port 8002 --raft.address localhost:9002 --grpc.address localhost:10002 --cluster.join_addr localhost:8001
doq --storage.data_dir data --cluster.node_id node-3 --http.port 8003 --raft.address localhost:9003 --grpc.address localhost:10003 --cluster.join_addr localhost:8001
"""  # noqa: E501 - the seed's lines, as written
CONTRACT_LINES = """\
doq serve --data-dir data --node-id node-1 --http-addr localhost:8001 --raft-addr localhost:9001 --grpc-addr localhost:10001
doq serve --data-dir data --node-id node-2 --http-addr localhost:8002 --raft-addr localhost:9002 --grpc-addr localhost:10002 --join localhost:8001
doq serve --data-dir data --node-id node-3 --http-addr localhost:8003 --raft-addr localhost:9003 --grpc-addr localhost:10003 --join localhost:8001
"""  # noqa: E501
SEED_CURL = [  # the seed's curl lines (node-1's port replaced by the node each is sent to)
    """curl -X POST http://localhost:8001/API/v1/queues -H 'Content-Type: application/json' \
-d '{"name": "user_indexing_queue", "type": "delayed"}'""",
    """curl -X POST http://localhost:8001/API/v1/queues/user_indexing_queue/messages \
-H 'Content-Type: application/json' -d '{"content": "{\\"user_id\\": 1}", "group": "default", "priority": 60}'""",
    """curl 'http://localhost:8001/API/v1/queues/user_indexing_queue/messages?ack=true'""",
]
SEED_PORTS = [p + i for p in (8000, 9000, 10000) for i in (1, 2, 3)]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_map() -> dict[int, int]:
    """The seed's ports as they are, or all replaced by free ones if any is taken."""
    if all(_port_free(p) for p in SEED_PORTS):
        return {p: p for p in SEED_PORTS}
    return {p: free_port() for p in SEED_PORTS}


def with_ports(text: str, ports: dict[int, int]) -> str:
    return re.sub(r"\b\d{4,5}\b", lambda m: str(ports.get(int(m.group()), m.group())), text)


@dataclass
class LineProc(NodeProc):
    """A node started by one command line (`doq` = the installed command) in `cwd`."""

    argv: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://localhost:{self.http_port}"

    def start(self, timeout_s: float = 30.0) -> NodeProc:
        self.log_path = self.data_dir / f"{self.node_id}.log"
        doq = str(Path(sys.executable).parent / "doq")
        logf = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([doq, *self.argv[1:]], cwd=self.data_dir, stdout=logf,
                                     stderr=subprocess.STDOUT, env={**os.environ})
        logf.close()
        self.wait_ready(timeout_s)
        return self


def _arg(argv: list[str], *names: str) -> str:
    for name in names:
        if name in argv:
            return argv[argv.index(name) + 1]
    raise AssertionError(f"none of {names} in {argv}")


def _port(addr_or_port: str) -> int:
    return int(addr_or_port.rpartition(":")[2])


@pytest.fixture
def start_lines(tmp_path: Path) -> Iterator[object]:
    started: list[LineProc] = []

    def start(lines: str) -> list[LineProc]:
        cwd = tmp_path / f"run{len(started)}"
        cwd.mkdir()
        nodes = []
        for line in lines.splitlines():
            argv = shlex.split(line)
            node = LineProc(cwd, node_id=_arg(argv, "--cluster.node_id", "--node-id"), argv=argv,
                            http_port=_port(_arg(argv, "--http.port", "--http-addr")),
                            grpc_port=_port(_arg(argv, "--grpc.address", "--grpc-addr")),
                            raft_port=_port(_arg(argv, "--raft.address", "--raft-addr")))
            started.append(node)
            node.start(timeout_s=90)
            nodes.append(node)
        until("three voters", lambda: voters(nodes[0].http_url) == ["node-1", "node-2", "node-3"])
        assert sorted(p.name for p in (cwd / "data").iterdir()) == ["node-1", "node-2", "node-3"]
        return nodes

    yield start
    for n in started:
        n.kill9()


def curl(line: str, port: int) -> str:
    out = subprocess.run([*shlex.split(line.replace("localhost:8001", f"localhost:{port}")),
                          "--silent", "--show-error", "--fail-with-body", "--max-time", "30"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (line, out.stdout, out.stderr)
    return out.stdout


def serves_through_any_node(nodes: list[LineProc]) -> None:
    """The seed's curl lines: queue and message through node-2, dequeued through node-3;
    then a gRPC client on each node's address enqueues, and node-1 dequeues them all."""
    n1, n2, n3 = nodes
    curl(SEED_CURL[0], n2.http_port)
    curl(SEED_CURL[1], n2.http_port)
    assert json.loads(curl(SEED_CURL[2], n3.http_port))["content"] == '{"user_id": 1}'
    for n in nodes:
        with grpc.insecure_channel(f"localhost:{n.grpc_port}") as ch:
            resp = pb_grpc.DOQStub(ch).Enqueue(
                pb.EnqueueRequest(queue_name="user_indexing_queue", content=n.node_id.encode()), timeout=30)
            assert resp.success
    with grpc.insecure_channel(f"localhost:{n1.grpc_port}") as ch:
        got = pb_grpc.DOQStub(ch).Dequeue(
            pb.DequeueRequest(queue_name="user_indexing_queue", ack=True, max_messages=10), timeout=30)
    assert sorted(m.content for m in got.messages) == [b"node-1", b"node-2", b"node-3"]


def test_the_seeds_lines_verbatim_form_a_cluster(start_lines) -> None:  # type: ignore[no-untyped-def]
    ports = port_map()
    nodes = start_lines(with_ports(SEED_LINES, ports))
    assert [n.http_port for n in nodes] == [ports[8001], ports[8002], ports[8003]]
    serves_through_any_node(nodes)


def test_the_contracts_serve_lines_form_a_cluster(start_lines) -> None:  # type: ignore[no-untyped-def]
    ports = port_map()
    serves_through_any_node(start_lines(with_ports(CONTRACT_LINES, ports)))
