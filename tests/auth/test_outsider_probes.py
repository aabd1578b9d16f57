"""Attacks of an outsider or a low-privilege client on one real secure node (`doq serve
--secure` on 127.0.0.1: TLS, keys required, real LMDB; nothing faked). Each test is one
hole that was found open, and the proof that it is closed."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPResponse, HTTPSConnection
from pathlib import Path
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.auth.grpc_door import MAX_OPEN_CALLS
from doq.service.http.ui import MAX_SUBSCRIBERS_PER_KEY
from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def http(node: NodeProc, method: str, path: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(node.http_url + path, data=data, method=method, headers=headers)
    try:
        with node.urlopen(req, timeout=60) as r:
            content = r.read()
            return r.status, json.loads(content) if content else None
    except urllib.error.HTTPError as e:
        content = e.read()
        return e.code, json.loads(content) if content else None


def ok(node: NodeProc, method: str, path: str, key: str, body: Any = None) -> Any:
    status, doc = http(node, method, path, key, body)
    assert 200 <= status < 300, (method, path, status, doc)
    return doc


class Node:
    def __init__(self, proc: NodeProc, admin: str) -> None:
        self.proc = proc
        self.admin = admin

    def key(self, *scopes: str) -> str:
        return str(ok(self.proc, "POST", "/API/v1/keys", self.admin, {"scopes": list(scopes)})["key"])

    def queue(self, name: str) -> None:
        ok(self.proc, "POST", "/API/v1/queues", self.admin, {"name": name})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    data = tmp_path_factory.mktemp("probes")
    proc = NodeProc(data, node_id="node-1", extra_args=["--secure"])
    try:
        proc.start()
        key_file = data / "admin.key"
        until("the admin key file", key_file.exists)
        yield Node(proc, key_file.read_text().strip())
    finally:
        proc.kill9()


def _md(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


# -- a delivery's lease id is the holder's alone ---------------------------------------------
def test_get_and_peek_do_not_hand_out_another_consumers_lease_id(node: Node) -> None:
    """Two consumers of one queue: the second must not learn the first's lease id by
    looking at the message (HTTP GET / peek, gRPC Get / Peek) or changing its priority (a
    producer's answer), so it cannot nack, touch, ack or delete the first one's delivery."""
    q = "lease.q"
    node.queue(q)
    holder, other = node.key("consume:lease.", "produce:lease."), node.key("consume:lease.", "produce:lease.")
    n = node.proc
    base = f"/API/v1/queues/{q}/messages"
    ok(n, "POST", base, holder, {"content": "m"})
    held = ok(n, "GET", base, holder)  # leased to the holder
    lease = int(held["lease_id"])
    assert lease != 0

    seen = [ok(n, "GET", f"{base}/{held['id']}", other),
            *ok(n, "GET", f"{base}:peek?state=in_flight", other)["messages"],
            ok(n, "PUT", f"{base}/{held['id']}/priority", other, {"priority": 1})["message"]]
    with n.grpc_channel() as ch:
        stub = pb_grpc.DOQStub(ch)
        got = stub.Get(pb.GetRequest(queue_name=q, id=int(held["id"])), metadata=_md(other))
        peeked = stub.Peek(pb.PeekRequest(queue_name=q, state="in_flight"), metadata=_md(other)).messages
        changed = stub.UpdatePriority(pb.UpdatePriorityRequest(queue_name=q, id=int(held["id"]), priority=2),
                                      metadata=_md(other)).message
        assert [m.lease_id for m in [got, *peeked, changed]] == [0, 0, 0]
    assert [(m["state"], m["lease_id"]) for m in seen] == [("in_flight", "0")] * 3

    # whatever it saw, the other consumer cannot settle the holder's delivery
    for path, body in ((f"{base}/{held['id']}/nack", {"lease_id": seen[0]["lease_id"]}),
                       (f"{base}/{held['id']}/touch", {"lease_id": seen[1]["lease_id"]})):
        status, doc = http(n, "POST", path, other, body)
        assert status in (400, 409), (path, status, doc)
    status, doc = http(n, "DELETE", f"{base}/{held['id']}?lease_id={seen[0]['lease_id']}", other)
    assert status == 409, (status, doc)
    assert ok(n, "GET", f"{base}/{held['id']}", node.admin)["lease_id"] == str(lease)  # an admin sees it
    ok(n, "POST", f"{base}/{held['id']}/nack", holder, {"lease_id": str(lease)})  # the holder settles it


# -- nothing is read before the key is checked ----------------------------------------------
@pytest.mark.parametrize("method", ["Enqueue", "EnqueueBatch", "CreateQueue", "Dequeue"])
def test_a_unary_call_without_a_valid_key_is_refused_before_its_request_is_read(node: Node, method: str) -> None:
    """A unary call refused by the client door must not make the node receive its request
    first: else anyone who reaches the port makes it read and hold a request of up to the
    message limit (16 MiB by default) per call before the refusal (40 such calls took a
    node from 95 MB to 968 MB). The request here never comes (its stream stays open,
    nothing sent): the refusal must come anyway, not the deadline."""
    wrong = node.key("metrics")
    with node.proc.grpc_channel() as ch:
        call = ch.stream_unary(f"/doq.v1.DOQ/{method}", request_serializer=bytes, response_deserializer=bytes)
        for md, want in (([], grpc.StatusCode.UNAUTHENTICATED), (_md("doq_000000000000_bogus"),
                         grpc.StatusCode.UNAUTHENTICATED), (_md(wrong), grpc.StatusCode.PERMISSION_DENIED)):
            never = _Never()
            with pytest.raises(grpc.RpcError) as e:
                call(never, metadata=md, timeout=20)
            assert e.value.code() == want, (md, e.value.code(), e.value.details())
            never.stop()


class _Never:
    """A request iterator that sends `first` (if any), then nothing until `stop` (then ends)."""

    def __init__(self, first: bytes | None = None) -> None:
        self._stop = threading.Event()
        self._first = first

    def __iter__(self) -> _Never:
        return self

    def __next__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        self._stop.wait(30)
        raise StopIteration

    def stop(self) -> None:
        self._stop.set()


# -- connections nobody authenticated are bounded on the gRPC port as on the HTTP port --------
def _idle_connections(proc: NodeProc, n: int) -> tuple[list[ssl.SSLSocket], int]:
    """`n` connections to the gRPC port that finish TLS and send HTTP/2's preface, then
    nothing (no call, no key); and how many of them the node refused in the handshake."""
    ctx = ssl.create_default_context(cafile=str(proc.ca_file))
    ctx.set_alpn_protocols(["h2"])
    out, refused = [], 0
    for _ in range(n):
        raw = socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=30)
        try:
            s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS
            if not s.recv(65536):  # the node's SETTINGS
                raise ConnectionResetError
            s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # its ACK
        except OSError:  # closed by the node before or during the handshake
            raw.close()
            refused += 1
            continue
        out.append(s)
    return out, refused


def _closed_by_server(s: socket.socket) -> bool:
    """Has the server closed `s` (what it sent before the close is read and skipped)?"""
    s.setblocking(False)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:  # reset
        return True


def test_the_grpc_port_holds_at_most_max_connections(tmp_path: Path) -> None:
    """Without a bound, anyone who reaches the gRPC port could hold any number of
    connections without a key (3000 idle ones took a node from 105 MB to 229 MB and 3000
    file descriptors, of its 20000: past them it cannot open a Raft connection or a file).
    `--max-connections` bounds the gRPC port as it bounds the HTTP port: the node closes
    the connections past it (here, long before any timeout could close one)."""
    limit = 20
    proc = NodeProc(tmp_path, node_id="node-1", extra_args=[
        "--secure", "--max-connections", str(limit), "--read-timeout-ms", "3600000", "--keep-alive-ms", "3600000"])
    try:
        proc.start()
        socks, refused = _idle_connections(proc, 3 * limit)
        try:
            until("the node closes the connections past --max-connections",
                  lambda: refused + sum(_closed_by_server(s) for s in socks) >= 2 * limit - 2, 60)
        finally:
            for s in socks:
                s.close()
    finally:
        proc.kill9()


def test_the_grpc_port_closes_unfinished_handshakes_and_idle_connections(tmp_path: Path) -> None:
    """A connection that never finishes its TLS and HTTP/2 handshake is closed after
    `--read-timeout-ms` (gRPC's own default: 120 s), and one that makes no call after
    `--keep-alive-ms` (or `--read-timeout-ms` if longer; gRPC's own default: never), so a
    client without a key cannot fill the `--max-connections` slots with idle connections
    and keep every other client out."""
    proc = NodeProc(tmp_path, node_id="node-1",
                    extra_args=["--secure", "--read-timeout-ms", "1000", "--keep-alive-ms", "1000"])
    try:
        proc.start()
        with socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=90) as mute:  # no TLS hello
            mute.setblocking(False)
            until("the node closes a connection that never starts its handshake", lambda: _closed_by_server(mute), 60)
        socks, _ = _idle_connections(proc, 3)
        try:
            until("the node closes connections that make no call", lambda: all(_closed_by_server(s) for s in socks), 60)
        finally:
            for s in socks:
                s.close()
        with proc.grpc_channel() as ch:  # a client's channel that went idle just reconnects
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            check(b"", timeout=30)
            states: list[grpc.ChannelConnectivity] = []
            ch.subscribe(states.append)
            until("the idle channel closed by the node", lambda: grpc.ChannelConnectivity.IDLE in states, 60)
            assert check(b"", timeout=30) is not None
    finally:
        proc.kill9()


# -- calls of the services that need no key are bounded -------------------------------------
def test_calls_of_the_services_that_need_no_key_are_bounded(node: Node) -> None:
    """Health and reflection need no key, and their calls last as long as the client likes
    (`Health/Watch`, `ServerReflectionInfo` streams; a request of up to the message limit
    still being sent): without a bound, a client without a key could hold any number (5000
    Watch streams on one connection took a node from 92 MB to 207 MB; 40 15 MB
    `Health/Check` requests from 207 MB to 995 MB). At most `MAX_OPEN_CALLS` are in
    progress at once (past it: RESOURCE_EXHAUSTED, before the request is read), and a slot
    is free again once its call ends."""
    with node.proc.grpc_channel() as ch:
        watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=bytes,
                                response_deserializer=bytes)
        reflect = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   request_serializer=bytes, response_deserializer=bytes)
        check = ch.stream_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                response_deserializer=bytes)
        never = [_Never(first=b"\x3a\x00") for _ in range(2)]  # list_services, then nothing
        held = [reflect(n, timeout=120) for n in never]
        held += [watch(b"", timeout=120) for _ in range(MAX_OPEN_CALLS - len(held))]
        try:
            for call in held:
                next(call)  # an answer: the call is in progress
            with pytest.raises(grpc.RpcError) as e:
                next(watch(b"", timeout=120))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
            unsent = _Never()  # a Check whose request never comes: refused all the same
            with pytest.raises(grpc.RpcError) as e:
                check(unsent, timeout=20)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
            unsent.stop()
            held[-1].cancel()
            until("a slot freed by a call that ended", lambda: _opens(watch), 60)
        finally:
            for n in never:
                n.stop()
            for call in held:
                call.cancel()
    with node.proc.grpc_channel() as ch:  # every slot free again: probes work
        until("a health check", lambda: ch.unary_unary("/grpc.health.v1.Health/Check")(
            b"", timeout=20) is not None, 60)


def _opens(watch: Any) -> bool:
    call = watch(b"", timeout=120)
    try:
        next(call)
        return True
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        return False
    finally:
        call.cancel()


# -- one key cannot take every slot of the dashboard's event streams ----------------------------
def _open_events(proc: NodeProc, key: str) -> tuple[HTTPSConnection, HTTPResponse]:
    conn = HTTPSConnection("127.0.0.1", proc.http_port, timeout=60, context=proc.ssl_context())
    conn.request("GET", "/events", headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
    return conn, conn.getresponse()


def test_one_key_cannot_take_every_event_stream(node: Node) -> None:
    """`GET /events` holds a slot per open stream (64 per node): any key with read access
    could hold them all and keep every dashboard, an admin's included, out. One key holds
    at most MAX_SUBSCRIBERS_PER_KEY (past it: 429 problem+json, TOO_MANY_STREAMS_PER_KEY);
    another key and an admin still get a stream; a closed stream gives its key the slot
    back."""
    reader, other = node.key("metrics"), node.key("consume:dash.")
    held = [_open_events(node.proc, reader) for _ in range(MAX_SUBSCRIBERS_PER_KEY)]
    try:
        assert [r.status for _, r in held] == [200] * MAX_SUBSCRIBERS_PER_KEY
        conn, refused = _open_events(node.proc, reader)
        assert refused.status == 429 and refused.getheader("Content-Type") == "application/problem+json"
        assert json.loads(refused.read())["reason"] == "TOO_MANY_STREAMS_PER_KEY"
        conn.close()
        for key in (other, node.admin):
            conn, resp = _open_events(node.proc, key)
            assert resp.status == 200 and resp.readline() == b"retry: 2000\n", key
            conn.close()
        held.pop()[0].close()

        def reopened() -> bool:
            conn, resp = _open_events(node.proc, reader)
            if resp.status == 200:
                held.append((conn, resp))
                return True
            assert resp.status == 429, resp.status
            conn.close()
            return False
        until("the key's stream slot back once one of its streams closed", reopened, 60)
    finally:
        for conn, _ in held:
            conn.close()


# -- one key cannot take every gRPC call the node admits -------------------------------------
def test_one_key_cannot_take_every_grpc_call(tmp_path: Path) -> None:
    """`--max-calls` bounds the calls in progress node-wide, whoever makes them: one key's
    streams or long polls could hold them all and keep every other client out. Past
    `--max-calls-per-key` that key's next call (a long poll, any call) is refused
    RESOURCE_EXHAUSTED `KEY_CALLS_LIMIT` (retryable) while another key's calls, long polls
    included, are served; once its calls end the key is served again."""
    per_key = 4
    proc = NodeProc(tmp_path, node_id="node-1", extra_args=["--secure", "--max-calls-per-key", str(per_key)])
    try:
        proc.start()
        until("the admin key file", (tmp_path / "admin.key").exists)
        n = Node(proc, (tmp_path / "admin.key").read_text().strip())
        n.queue("held")
        n.queue("other")
        greedy, other = n.key("consume"), n.key("consume")
        with proc.grpc_channel() as ch:
            stub = pb_grpc.DOQStub(ch)
            first = pb.DequeueStreamRequest(queue_name="held", prefetch=1)
            nevers = [_Never(first=first.SerializeToString()) for _ in range(per_key)]
            stream = ch.stream_stream("/doq.v1.DOQ/DequeueStream", request_serializer=bytes,
                                      response_deserializer=bytes)
            held = [stream(never, metadata=_md(greedy), timeout=300) for never in nevers]  # calls as long as it likes
            try:
                for i in range(per_key):
                    stub.Enqueue(pb.EnqueueRequest(queue_name="held", content=b"h%d" % i), metadata=_md(n.admin),
                                 timeout=30)
                for call in held:
                    assert next(call)  # a delivery: this stream is in progress on the node
                def refused() -> grpc.RpcError | None:
                    try:
                        stub.Dequeue(pb.DequeueRequest(queue_name="other", wait_ms=100), metadata=_md(greedy),
                                     timeout=30)
                        return None
                    except grpc.RpcError as e:
                        return e
                err = until("the greedy key's next long poll refused", refused, 60)
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                trailers = dict(err.trailing_metadata() or ())
                assert (trailers["doq-reason"], trailers["doq-retryable"]) == ("KEY_CALLS_LIMIT", "true"), trailers
                with pytest.raises(grpc.RpcError) as e:  # any call of it
                    stub.GetQueue(pb.GetQueueRequest(name="other"), metadata=_md(greedy), timeout=30)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert not any(c.done() for c in held)  # its own calls go on

                # another key is served: its long polls (one answered by a message) and other calls
                polls = [stub.Dequeue.future(pb.DequeueRequest(queue_name="other", wait_ms=60_000),
                                             metadata=_md(other), timeout=180) for _ in range(per_key - 1)]
                assert stub.GetQueue(pb.GetQueueRequest(name="other"), metadata=_md(other), timeout=30).queue.name == "other"
                stub.Enqueue(pb.EnqueueRequest(queue_name="other", content=b"m"), metadata=_md(n.admin), timeout=30)
                answered = until("another key's long poll answered", lambda: [
                    m.content for f in polls if f.done() for m in f.result().messages], 60)
                assert answered == [b"m"]
                for f in polls:
                    f.cancel()
            finally:
                for never in nevers:
                    never.stop()
                for c in held:
                    c.cancel()
            until("the greedy key served again once its calls ended", lambda: refused() is None, 60)
    finally:
        proc.kill9()
