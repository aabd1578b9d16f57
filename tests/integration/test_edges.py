"""The edges of a real `doq serve` process (issue 8): abandoned long polls take nothing,
a failed online restore changes nothing, ListServers answers. Real processes, real LMDB,
real HTTP and gRPC on 127.0.0.1."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.backup.format import BackupReader
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration


@pytest.fixture
def http(doq_node: NodeProc) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=doq_node.http_url, timeout=30) as c:
        yield c


def _until(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def _waiting(http: httpx.Client) -> int:
    """Parked long polls, from the node's /metrics."""
    m = re.search(r"^doq_long_polls_waiting (\S+)$", http.get("/metrics").text, re.M)
    assert m, "doq_long_polls_waiting missing from /metrics"
    return int(float(m.group(1)))


def test_an_abandoned_http_long_poll_takes_nothing(doq_node: NodeProc, http: httpx.Client) -> None:
    assert http.post("/API/v1/queues", json={"name": "jobs"}).status_code == 201
    sock = socket.create_connection(("127.0.0.1", doq_node.http_port))
    sock.sendall(b"GET /API/v1/queues/jobs/messages?ack=true&wait_ms=20000 HTTP/1.1\r\n"
                 b"Host: 127.0.0.1\r\n\r\n")
    _until("the long poll is parked", lambda: _waiting(http) == 1)
    sock.close()  # the client goes away while its poll waits
    _until("the server noticed the disconnect", lambda: _waiting(http) == 0)
    r = http.post("/API/v1/queues/jobs/messages", json={"content": "precious"})
    assert r.status_code == 201
    got = http.get("/API/v1/queues/jobs/messages", params={"ack": "true"})
    assert got.status_code == 200 and got.json()["content"] == "precious"


def test_a_cancelled_grpc_long_poll_takes_nothing(doq_node: NodeProc, http: httpx.Client) -> None:
    with grpc.insecure_channel(doq_node.grpc_addr) as ch:
        stub = pb_grpc.DOQStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(name="jobs", type="delayed"))
        call = stub.Dequeue.future(pb.DequeueRequest(queue_name="jobs", ack=True, wait_ms=20000))
        _until("the long poll is parked", lambda: _waiting(http) == 1)
        call.cancel()
        _until("the server noticed the cancel", lambda: _waiting(http) == 0)
        stub.Enqueue(pb.EnqueueRequest(queue_name="jobs", content=b"precious"))
        got = stub.Dequeue(pb.DequeueRequest(queue_name="jobs", ack=True)).messages
        assert [m.content for m in got] == [b"precious"]


def test_one_enqueue_wakes_one_long_poll_and_proposes_one_dequeue(doq_node: NodeProc, http: httpx.Client) -> None:
    def committed() -> int:
        m = re.search(r"^doq_commands_applied_total (\S+)$", http.get("/metrics").text, re.M)
        assert m
        return int(float(m.group(1)))

    with grpc.insecure_channel(doq_node.grpc_addr) as ch:
        stub = pb_grpc.DOQStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(name="jobs", type="delayed"))
        polls = [stub.Dequeue.future(pb.DequeueRequest(queue_name="jobs", ack=True, wait_ms=20000))
                 for _ in range(8)]
        _until("every long poll is parked", lambda: _waiting(http) == 8)
        before = committed()
        stub.Enqueue(pb.EnqueueRequest(queue_name="jobs", content=b"one"))
        _until("one long poll got the message", lambda: any(p.done() for p in polls))
        stub.CreateQueue(pb.CreateQueueRequest(name="barrier", type="delayed"))  # commits after them
        # counted once applied, before the answer (`metrics.observe_applied`): no wait
        assert committed() - before == 3  # the enqueue, ONE dequeue, the barrier
        assert _waiting(http) == 7
        done = [p for p in polls if p.done()]
        assert len(done) == 1 and [m.content for m in done[0].result().messages] == [b"one"]
        for p in polls:
            p.cancel()


def _backup(http: httpx.Client, since: int, path: Path) -> int:
    r = http.post("/db/backup", json={"since": since})
    assert r.status_code == 200, r.text
    path.write_bytes(r.content)
    return int(r.headers["X-Last-Version"])


def _restore(http: httpx.Client, *paths: Path) -> httpx.Response:
    files = [("file", (p.name, p.read_bytes(), "application/octet-stream")) for p in paths]
    return http.post("/db/restore", files=files)


def _records(http: httpx.Client, tmp: Path) -> list[tuple[bytes, bytes | None, int]]:
    f = tmp / "check.bak"
    _backup(http, 0, f)
    with open(f, "rb") as fh:
        return list(BackupReader(fh).records())


def test_a_failed_online_restore_changes_nothing_and_a_retry_works(tmp_path: Path) -> None:
    with running_node(tmp_path / "a") as a, httpx.Client(base_url=a.http_url, timeout=30) as ha:
        ha.post("/API/v1/queues", json={"name": "jobs"})
        ids = [ha.post("/API/v1/queues/jobs/messages", json={"content": f"m{i}"}).json()["id"] for i in range(5)]
        last = _backup(ha, 0, tmp_path / "full.bak")
        ha.delete(f"/API/v1/queues/jobs/messages/{ids[0]}")
        ha.post("/API/v1/queues/jobs/messages", json={"content": "later"})
        _backup(ha, last + 1, tmp_path / "inc.bak")
        expected = ha.get("/API/v1/queues").json()
    with running_node(tmp_path / "b") as b, httpx.Client(base_url=b.http_url, timeout=30) as hb:
        hb.post("/API/v1/queues", json={"name": "other"})
        for i in range(last + 3):  # versions that fit after `full.bak`; the queue record does not
            hb.post("/API/v1/queues/other/messages", json={"content": f"o{i}"})
        _backup(hb, last + 1, tmp_path / "foreign.bak")
    with running_node(tmp_path / "c") as c, httpx.Client(base_url=c.http_url, timeout=30) as hc:
        before = _records(hc, tmp_path)
        r = _restore(hc, tmp_path / "full.bak", tmp_path / "foreign.bak")  # a wrong chain
        assert r.status_code == 400, r.text
        assert r.json()["reason"] == "BACKUP_CLUSTER_MISMATCH"  # another node's cluster
        assert _records(hc, tmp_path) == before == []
        assert hc.get("/API/v1/queues").json() == {"queues": [], "next_page_token": None}
        r = _restore(hc, tmp_path / "full.bak", tmp_path / "inc.bak")  # the retry
        assert r.status_code == 200, r.text
        assert hc.get("/API/v1/queues").json() == expected


def test_list_servers_reports_this_node(doq_node: NodeProc) -> None:
    with grpc.insecure_channel(doq_node.grpc_addr) as ch:
        res = pb_grpc.DOQStub(ch).ListServers(pb.ListServersRequest())
    assert res.leader_id == doq_node.node_id
    assert [(s.id, s.grpc_addr, s.http_addr, s.raft_addr, s.leader, s.voter) for s in res.servers] == [
        (doq_node.node_id, doq_node.grpc_addr, f"127.0.0.1:{doq_node.http_port}",
         f"127.0.0.1:{doq_node.raft_port}", True, True)]
