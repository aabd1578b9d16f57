"""The client goes to the leader once an answer names it, on a real three-node cluster
(`doq serve` processes on 127.0.0.1): a follower relays a call to the leader and names
the leader in the answer's initial metadata (`doq-leader-grpc`); a client pointed only at
that follower sends its next calls to the leader, and a producer's and a consumer's
streams opened on the follower move to the leader, losing and doubling nothing. The
follower's own counters (`doq_grpc_forwarded_calls_total`, `..._in_progress` on /metrics)
show what it still relays. Then the leader is killed (SIGKILL) and the moved streams fail
over as before."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq_client import AsyncDoqClient, DoqClient, QueueNotFound
from tests.support.cluster import cluster_view, http_call, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
TIMEOUT_S = 30
_SAMPLE = re.compile(r'^(doq_grpc_forwarded_calls_\w+)(?:\{method="(\w+)"\})? ([0-9.e+]+)$', re.M)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path_factory.mktemp("follow") / "data") as ns:
        yield ns


def settle(nodes: list[NodeProc]) -> tuple[NodeProc, list[NodeProc]]:
    """Wait until every live node names the same leader; returns (leader, followers)."""
    live = [n for n in nodes if n.proc is not None and n.proc.poll() is None]

    def agreed() -> str:
        ids = {cluster_view(n.http_url)["leader_id"] for n in live}
        return ids.pop() if len(ids) == 1 else ""

    leader_id = until("one leader known to all", agreed)
    leader = next(n for n in live if n.node_id == leader_id)
    return leader, [n for n in live if n is not leader]


def relayed(node: NodeProc) -> dict[str, float]:
    """`node`'s forwarding metrics: {method: calls relayed} plus "in_progress"."""
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, method, value in _SAMPLE.findall(text):
        if name == "doq_grpc_forwarded_calls_total":
            out[method] = float(value)
        elif name == "doq_grpc_forwarded_calls_in_progress":
            out["in_progress"] = float(value)
    return out


def relayed_calls(node: NodeProc) -> float:
    return sum(v for k, v in relayed(node).items() if k != "in_progress")


def create_queue_on(node: NodeProc, name: str, settings: pb.QueueSettings | None = None) -> None:
    """Create a queue with a stub of its own (the client under test learns nothing)."""
    with grpc.insecure_channel(node.grpc_addr) as ch:
        pb_grpc.DOQStub(ch).CreateQueue(pb.CreateQueueRequest(name=name, type="delayed", settings=settings),
                                        timeout=TIMEOUT_S)


# -- unary calls ------------------------------------------------------------------------------
def test_a_client_pointed_at_a_follower_sends_its_calls_to_the_leader(nodes: list[NodeProc]) -> None:
    leader, (follower, _) = settle(nodes)
    before = relayed_calls(follower)
    with DoqClient(follower.grpc_addr, timeout_s=TIMEOUT_S) as c:
        assert c.router.current == follower.grpc_addr
        c.create_queue("unary")  # relayed by the follower, whose answer names the leader
        assert c.router.current == leader.grpc_addr
        ids = [c.enqueue("unary", f"m{i}").id for i in range(20)]
        got = c.dequeue("unary", max_messages=20)
        c.ack_batch("unary", [m.id for m in got], [m.lease_id for m in got])
        assert sorted(m.id for m in got) == sorted(ids)
        assert c.router.current == leader.grpc_addr
    assert relayed_calls(follower) - before == 1  # the first call only


def test_an_error_relayed_by_a_follower_moves_the_client_too(nodes: list[NodeProc]) -> None:
    leader, (follower, _) = settle(nodes)
    with DoqClient(follower.grpc_addr, timeout_s=TIMEOUT_S) as c:
        with pytest.raises(QueueNotFound):
            c.purge_queue("no-such-queue")  # relayed, and answered with an error
        assert c.router.current == leader.grpc_addr


def test_the_async_client_follows_the_leader(nodes: list[NodeProc]) -> None:
    leader, (_, follower) = settle(nodes)
    before = relayed_calls(follower)

    async def run() -> None:
        async with AsyncDoqClient(follower.grpc_addr, timeout_s=TIMEOUT_S) as c:
            await c.create_queue("async-unary")
            assert c.router.current == leader.grpc_addr
            for i in range(10):
                await c.enqueue("async-unary", f"m{i}")
            assert len(await c.dequeue("async-unary", max_messages=10, ack=True)) == 10

    asyncio.run(run())
    assert relayed_calls(follower) - before == 1


def test_a_follower_names_the_leader_in_its_relayed_http_answers(nodes: list[NodeProc]) -> None:
    leader, (follower, _) = settle(nodes)
    req = urllib.request.Request(follower.http_url + "/API/v1/queues", data=b'{"name": "http-q"}', method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        assert r.status == 201
        assert r.headers["X-Doq-Leader"] == leader.http_url.removeprefix("http://")
    status, _ = http_call(leader.http_url, "GET", "/API/v1/queues/http-q")
    assert status == 200
