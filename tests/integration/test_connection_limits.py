"""Bounds on what one client can hold in a real `doq serve` process (raw sockets and a real
gRPC channel on 127.0.0.1): half-open connections and trickled bodies are closed after
`--read-timeout-ms`, idle keep-alive connections after `--keep-alive-ms`, oversized or too
many headers answered 431, connections past `--max-connections` answered 503, a restore
upload past `--max-restore-size` refused early with 413 (by its Content-Length before a
byte of it is read, or cut while it streams), a gRPC message past the batch body limit
refused RESOURCE_EXHAUSTED, undecodable protobuf refused INVALID_ARGUMENT, gRPC calls past `--max-calls` refused RESOURCE_EXHAUSTED. No assertion
on speed: each socket waits up to a minute for what must come (it never would without
the bound)."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.cluster import until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

WAIT_S = 60  # what must come comes long before; without the bound it never would


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    args = ["--read-timeout-ms", "1000", "--keep-alive-ms", "500", "--max-connections", "20",
            "--max-header-bytes", "8192", "--max-headers", "50", "--max-restore-size", "2MiB"]
    with running_node(tmp_path_factory.mktemp("limits") / "data", extra_args=args) as n:
        yield n


@contextlib.contextmanager
def _conn(node: NodeProc) -> Iterator[socket.socket]:
    s = socket.create_connection(("127.0.0.1", node.http_port), timeout=WAIT_S)
    try:
        yield s
    finally:
        s.close()


def _read_all(s: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_a_connection_that_sends_nothing_is_answered_408_and_closed(node: NodeProc) -> None:
    with _conn(node) as s:
        answer = _read_all(s)
    assert _status(answer) == 408


def test_a_trickled_body_is_answered_408_and_closed(node: NodeProc) -> None:
    with _conn(node) as s:
        s.sendall(b"POST /API/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"name\"")
        answer = _read_all(s)
    assert _status(answer) == 408
    with _conn(node) as s:  # headers that never end: the same
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert _status(_read_all(s)) == 408


def test_headers_trickled_byte_by_byte_do_not_hold_the_connection(node: NodeProc) -> None:
    """A byte every 0.2 s never leaves a 1 s gap, but the head as a whole must come within
    the read timeout: the connection is answered 408 and closed long before 50 bytes."""
    answer = b""
    sent = 0
    with _conn(node) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(50):
            time.sleep(0.2)
            try:
                s.sendall(b"a")
            except OSError:  # closed by the server
                break
            sent += 1
            s.settimeout(0)
            with contextlib.suppress(BlockingIOError):
                answer += s.recv(1024)
            s.settimeout(WAIT_S)
            if answer:
                break
        with contextlib.suppress(OSError):
            answer += _read_all(s)
    assert _status(answer) == 408, answer
    assert sent < 50, sent  # closed while the bytes still came


def test_an_idle_keep_alive_connection_is_closed(node: NodeProc) -> None:
    with _conn(node) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = _read_all(s)  # the answer, then the close (keep-alive timeout)
    assert _status(answer) == 200 and answer.endswith(b'{"status":"ok","reasons":[]}')


@pytest.mark.parametrize("headers", [
    b"X-Big: " + b"a" * 9000 + b"\r\n",
    b"".join(b"X-%d: 1\r\n" % i for i in range(60)),
], ids=["too-large", "too-many"])
def test_headers_past_the_limits_are_answered_431(node: NodeProc, headers: bytes) -> None:
    with _conn(node) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        assert _status(_read_all(s)) == 431
    with _conn(node) as s:  # a request within them is served
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Ok: " + b"a" * 4000 + b"\r\n\r\n")
        assert _status(_read_all(s)) == 200


def test_connections_past_the_limit_are_answered_503(node: NodeProc) -> None:
    held = [socket.create_connection(("127.0.0.1", node.http_port), timeout=WAIT_S) for _ in range(20)]
    try:
        for s in held:  # each sends the start of a request, so each stays open (< read timeout)
            s.sendall(b"GET /livez HTTP/1.1\r\n")
        with _conn(node) as s:
            s.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _status(s.recv(1024)) == 503
    finally:
        for s in held:
            s.close()


def test_a_restore_upload_declared_too_large_is_refused_before_its_body_is_read(node: NodeProc) -> None:
    with _conn(node) as s:
        s.sendall(b"POST /db/restore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Content-Length: 100000000\r\n\r\n")  # and not a byte of the body
        answer = _read_all(s)
    assert _status(answer) == 413 and b"BODY_TOO_LARGE" in answer


def test_a_streamed_restore_upload_is_cut_at_the_limit(node: NodeProc) -> None:
    """Chunked (no length): the server answers 413 and closes once 2 MiB are in; the
    client could not send the 100 MB it meant to."""
    total = 100_000_000
    sent = 0
    answer = b""
    with _conn(node) as s:
        s.sendall(b"POST /db/restore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        part = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.bak"\r\n'
                b"Content-Type: application/octet-stream\r\n\r\n")
        s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        chunk = b"z" * 65536
        try:
            while sent < total:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:  # reset by the server: it stopped reading
            pass
        with contextlib.suppress(OSError):
            answer = _read_all(s)
    assert sent < total // 4, sent  # cut early (what was sent is mostly the socket buffers)
    if answer:  # the 413 may be lost to the reset; when it arrives it is the right one
        assert _status(answer) == 413 and b"BODY_TOO_LARGE" in answer


def test_a_grpc_message_past_the_batch_body_limit_is_refused_resource_exhausted(node: NodeProc) -> None:
    with grpc.insecure_channel(node.grpc_addr, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = pb_grpc.DOQStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x" * (17 << 20)), timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_undecodable_protobuf_is_refused_invalid_argument(node: NodeProc) -> None:
    garbage = b"\xff\xff\xff\xff\x0f not a message"
    with grpc.insecure_channel(node.grpc_addr) as ch:
        unary = ch.unary_unary("/doq.v1.DOQ/Enqueue", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as e:
            unary(garbage, timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(e.value.trailing_metadata() or ())["doq-reason"] == "INVALID_REQUEST"
        stream = ch.stream_stream("/doq.v1.DOQ/EnqueueStream", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as e:
            list(stream(iter([garbage]), timeout=WAIT_S))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # the server serves on: a valid call works
        assert pb_grpc.DOQStub(ch).ListQueues(pb.ListQueuesRequest(), timeout=WAIT_S) is not None



def test_grpc_calls_past_max_calls_are_refused_resource_exhausted_until_some_end(tmp_path: Path) -> None:
    """Every gRPC call holds memory while it lasts (a long poll up to its `wait_ms`, a
    stream as long as its client keeps it), so one client opening calls without end
    (10,000 long polls took a node up by ~300 MB) is bounded node-wide by `--max-calls`:
    past it a new call, from any client, is refused RESOURCE_EXHAUSTED; once calls end
    new ones are served again."""
    limit = 8
    with running_node(tmp_path / "data", extra_args=["--max-calls", str(limit)]) as n:
        req = urllib.request.Request(n.http_url + "/API/v1/queues", method="POST", data=b'{"name": "polls"}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            assert r.status == 201
        with grpc.insecure_channel(n.grpc_addr) as polls, grpc.insecure_channel(n.grpc_addr) as other:
            poll = pb_grpc.DOQStub(polls).Dequeue
            waiting = [poll.future(pb.DequeueRequest(queue_name="polls", wait_ms=60_000), timeout=180)
                       for _ in range(limit)]
            probe = pb_grpc.DOQStub(other).ListQueues

            def refused() -> bool:
                try:
                    probe(pb.ListQueuesRequest(), timeout=WAIT_S)
                    return False
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                    return True

            until("a call past --max-calls is refused", refused, WAIT_S)
            for f in waiting:
                f.cancel()
            until("calls are served again once the polls ended", lambda: not refused(), WAIT_S)
