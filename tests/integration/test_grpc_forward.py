"""gRPC follower forwarding on a real three-process cluster: every doq.v1.DOQ call a
follower receives (unary or stream) is relayed to the leader, with the leader's gRPC
address in the answer's initial metadata (`doq-leader-grpc`), its errors and trailers
relayed as they are, and a cancelled call cancelled at the leader too."""

from __future__ import annotations

import queue as queue_mod
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from doq.service.grpc_forward import FORWARDED_BY, LEADER_GRPC
from tests.support.cluster import cluster_view, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
TIMEOUT_S = 30


class Cluster:
    """The three nodes, which one leads, and a stub per node."""

    def __init__(self, nodes: list[NodeProc]) -> None:
        self.nodes = nodes
        self.channels = {n.node_id: grpc.insecure_channel(n.grpc_addr) for n in nodes}
        self.stubs = {nid: pb_grpc.DOQStub(ch) for nid, ch in self.channels.items()}
        self.leader, self.followers = self.settle()

    def settle(self) -> tuple[NodeProc, list[NodeProc]]:
        """Wait until all three nodes name the same leader; returns (leader, followers)."""
        def agreed() -> str:
            leaders = {cluster_view(n.http_url)["leader_id"] for n in self.nodes}
            return leaders.pop() if len(leaders) == 1 else ""

        leader_id = until("one leader known to all", agreed)
        leader = next(n for n in self.nodes if n.node_id == leader_id)
        return leader, [n for n in self.nodes if n is not leader]

    def stub(self, node: NodeProc) -> pb_grpc.DOQStub:
        return self.stubs[node.node_id]

    def stats(self, name: str) -> pb.QueueStats:
        return self.stub(self.leader).GetQueue(pb.GetQueueRequest(name=name), timeout=TIMEOUT_S).queue.stats

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with three_nodes(tmp_path_factory.mktemp("grpcfwd") / "data") as nodes:
        c = Cluster(nodes)
        try:
            yield c
        finally:
            c.close()


def metadata(md: Any) -> dict[str, str]:
    return {k: v for k, v in (md or ())}


def create_queue(c: Cluster, name: str) -> None:
    c.stub(c.followers[0]).CreateQueue(pb.CreateQueueRequest(name=name, type="delayed"), timeout=TIMEOUT_S)


def test_unary_calls_on_a_follower_reach_the_leader(cluster: Cluster) -> None:
    f1, f2 = cluster.followers
    resp, call = cluster.stub(f1).CreateQueue.with_call(pb.CreateQueueRequest(name="unary"), timeout=TIMEOUT_S)
    assert resp.success
    assert metadata(call.initial_metadata())[LEADER_GRPC] == cluster.leader.grpc_addr
    ids = []
    for i in range(5):
        resp, call = cluster.stub(f2).Enqueue.with_call(
            pb.EnqueueRequest(queue_name="unary", content=b"m%d" % i), timeout=TIMEOUT_S)
        assert resp.success and resp.id
        assert metadata(call.initial_metadata())[LEADER_GRPC] == cluster.leader.grpc_addr
        ids.append(resp.id)
    assert ids == sorted(set(ids))
    # a read on a follower is served there (linearizable), so it sees every enqueue
    got = cluster.stub(f1).GetQueue(pb.GetQueueRequest(name="unary"), timeout=TIMEOUT_S)
    assert got.queue.stats.ready == 5
    peeked, call = cluster.stub(f2).Peek.with_call(pb.PeekRequest(queue_name="unary", limit=5), timeout=TIMEOUT_S)
    assert [m.id for m in peeked.messages] == ids and LEADER_GRPC not in metadata(call.initial_metadata())
    groups, call = cluster.stub(f2).ListGroups.with_call(pb.ListGroupsRequest(queue_name="unary"), timeout=TIMEOUT_S)
    assert list(groups.groups) == [] and LEADER_GRPC not in metadata(call.initial_metadata())  # a delayed queue
    deq = cluster.stub(f1).Dequeue(pb.DequeueRequest(queue_name="unary", ack=True, max_messages=5), timeout=TIMEOUT_S)
    assert sorted(m.content for m in deq.messages) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert cluster.stats("unary").total == 0


