"""Strangers on the Raft port (issue 18): the port is reachable before any peer is
authenticated, so connections that never finish their handshake (TLS, then the peer
wire's handshake unit), or send something else (an HTTP/2 preface), must cost the node
seconds, and must never keep a member out. Real: `doq serve` processes on 127.0.0.1 (a three-member loopback cluster with a plain
Raft port, and one `--secure` node whose Raft port wants mutual TLS), raw TCP sockets as
the stranger, writes through the HTTP API."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import applied_indexes, call, leader, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS
CLOSED_WITHIN_S = 30
"""How long the test waits for the node to close a stranger's connections: half of
asyncio's own default TLS handshake timeout (60 s; a plain connection has none at all),
so it fails without the node's bound, and six times the bound (5 s), so load on the
machine does not make it fail."""


def stranger(port: int, n: int, preface: bool = False) -> list[socket.socket]:
    """`n` connections to 127.0.0.1:`port` that send nothing (no TLS hello, no HTTP/2
    preface), or with `preface` only HTTP/2's preface and then nothing (no stream)."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        if preface:
            s.sendall(PREFACE)
        s.setblocking(False)
        out.append(s)
    return out


def closed_by_server(s: socket.socket) -> bool:
    """Has the node closed `s` (what it sent before is read and skipped)?"""
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def all_closed(socks: list[socket.socket]) -> bool:
    return all([closed_by_server(s) for s in socks])  # every socket drained on every poll


def enqueue(node: NodeProc, queue: str, n: int) -> None:
    for i in range(n):
        status, body = call(node, "POST", f"/API/v1/queues/{queue}/messages", {"content": f"m{i}"})
        assert status in (200, 201), body


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path / "data") as nodes:
        status, body = call(nodes[0], "POST", "/API/v1/queues", {"name": "q"})
        assert status in (200, 201), body
        yield nodes


def test_strangers_on_the_raft_port_are_closed_and_the_cluster_keeps_committing(cluster: list[NodeProc]) -> None:
    lead = leader(cluster)
    socks: list[socket.socket] = []
    try:
        for n in cluster:  # every member's Raft port, leader and followers
            socks += stranger(n.raft_port, 100) + stranger(n.raft_port, 20, preface=True)
        enqueue(lead, "q", 20)  # committed (a quorum's Raft streams) while they are held
        until("every stranger connection closed by the nodes", lambda: all_closed(socks), CLOSED_WITHIN_S)
        enqueue(lead, "q", 20)
    finally:
        for s in socks:
            s.close()
    status, body = call(lead, "GET", "/API/v1/queues/q")
    assert status == 200 and int(body["stats"]["ready"]) == 40, body


def test_a_restarted_member_gets_back_in_while_strangers_keep_the_raft_ports_busy(cluster: list[NodeProc]) -> None:
    """No bound on connections: a stranger who keeps reopening half-open connections to
    every Raft port does not keep a member that restarts (and so reconnects to each
    peer, and is reconnected to) out of the cluster."""
    lead = leader(cluster)
    back = next(n for n in cluster if n is not lead)
    stop = threading.Event()
    opened = [0]

    def keep_busy() -> None:
        """Keep 50 half-open connections to each Raft port, reopening what the nodes close."""
        held: dict[int, list[socket.socket]] = {n.raft_port: [] for n in cluster}
        try:
            while not stop.is_set():
                for port, socks in held.items():
                    for s in [s for s in socks if closed_by_server(s)]:
                        socks.remove(s)
                        s.close()
                    try:
                        new = stranger(port, 50 - len(socks))
                    except OSError:  # the restarting member's port is down for a moment
                        continue
                    socks += new
                    opened[0] += len(new)
                stop.wait(0.2)
        finally:
            for socks in held.values():
                for s in socks:
                    s.close()

    busy = threading.Thread(target=keep_busy, daemon=True)
    busy.start()
    try:
        until("the stranger holds connections to every Raft port", lambda: opened[0] >= 150)
        back.kill9()
        enqueue(lead, "q", 10)  # two members are a quorum
        back.start(timeout_s=120)
        enqueue(lead, "q", 10)
        until(f"{back.node_id} back in step with the leader", lambda: (
            (idx := applied_indexes(cluster)).get(back.node_id, -1) >= idx.get(lead.node_id, 1 << 62)), 120)
        assert busy.is_alive() and opened[0] > 150  # the stranger kept at it the whole time
    finally:
        stop.set()
        busy.join(30)
    status, body = call(back, "GET", "/API/v1/queues/q")
    assert status == 200 and int(body["stats"]["ready"]) == 20, body


def test_a_secure_raft_port_closes_connections_that_never_start_tls(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, node_id="node-1", extra_args=["--secure"])
    try:
        node.start()
        socks = stranger(node.raft_port, 50)
        try:
            until("every stranger connection closed by the node", lambda: all_closed(socks), CLOSED_WITHIN_S)
        finally:
            for s in socks:
                s.close()
    finally:
        node.kill9()
