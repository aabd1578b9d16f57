"""The client commands against real `doq serve` processes: they never destroy what they did
not create and say what went wrong in one line. `doq cluster status` shows each member's
reachability, last contact, match index and lag (a killed member shows unreachable and
behind); removing a non-member or the last voter is an error; a closed stdout pipe ends
quietly; a gRPC or Raft port named as --server is named as such; a dead address fails
after --connect-timeout saying so; `doq backup -o` writes into devices in place (never
replacing them) and refuses a directory."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from doq.backup.format import MAGIC
from tests.support.cluster import call, leader, node_procs, running_cluster, until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration


def doq(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ}, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(tmp_path_factory.mktemp("cli") / "data") as n:
        yield n


def test_removing_a_non_member_or_the_last_voter_is_an_error(node: NodeProc) -> None:
    r = doq("cluster", "remove", "ghost", "--server", node.http_url)
    assert r.returncode == 1 and "not a member" in r.stderr and "404" in r.stderr, r
    r = doq("cluster", "remove", "node-1", "--server", node.http_url)
    assert r.returncode == 1 and "last voter" in r.stderr and "409 LAST_VOTER" in r.stderr, r
    status, body = call(node, "DELETE", "/cluster/members/node-1")
    assert status == 409 and body["retryable"] is False, body


def test_a_closed_stdout_pipe_ends_quietly(node: NodeProc) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        r = subprocess.run([sys.executable, "-m", "doq", "cluster", "status", "--server", node.http_url],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, env={**os.environ})
    finally:
        os.close(write_end)
    assert r.returncode == 141 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("port", ["grpc_port", "raft_port"])
def test_a_grpc_or_raft_port_given_as_server_is_named_as_such(node: NodeProc, port: str) -> None:
    server = f"127.0.0.1:{getattr(node, port)}"
    for args in (["cluster", "status"], ["backup", "-o", os.devnull]):
        r = doq(*args, "--server", server)
        assert r.returncode == 1, r
        said = "answered in HTTP/2: that is a gRPC port" if port == "grpc_port" else "is a node's Raft peer port"
        assert said in r.stderr and "--http-addr" in r.stderr, r.stderr
        assert "\x00" not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_dead_address_fails_after_the_connect_timeout_saying_so() -> None:
    """A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    hangs as on a dead host."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        fill = []
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fill.append(c)
        try:
            r = doq("cluster", "status", "--server", f"127.0.0.1:{port}", "--connect-timeout", "1")
        finally:
            for c in fill:
                c.close()
    assert r.returncode == 1 and "no connection within 1 s (--connect-timeout)" in r.stderr, r.stderr


def test_backup_to_devices_writes_in_place_and_never_replaces_them(node: NodeProc, tmp_path: Path) -> None:
    for dev in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.stat(dev).st_mode)
    r = doq("backup", "--server", node.http_url, "-o", "/dev/null")
    assert r.returncode == 0 and "wrote /dev/null" in r.stderr, r
    r = doq("backup", "--server", node.http_url, "-o", "/dev/full")
    assert r.returncode == 1 and "/dev/full" in r.stderr and "No space left on device" in r.stderr, r
    for dev in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.stat(dev).st_mode), dev  # still devices
    # -o /dev/stdout into a pipe: the backup bytes on stdout, the result line on stderr
    r = subprocess.run([sys.executable, "-m", "doq", "backup", "--server", node.http_url, "-o", "/dev/stdout"],
                       capture_output=True, timeout=120, env={**os.environ})
    assert r.returncode == 0 and r.stdout.startswith(MAGIC) and b"wrote /dev/stdout" in r.stderr, r
    out = tmp_path / "from-stdout.bak"
    out.write_bytes(r.stdout)
    assert doq("restore", "-f", str(out), "--data-dir", str(tmp_path / "restored")).returncode == 0
    # a directory is refused, and left alone
    r = doq("backup", "--server", node.http_url, "-o", str(tmp_path))
    assert r.returncode == 2 and "not a regular file" in r.stderr, r
    assert tmp_path.is_dir()


def test_cluster_status_shows_a_killed_member_unreachable_and_behind(tmp_path: Path) -> None:
    with running_cluster(node_procs(tmp_path / "data")) as cluster:
        lead = leader(cluster)
        victim = next(n for n in cluster if n is not lead)
        victim.kill9()
        assert call(lead, "POST", "/API/v1/queues", {"name": "q", "type": "delayed"})[0] == 201
        for i in range(5):
            assert call(lead, "POST", "/API/v1/queues/q/messages", {"content": str(i)})[0] in (200, 201)

        def view() -> dict[str, dict[str, object]] | None:
            r = doq("cluster", "status", "--json", "--server", lead.http_url)
            members = {m["node_id"]: m for m in json.loads(r.stdout)["members"]}
            return members if members[victim.node_id]["reachable"] is False else None

        members = until("the killed member shows unreachable", view)
        gone = members[victim.node_id]
        assert gone["lag"] >= 6 and gone["last_contact_ms"] > 0, gone  # type: ignore[operator]
        for nid, m in members.items():
            if nid != victim.node_id:
                assert m["reachable"] is True and m["match_index"] is not None, m
        human = doq("cluster", "status", "--server", lead.http_url).stdout
        assert "REACHABLE" in human and "LAST CONTACT" in human and "LAG" in human
        row = next(line for line in human.splitlines() if line.startswith(victim.node_id))
        assert " NO " in row, human