def test_enqueue_stream_pipelined_on_a_follower(cluster: Cluster) -> None:
    create_queue(cluster, "stream-in")
    n = 500
    requests = (pb.EnqueueRequest(queue_name="stream-in" if i != 250 else "no-such-queue", content=b"%d" % i)
                for i in range(n))  # all sent without waiting for an answer
    responses = cluster.stub(cluster.followers[1]).EnqueueStream(requests, timeout=TIMEOUT_S)
    got = list(responses)
    assert metadata(responses.initial_metadata())[LEADER_GRPC] == cluster.leader.grpc_addr
    assert len(got) == n
    assert got[250].error.reason == "QUEUE_NOT_FOUND" and not got[250].success
    ok = [r.id for i, r in enumerate(got) if i != 250]
    assert all(r.success for i, r in enumerate(got) if i != 250)
    assert ok == sorted(set(ok))  # one answer per request, in order
    assert responses.code() == grpc.StatusCode.OK
    assert cluster.stats("stream-in").ready == n - 1


def test_dequeue_stream_with_acks_on_a_follower(cluster: Cluster) -> None:
    create_queue(cluster, "stream-out")
    n = 60
    cluster.stub(cluster.leader).EnqueueBatch(pb.EnqueueBatchRequest(
        messages=[pb.EnqueueRequest(queue_name="stream-out", content=b"%d" % i) for i in range(n)]), timeout=TIMEOUT_S)
    outbox: queue_mod.Queue[pb.DequeueStreamRequest | None] = queue_mod.Queue()
    outbox.put(pb.DequeueStreamRequest(queue_name="stream-out", ack=False, prefetch=10, auto_credit=True))

    def requests() -> Iterator[pb.DequeueStreamRequest]:
        while (r := outbox.get()) is not None:
            yield r

    stream = cluster.stub(cluster.followers[0]).DequeueStream(requests(), timeout=TIMEOUT_S)
    seen: list[bytes] = []
    for m in stream:
        assert m.state == "in_flight" and m.lease_id
        seen.append(m.content)
        outbox.put(pb.DequeueStreamRequest(ack_ids=[m.id], ack_lease_ids=[m.lease_id]))
        if len(seen) == n:
            outbox.put(None)  # half-close: the stream ends once the acks are settled
    assert sorted(seen) == sorted(b"%d" % i for i in range(n))
    assert stream.code() == grpc.StatusCode.OK
    assert metadata(stream.initial_metadata())[LEADER_GRPC] == cluster.leader.grpc_addr
    stats = cluster.stats("stream-out")
    assert (stats.total, stats.in_flight) == (0, 0)


def long_polls_waiting(node: NodeProc) -> int:
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    match = re.search(r"^doq_long_polls_waiting (\S+)$", text, re.M)
    assert match, text
    return int(float(match.group(1)))


def test_a_cancelled_long_poll_on_a_follower_takes_nothing(cluster: Cluster) -> None:
    create_queue(cluster, "poll")
    leader = cluster.leader
    assert long_polls_waiting(leader) == 0
    fut = cluster.stub(cluster.followers[0]).Dequeue.future(
        pb.DequeueRequest(queue_name="poll", ack=True, wait_ms=60_000), timeout=120)

    def parked_on_leader() -> bool:
        assert not fut.done(), fut.exception()
        return long_polls_waiting(leader) == 1

    until("the forwarded long poll waits on the leader", parked_on_leader)
    assert fut.cancel()
    # well before the poll's own 60 s: the cancellation, not the timeout, ended it
    until("the leader's long poll ends with the client's call", lambda: long_polls_waiting(leader) == 0,
          timeout_s=30)
    cluster.stub(leader).Enqueue(pb.EnqueueRequest(queue_name="poll", content=b"kept"), timeout=TIMEOUT_S)
    assert cluster.stats("poll").ready == 1  # nobody took it


def test_a_cancelled_dequeue_stream_on_a_follower_takes_nothing(cluster: Cluster) -> None:
    create_queue(cluster, "poll-stream")
    leader = cluster.leader
    outbox: queue_mod.Queue[pb.DequeueStreamRequest | None] = queue_mod.Queue()
    outbox.put(pb.DequeueStreamRequest(queue_name="poll-stream", ack=True))

    def requests() -> Iterator[pb.DequeueStreamRequest]:
        while (r := outbox.get()) is not None:
            yield r

    stream = cluster.stub(cluster.followers[1]).DequeueStream(requests(), timeout=120)
    try:
        until("the forwarded stream waits on the leader", lambda: long_polls_waiting(leader) == 1)
        assert stream.cancel()
        until("the leader's stream ends with the client's call", lambda: long_polls_waiting(leader) == 0,
              timeout_s=30)
    finally:
        outbox.put(None)
    cluster.stub(leader).Enqueue(pb.EnqueueRequest(queue_name="poll-stream", content=b"kept"), timeout=TIMEOUT_S)
    assert cluster.stats("poll-stream").ready == 1


