"""The columnar batch frame (`EnqueueBatchRequest.columns`) over real gRPC against a real
`doq serve`: round trip of every column, the batch rule, the refusals, and the seed's
one-message-per-frame EnqueueStream next to it."""

from __future__ import annotations

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq_client import DoqClient
from tests.support.proc import NodeProc


@pytest.fixture
def stub(node: NodeProc) -> pb_grpc.DOQStub:
    return pb_grpc.DOQStub(grpc.insecure_channel(node.grpc_addr))


def _frame(**cols: object) -> pb.EnqueueBatchRequest:
    return pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(**cols))  # type: ignore[arg-type]


def test_contents_only_round_trip_in_order(stub: pb_grpc.DOQStub, client: DoqClient, queue: str) -> None:
    bodies = [b"m%d" % i for i in range(300)]
    resp = stub.EnqueueBatch(_frame(queue_name=queue, contents=bodies))
    ids = list(resp.ids)
    assert len(ids) == 300 and ids == sorted(ids) and len(set(ids)) == 300
    assert not resp.HasField("error") and not resp.results and not resp.duplicates
    assert not resp.deliver_at_ms and not resp.error_positions
    got = client.dequeue(queue, max_messages=300, ack=True)
    assert [(m.id, m.content) for m in got] == list(zip(ids, bodies, strict=True))


def test_every_column_round_trips(stub: pb_grpc.DOQStub, client: DoqClient, node: NodeProc) -> None:
    client.create_queue("colsfair", "fair")
    resp = stub.EnqueueBatch(_frame(
        queue_name="colsfair", contents=[b"a", b"b", b"c"], groups=["g1", "g2", "g1"],
        priorities=[3, 1, 2], metadata=[pb.Metadata(entries={"k": "v"}), pb.Metadata(), pb.Metadata()],
        dedup_ids=["d1", "", "d1"], delays_ms=[0, 0, 0]))
    assert not resp.HasField("error")
    assert list(resp.duplicates) == [2] and resp.ids[2] == resp.ids[0]
    msgs = {m.content: m for m in client.dequeue("colsfair", max_messages=10)}
    assert set(msgs) == {b"a", b"b"}
    assert (msgs[b"a"].group, msgs[b"a"].priority, dict(msgs[b"a"].metadata)) == ("g1", 3, {"k": "v"})
    assert (msgs[b"b"].group, msgs[b"b"].priority, msgs[b"b"].dedup_id) == ("g2", 1, "")
    delayed = stub.EnqueueBatch(_frame(queue_name="colsfair", contents=[b"x", b"y"], delays_ms=[0, 60_000]))
    assert delayed.deliver_at_ms[0] == 0 and delayed.deliver_at_ms[1] > 0


def test_stream_answers_each_columns_frame_in_order(stub: pb_grpc.DOQStub, client: DoqClient, queue: str) -> None:
    frames = [_frame(queue_name=queue, contents=[b"%d-%d" % (f, i) for i in range(50)]) for f in range(20)]
    frames.insert(7, _frame(queue_name="no-such-queue", contents=[b"lost"]))
    resps = list(stub.EnqueueBatchStream(iter(frames)))
    assert len(resps) == 21
    assert resps[7].error.reason == "QUEUE_NOT_FOUND" and not resps[7].ids
    ids = [i for r in resps[:7] + resps[8:] for i in r.ids]
    assert len(ids) == 1000 and ids == sorted(ids)
    assert client.get_queue(queue).stats.ready == 1000


@pytest.mark.parametrize(("cols", "reason"), [
    ({"contents": [b"a", b"b"], "priorities": [1]}, "INVALID_COLUMNS"),
    ({"contents": [b"a"] * 10_001}, "BATCH_TOO_LARGE"),
])
def test_a_bad_frame_is_refused_whole(
    stub: pb_grpc.DOQStub, client: DoqClient, queue: str, cols: dict[str, object], reason: str
) -> None:
    (resp,) = stub.EnqueueBatchStream(iter([_frame(queue_name=queue, **cols)]))
    assert resp.error.reason == reason and not resp.ids and not resp.error_positions
    with pytest.raises(grpc.RpcError) as e:
        stub.EnqueueBatch(_frame(queue_name=queue, **cols))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.get_queue(queue).stats.total == 0


@pytest.mark.parametrize(("cols", "reason"), [
    ({"contents": [b"a", b"b", b"c"], "groups": ["ok", "x" * 300, ""]}, "INVALID_GROUP"),
    ({"contents": [b"a", b"x" * (2 << 20), b"c"]}, "MESSAGE_TOO_LARGE"),
])
def test_an_invalid_message_fails_alone(
    stub: pb_grpc.DOQStub, client: DoqClient, queue: str, cols: dict[str, object], reason: str
) -> None:
    for resp in (next(iter(stub.EnqueueBatchStream(iter([_frame(queue_name=queue, **cols)])))),
                 stub.EnqueueBatch(_frame(queue_name=queue, **cols))):
        assert not resp.HasField("error")
        assert list(resp.error_positions) == [1] and resp.errors[0].reason == reason
        assert resp.ids[1] == 0 and resp.ids[0] and resp.ids[2] and resp.ids[0] < resp.ids[2]
    got = client.dequeue(queue, max_messages=10, ack=True)
    assert [m.content for m in got] == [b"a", b"c", b"a", b"c"]


def test_a_frame_with_messages_and_columns_is_refused(stub: pb_grpc.DOQStub, client: DoqClient, queue: str) -> None:
    both = pb.EnqueueBatchRequest(messages=[pb.EnqueueRequest(queue_name=queue, content=b"m")],
                                  columns=pb.EnqueueColumns(queue_name=queue, contents=[b"c"]))
    (resp,) = stub.EnqueueBatchStream(iter([both]))
    assert resp.error.reason == "INVALID_COLUMNS"
    assert client.get_queue(queue).stats.total == 0


def test_one_message_per_frame_still_works_beside_columns(stub: pb_grpc.DOQStub, queue: str) -> None:
    reqs = [pb.EnqueueRequest(queue_name=queue, content=b"s%d" % i) for i in range(100)]
    resps = list(stub.EnqueueStream(iter(reqs)))
    assert all(r.success for r in resps) and [r.id for r in resps] == sorted(r.id for r in resps)
