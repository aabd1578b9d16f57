"""Lease ids against real processes: three `doq serve` nodes on 127.0.0.1, real gRPC and
HTTP, nothing faked.

A lease id derives from a random seed the leader puts in the Dequeue entry, so a second
consumer of the same queue cannot settle the first one's delivery by guessing ids near
its own; every replica derives the same ids (equal digests, the same lease on every
member); the holder settles with its own lease. A delivered (in-flight) message is
deleted only with its lease id (or by an admin): see `test_delete_of_an_in_flight_message_needs_its_lease`.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pbg

from tests.support.cluster import call, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
Q = "leases"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path_factory.mktemp("leases") / "data") as nodes:
        status, body = call(nodes[0], "POST", "/API/v1/queues", {"name": Q, "type": "delayed"})
        assert status == 201, body
        yield nodes


def settled(nodes: list[NodeProc]) -> dict[str, tuple[str, int]]:
    """{node: (digest, applied index)} once every node has applied the same index."""
    def same() -> dict[str, tuple[str, int]] | None:
        out = {}
        for n in nodes:
            status, body = call(n, "GET", "/db/digest")
            if status != 200:
                return None
            out[n.node_id] = (body["digest"], body["applied_index"])
        return out if len(set(out.values())) == 1 else None
    return dict(until("equal digests at one applied index", same))


def code_of(fn: object, *args: object) -> grpc.StatusCode:
    try:
        fn(*args, timeout=30)  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_another_consumer_cannot_settle_a_delivery_by_guessing_its_lease(cluster: list[NodeProc]) -> None:
    with cluster[0].grpc_channel() as ch_a, cluster[1].grpc_channel() as ch_b:
        a, b = pbg.DOQStub(ch_a), pbg.DOQStub(ch_b)
        for i in range(12):
            a.Enqueue(pb.EnqueueRequest(queue_name=Q, content=b"m%d" % i), timeout=30)
        # leases long enough to outlast ~1000 guessed acks on a loaded machine (the queue's
        # 30 s default once ran out: the messages went back to ready mid-test)
        hour_ms = 3_600_000
        first = a.Dequeue(pb.DequeueRequest(queue_name=Q, max_messages=5, visibility_timeout_ms=hour_ms),
                          timeout=30).messages
        second = b.Dequeue(pb.DequeueRequest(queue_name=Q, max_messages=1, visibility_timeout_ms=hour_ms),
                           timeout=30).messages
        assert len(first) == 5 and len(second) == 1
        mine = second[0].lease_id
        theirs = {m.id: m.lease_id for m in first}
        assert len(set(theirs.values())) == 5 and 0 not in theirs.values()
        assert all(abs(lid - mine) > 2**20 for lid in theirs.values())  # not a sequence near B's
        # B guesses: ids around its own lease, and the small ids sequential leases would have
        guesses = sorted({mine + d for d in range(-64, 65) if mine + d > 0} | set(range(1, 65)))
        for id_ in theirs:
            for lid in guesses:
                code = code_of(b.Ack, pb.AckRequest(queue_name=Q, id=id_, lease_id=lid))
                assert code == grpc.StatusCode.ABORTED, (id_, lid, code)  # STALE_LEASE
            assert code_of(b.Touch, pb.TouchRequest(queue_name=Q, id=id_, lease_id=mine)) != grpc.StatusCode.OK
            assert code_of(b.Nack, pb.NackRequest(queue_name=Q, id=id_, lease_id=mine)) != grpc.StatusCode.OK
        # every member derived the same leases and holds A's messages in flight, untouched
        settled(cluster)
        for n in cluster:
            with n.grpc_channel() as ch:
                stub = pbg.DOQStub(ch)
                for id_, lid in theirs.items():
                    m = stub.Get(pb.GetRequest(queue_name=Q, id=id_), timeout=30)
                    assert m.lease_id == lid, (n.node_id, id_)
        # the holder settles with its own leases
        for id_, lid in theirs.items():
            a.Ack(pb.AckRequest(queue_name=Q, id=id_, lease_id=lid), timeout=30)
        b.Ack(pb.AckRequest(queue_name=Q, id=second[0].id, lease_id=mine), timeout=30)
    settled(cluster)