def test_errors_of_the_leader_are_relayed_with_their_trailers(cluster: Cluster) -> None:
    follower = cluster.stub(cluster.followers[0])
    with pytest.raises(grpc.RpcError) as e:
        follower.Enqueue(pb.EnqueueRequest(queue_name="missing", content=b"x"), timeout=TIMEOUT_S)
    err: Any = e.value
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert metadata(err.trailing_metadata())["doq-reason"] == "QUEUE_NOT_FOUND"
    assert metadata(err.trailing_metadata())["doq-retryable"] == "false"
    assert metadata(err.initial_metadata())[LEADER_GRPC] == cluster.leader.grpc_addr
    with pytest.raises(grpc.RpcError) as e:
        follower.CreateQueue(pb.CreateQueueRequest(name="bad name!"), timeout=TIMEOUT_S)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert metadata(e.value.trailing_metadata())["doq-reason"] == "INVALID_QUEUE_NAME"  # type: ignore[attr-defined]
    # a stream the leader ends with an error
    stream = follower.DequeueStream(iter([pb.DequeueStreamRequest(queue_name="missing")]), timeout=TIMEOUT_S)
    with pytest.raises(grpc.RpcError):
        list(stream)
    assert stream.code() == grpc.StatusCode.NOT_FOUND
    assert metadata(stream.trailing_metadata())["doq-reason"] == "QUEUE_NOT_FOUND"


def test_a_forwarded_call_that_reaches_a_follower_is_answered_not_leader(cluster: Cluster) -> None:
    """No second hop: two nodes with stale views of the leader never bounce a call."""
    create_queue(cluster, "hops")
    with pytest.raises(grpc.RpcError) as e:
        cluster.stub(cluster.followers[1]).Enqueue(
            pb.EnqueueRequest(queue_name="hops", content=b"x"), metadata=[(FORWARDED_BY, "elsewhere")],
            timeout=TIMEOUT_S)
    err: Any = e.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    trailers = metadata(err.trailing_metadata())
    assert (trailers["doq-reason"], trailers["doq-leader"]) == ("NOT_LEADER", cluster.leader.node_id)
    assert trailers["doq-leader-grpc"] == cluster.leader.grpc_addr
    assert cluster.stats("hops").total == 0


def test_health_is_answered_by_the_follower_itself(cluster: Cluster) -> None:
    follower = cluster.followers[0]
    health = health_pb2_grpc.HealthStub(cluster.channels[follower.node_id])
    resp, call = health.Check.with_call(health_pb2.HealthCheckRequest(service="doq.v1.DOQ"), timeout=TIMEOUT_S)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    assert LEADER_GRPC not in metadata(call.initial_metadata())


def test_concurrent_forwarded_streams_through_one_follower(cluster: Cluster) -> None:
    """Several producers at once through one follower: every message arrives once."""
    create_queue(cluster, "many")
    stub = cluster.stub(cluster.followers[1])
    errors: list[BaseException] = []

    def produce(k: int) -> None:
        try:
            got = list(stub.EnqueueStream(
                (pb.EnqueueRequest(queue_name="many", content=b"%d-%d" % (k, i)) for i in range(100)),
                timeout=TIMEOUT_S))
            assert len(got) == 100 and all(r.success for r in got)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    assert not errors, errors
    assert cluster.stats("many").ready == 400


def test_a_dead_leader_is_answered_retryable_until_a_new_one_serves(tmp_path: Path) -> None:
    """kill -9 of the leader: a follower answers each call with a retryable UNAVAILABLE
    carrying a reason (LEADER_UNREACHABLE while it still believes in the dead leader,
    NOT_LEADER while none is known) until the new leader serves it."""
    with three_nodes(tmp_path / "data") as nodes:
        c = Cluster(nodes)
        try:
            c.stub(c.followers[0]).CreateQueue(pb.CreateQueueRequest(name="after"))  # no deadline
            c.leader.kill9()
            reasons: list[str] = []

            def enqueued() -> bool:
                try:
                    c.stub(c.followers[0]).Enqueue(pb.EnqueueRequest(queue_name="after", content=b"x"), timeout=10)
                    return True
                except grpc.RpcError as e:
                    err: Any = e
                    trailers = metadata(err.trailing_metadata())
                    assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
                    assert trailers.get("doq-retryable") == "true", (err.details(), trailers)
                    assert trailers["doq-leader"] in ("", c.leader.node_id), trailers
                    reasons.append(trailers["doq-reason"])
                    return False

            until("a new leader serves", enqueued)
            assert set(reasons) <= {"LEADER_UNREACHABLE", "NOT_LEADER"}, reasons
        finally:
            c.close()
