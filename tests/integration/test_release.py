"""A release (a nack that undoes the delivery) over gRPC and HTTP, on a real `doq serve`:
the attempt is not counted, the message is ready at once, a release never dead-letters,
and a release with a delay or a priority is refused and changes nothing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(Path(tmp_path_factory.mktemp("release")) / "data") as n:
        yield n


@pytest.fixture
def stub(node: NodeProc) -> Iterator[pb_grpc.DOQStub]:
    with grpc.insecure_channel(node.grpc_addr) as ch:
        yield pb_grpc.DOQStub(ch)


def _http_nack(node: NodeProc, queue: str, id_: int, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"{node.http_url}/API/v1/queues/{queue}/messages/{id_}/nack", data=json.dumps(body).encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("via", ["grpc", "http"])
def test_release_restores_the_attempt_and_never_dead_letters(
    node: NodeProc, stub: pb_grpc.DOQStub, via: str
) -> None:
    queue = f"rel-{via}"
    stub.CreateQueue(pb.CreateQueueRequest(name=queue, settings=pb.QueueSettings(max_attempts=1)))
    id_ = stub.Enqueue(pb.EnqueueRequest(queue_name=queue, content=b"x", priority=5)).id
    for _ in range(3):  # max_attempts 1: a nack would dead-letter it at once
        [m] = stub.Dequeue(pb.DequeueRequest(queue_name=queue, visibility_timeout_ms=600_000)).messages
        assert (m.id, m.attempts) == (id_, 1)
        if via == "grpc":
            stub.Nack(pb.NackRequest(queue_name=queue, id=id_, lease_id=m.lease_id, release=True))
        else:
            assert _http_nack(node, queue, id_, {"lease_id": str(m.lease_id), "release": True}) == (
                200, {"success": True})
        got = stub.Get(pb.GetRequest(queue_name=queue, id=id_))
        assert (got.state, got.attempts, got.priority, got.lease_id) == ("ready", 0, 5, 0)
    stats = stub.GetQueue(pb.GetQueueRequest(name=queue)).queue.stats
    assert (stats.ready, stats.dead) == (1, 0)


def test_release_with_delay_or_priority_is_refused(node: NodeProc, stub: pb_grpc.DOQStub) -> None:
    queue = "rel-bad"
    stub.CreateQueue(pb.CreateQueueRequest(name=queue))
    id_ = stub.Enqueue(pb.EnqueueRequest(queue_name=queue, content=b"x")).id
    [m] = stub.Dequeue(pb.DequeueRequest(queue_name=queue, visibility_timeout_ms=600_000)).messages
    with pytest.raises(grpc.RpcError) as ei:
        stub.Nack(pb.NackRequest(queue_name=queue, id=id_, lease_id=m.lease_id, delay_ms=10, release=True))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(ei.value.trailing_metadata())["doq-reason"] == "INVALID_RELEASE"
    status, doc = _http_nack(node, queue, id_, {"lease_id": str(m.lease_id), "priority": 3, "release": True})
    assert (status, doc["reason"]) == (400, "INVALID_RELEASE")
    got = stub.Get(pb.GetRequest(queue_name=queue, id=id_))
    assert (got.state, got.attempts, got.lease_id) == ("in_flight", 1, m.lease_id)  # unchanged
