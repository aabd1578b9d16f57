"""The client through a leader change on a real three-node cluster (`doq serve` processes
on 127.0.0.1): the leader is killed (SIGKILL) under a producer, then under a consumer.
Every producer future resolves exactly once, every message is stored once, and the
consumer gets every message and acks it on whichever node leads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.service.grpc_forward import FORWARDED_BY
from doq_client import DoqClient, FailoverPolicy, QueueSettings
from tests.integration.test_cluster import cluster, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

__all__ = ["cluster"]  # the fixture


def _kill_leader(c: DoqClient, nodes: list[NodeProc]) -> NodeProc:
    """kill -9 the node the cluster names as leader (asked through the client)."""
    leader_id = until("a leader", lambda: c.stub.ListServers(pb.ListServersRequest(), timeout=5).leader_id)
    [victim] = [n for n in nodes if n.node_id == leader_id]
    victim.kill9()
    return victim


def _count_calls(n: int) -> tuple[list[int], Callable[[int], Callable[[object], None]]]:
    counts = [0] * n
    lock = threading.Lock()

    def count(i: int) -> Callable[[object], None]:
        def done(_: object) -> None:
            with lock:
                counts[i] += 1

        return done

    return counts, count


def _refusal_trailers(follower: NodeProc) -> dict[str, str]:
    """A follower relays a client's call to the leader; one marked as relayed already it refuses."""
    with grpc.insecure_channel(follower.grpc_addr) as ch:
        try:
            pb_grpc.DOQStub(ch).Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x"), timeout=10,
                                        metadata=[(FORWARDED_BY, "another-node")])
        except grpc.RpcError as e:
            return dict(e.trailing_metadata() or ())
    raise AssertionError(f"{follower.node_id} took a write")


def test_a_producer_and_a_consumer_go_on_through_leader_kills(cluster: list[NodeProc]) -> None:
    n = 1500
    failover = FailoverPolicy(timeout_s=90)
    with DoqClient([x.grpc_addr for x in cluster], timeout_s=10, failover=failover) as c:
        c.create_queue("q", settings=QueueSettings(visibility_timeout_ms=3000))
        leader_id = c.stub.ListServers(pb.ListServersRequest(), timeout=5).leader_id
        [leader] = [x for x in cluster if x.node_id == leader_id]
        follower = next(x for x in cluster if x is not leader)
        md = _refusal_trailers(follower)  # a follower names the leader and its gRPC address
        assert md["doq-reason"] == "NOT_LEADER" and md["doq-leader"] == leader_id
        assert md["doq-leader-grpc"] == leader.grpc_addr
        counts, count = _count_calls(n)
        futs = []
        with c.producer(window=128) as p:
            for i in range(n):
                f = p.enqueue("q", f"m{i}")
                f.add_done_callback(count(i))
                futs.append(f)
                if i == n // 3:
                    _until_done(futs, 100)
                    victim = _kill_leader(c, cluster)
            assert p.flush(180)
        ids = [f.result().id for f in futs]
        assert counts == [1] * n and len(set(ids)) == n
        victim.start(timeout_s=90)  # rejoins from its own data: two may fail again

        got: set[bytes] = set()
        with c.consumer("q", prefetch=32) as cons:
            for m in cons:
                got.add(m.content)
                cons.ack(m)
                if len(got) == n // 3 and victim.proc is not None and victim.proc.poll() is None:
                    victim = _kill_leader(c, cluster)
                if len(got) == n:
                    break
        assert got == {f"m{i}".encode() for i in range(n)}  # each stored once, none lost
        # every message acked at last (a lost in-stream ack means a redelivery: ack it then)
        deadline = time.monotonic() + 60
        while (total := c.get_queue("q").stats.total) > 0:
            assert time.monotonic() < deadline, f"{total} messages left"
            for m in c.dequeue("q", max_messages=100, wait_ms=500):
                assert m.content in got
                c.ack("q", m.id, lease_id=m.lease_id)


def _until_done(futs: list[Future[Any]], k: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(f.done() for f in futs) < k:
        assert time.monotonic() < deadline, "no results"
        time.sleep(0.01)
