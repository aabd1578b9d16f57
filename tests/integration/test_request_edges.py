"""Requests at the edges of the published schema, on a real `doq serve` (HTTP and gRPC on
127.0.0.1): what the document allows is accepted (integers written `24129.0`, a peek page
reaching past the window), what it refuses it says (message id 0), every 405 lists all
the methods of its path in `Allow`, an id beyond 2^64-1 names no message (404), and NUL
characters are refused in groups and dedup ids on HTTP and gRPC alike (the queue
unchanged) while content and metadata keep them."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

Q = "/API/v1/queues"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(tmp_path_factory.mktemp("edges") / "data") as n:
        for name in ("edges", "nul"):
            assert call(n, "POST", Q, {"name": name, "type": "fair"})[0] == 201
        yield n


def call(node: NodeProc, method: str, path: str, body: object = None,
         raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(node.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, headers, out = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, out = e.code, e.headers, e.read()
    hdrs = {k.lower(): v for k, v in headers.items()}
    return status, hdrs, json.loads(out) if out and "json" in hdrs.get("content-type", "") else out


def test_integers_written_with_a_zero_fraction_are_integers(node: NodeProc) -> None:
    """JSON Schema's `integer` includes 24129.0 (and 1e3); the seed's clients may send them."""
    status, _, doc = call(node, "POST", f"{Q}/edges/messages", raw=b'{"content": "a", "priority": 24129.0}')
    assert status == 201, doc
    status, _, got = call(node, "GET", f"{Q}/edges/messages/{doc['id']}")
    assert status == 200 and got["priority"] == 24129
    assert call(node, "POST", f"{Q}/edges/messages", raw=b'{"content": "b", "priority": 1e3}')[0] == 201
    big = b'{"content": "c", "priority": 9223372036854775807.0}'  # exact: no float rounding
    status, _, doc = call(node, "POST", f"{Q}/edges/messages", raw=big)
    assert status == 201 and call(node, "GET", f"{Q}/edges/messages/{doc['id']}")[2]["priority"] == 2**63 - 1
    status, _, doc = call(node, "PUT", f"{Q}/edges", raw=b'{"settings": {"max_unacked_per_group": 5.0}}')
    assert status == 200 and doc["queue"]["settings"]["max_unacked_per_group"] == 5
    status, headers, _ = call(node, "POST", "/db/backup", raw=b'{"since": 0.0}')
    assert status == 200 and headers["x-last-version"]
    status, _, doc = call(node, "POST", f"{Q}/edges/messages:dequeue",
                          raw=b'{"max_messages": 1.0, "wait_ms": 0.0, "ack": true}')
    assert status == 200, doc
    for bad in (b'{"content": "d", "priority": 24129.5}', b'{"content": "d", "priority": 1e400}'):
        status, _, doc = call(node, "POST", f"{Q}/edges/messages", raw=bad)
        assert status == 400 and doc["reason"] == "INVALID_REQUEST", doc


def test_message_ids_in_paths(node: NodeProc) -> None:
    with urllib.request.urlopen(node.http_url + "/openapi.json", timeout=60) as r:
        document = json.loads(r.read())
    params = document["paths"][f"{Q}/{{name}}/messages/{{id}}"]["get"]["parameters"]
    pattern = next(p["schema"]["pattern"] for p in params if p["name"] == "id")
    assert not re.search(pattern, "0") and not re.search(pattern, "000") and re.search(pattern, "123")
    status, _, doc = call(node, "GET", f"{Q}/edges/messages/0")
    assert status == 400 and doc["reason"] == "INVALID_ID"
    status, _, doc = call(node, "POST", f"{Q}/edges/messages/99999999999999999999/ack", {})
    assert status == 404 and doc["reason"] == "MESSAGE_NOT_FOUND", doc


@pytest.mark.parametrize(("path", "allow"), [
    (Q, "GET, HEAD, POST"),
    (f"{Q}/edges", "DELETE, GET, HEAD, PUT"),
    (f"{Q}/edges/messages", "GET, HEAD, POST"),
    (f"{Q}/edges/messages/1", "DELETE, GET, HEAD"),
    ("/API/v1/keys", "GET, HEAD, POST"),
])
def test_a_405_lists_every_method_of_its_path(node: NodeProc, path: str, allow: str) -> None:
    status, headers, doc = call(node, "OPTIONS", path)
    assert status == 405 and doc["reason"] == "METHOD_NOT_ALLOWED"
    assert headers["allow"] == allow


def test_a_peek_page_reaching_past_the_window_is_cut_there(node: NodeProc) -> None:
    status, _, doc = call(node, "GET", f"{Q}/edges/messages:peek?offset=9998&limit=20")
    assert status == 200 and doc["next_offset"] is None, doc
    assert call(node, "GET", f"{Q}/edges/messages:peek?offset=10000&limit=1")[0] == 400


def _total(node: NodeProc, queue: str) -> int:
    status, _, doc = call(node, "GET", f"{Q}/{queue}")
    assert status == 200
    return int(doc["stats"]["total"])


def test_nul_is_refused_in_groups_and_dedup_ids_on_http_and_grpc(node: NodeProc) -> None:
    before = _total(node, "nul")
    for field, reason in (("group", "INVALID_GROUP"), ("dedup_id", "INVALID_DEDUP_ID")):
        status, _, doc = call(node, "POST", f"{Q}/nul/messages", {"content": "x", field: "a\u0000b"})
        assert (status, doc["reason"]) == (400, reason), doc
        status, _, doc = call(node, "POST", f"{Q}/nul/messages:batch",
                              {"messages": [{"content": "ok"}, {"content": "x", field: "\u0000"}]})
        assert (status, doc["reason"]) == (400, reason), doc
    with node.grpc_channel() as ch:
        stub = pb_grpc.DOQStub(ch)
        for req in (pb.EnqueueRequest(queue_name="nul", content=b"x", group="g\x00"),
                    pb.EnqueueRequest(queue_name="nul", content=b"x", dedup_id="\x00d")):
            with pytest.raises(grpc.RpcError) as e:
                stub.Enqueue(req, timeout=60)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        cols = stub.EnqueueBatch(pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(
            queue_name="nul", contents=[b"a", b"b"], dedup_ids=["fine", "bad\x00"])), timeout=60)
        assert list(cols.error_positions) == [1] and cols.errors[0].reason == "INVALID_DEDUP_ID"
        assert _total(node, "nul") == before + 1  # only the valid message of the columns
        # content and metadata are the application's: kept as given
        got = stub.Enqueue(pb.EnqueueRequest(queue_name="nul", content=b"a\x00b", metadata={"k\x00": "v\x00"}),
                           timeout=60)
        msg = stub.Get(pb.GetRequest(queue_name="nul", id=got.id), timeout=60)
    assert msg.content == b"a\x00b" and dict(msg.metadata) == {"k\x00": "v\x00"}
