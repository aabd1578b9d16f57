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
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq_client import AsyncDoqClient, Consumer, DoqClient, FailoverPolicy, Message, QueueNotFound
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


# -- streams ----------------------------------------------------------------------------------
def consume(cons: Consumer, n: int, got: list[Message]) -> None:
    """Take `n` messages from `cons` into `got`, acking each."""
    for m in cons:
        got.append(m)
        cons.ack(m)
        if len(got) == n:
            return


def stats(node: NodeProc, queue: str) -> pb.QueueStats:
    with grpc.insecure_channel(node.grpc_addr) as ch:
        return pb_grpc.DOQStub(ch).GetQueue(pb.GetQueueRequest(name=queue), timeout=TIMEOUT_S).queue.stats


def moved_off(follower: NodeProc, before: dict[str, float],
              methods: tuple[str, ...] = ("EnqueueBatchStream", "DequeueBatchStream")) -> None:
    """The follower relayed one stream of each of `methods`, and relays nothing now (the
    streams, still open, moved to the leader)."""
    until("the follower relays no stream any more",
          lambda: relayed(follower)["in_progress"] == before.get("in_progress", 0))
    now = relayed(follower)
    for method in methods:
        assert now.get(method, 0) - before.get(method, 0) == 1, (method, before, now)


def test_a_producer_and_a_consumer_opened_on_a_follower_move_to_the_leader(nodes: list[NodeProc]) -> None:
    """Nothing lost, nothing doubled: every future succeeds once (with auto_dedup off, a
    message sent again would fail or be stored twice), each message is delivered once
    (attempts 1: the move's releases are not counted) and acked."""
    leader, (follower, _) = settle(nodes)
    create_queue_on(leader, "moved")
    n = 3000
    before = relayed(follower)
    got: list[Message] = []
    with DoqClient(follower.grpc_addr, timeout_s=TIMEOUT_S) as c:
        # small frames: several are in flight when the first answer names the leader
        with c.producer(window=256, batch=50, auto_dedup=False) as p, c.consumer("moved", prefetch=64) as cons:
            reader = threading.Thread(target=consume, args=(cons, n, got), daemon=True)
            reader.start()  # the consumer's stream is open on the follower, waiting
            futs = [p.enqueue("moved", f"m{i}") for i in range(n)]
            assert p.flush(120)
            results = [f.result() for f in futs]
            reader.join(120)
            assert not reader.is_alive(), f"{len(got)} of {n} messages delivered"
            moved_off(follower, before)
            assert c.router.current == leader.grpc_addr
        ids = [r.id for r in results]
        assert len(set(ids)) == n and not any(r.duplicate for r in results)
        assert sorted(m.id for m in got) == sorted(ids)  # each delivered once
        assert sorted(m.content for m in got) == sorted(f"m{i}".encode() for i in range(n))
        assert {m.attempts for m in got} == {1}
    until("every message acked", lambda: stats(leader, "moved").total == 0)


def test_async_streams_opened_on_a_follower_move_to_the_leader(nodes: list[NodeProc]) -> None:
    """Also the one-message-per-frame streams (EnqueueStream, DequeueStream)."""
    leader, (_, follower) = settle(nodes)
    create_queue_on(leader, "moved-async")
    n = 2000
    before = relayed(follower)
    got: list[Message] = []

    async def run() -> list[Any]:
        async with AsyncDoqClient(follower.grpc_addr, timeout_s=TIMEOUT_S) as c:
            async with (
                c.producer(window=256, batch=0, auto_dedup=False) as p,
                c.consumer("moved-async", prefetch=64, batched=False) as cons,
            ):

                async def take() -> None:
                    async for m in cons:
                        got.append(m)
                        cons.ack(m)
                        if len(got) == n:
                            return

                reader = asyncio.create_task(take())
                futs = [await p.enqueue("moved-async", f"m{i}") for i in range(n)]
                results = await asyncio.gather(*futs)
                await asyncio.wait_for(reader, 120)
                await asyncio.to_thread(moved_off, follower, before, ("EnqueueStream", "DequeueStream"))
                assert c.router.current == leader.grpc_addr
                return results

    results = asyncio.run(run())
    ids = [r.id for r in results]
    assert len(set(ids)) == n and not any(r.duplicate for r in results)
    assert sorted(m.id for m in got) == sorted(ids)
    assert {m.attempts for m in got} == {1}
    until("every message acked", lambda: stats(leader, "moved-async").total == 0)


def test_moved_streams_fail_over_when_the_leader_dies(nodes: list[NodeProc]) -> None:
    """Last in this module: it kills the leader (SIGKILL) under the streams that moved to it."""
    leader, (follower, _) = settle(nodes)
    create_queue_on(leader, "after-move", pb.QueueSettings(visibility_timeout_ms=3000))
    before = relayed(follower)
    n1, n2 = 300, 1500
    want = {f"a{i}".encode() for i in range(n1)} | {f"b{i}".encode() for i in range(n2)}
    got: list[Message] = []
    with DoqClient(follower.grpc_addr, timeout_s=10, failover=FailoverPolicy(timeout_s=90)) as c:
        with c.producer(window=128) as p, c.consumer("after-move", prefetch=32) as cons:
            first = [p.enqueue("after-move", f"a{i}") for i in range(n1)]
            assert p.flush(120)
            consume(cons, n1, got)
            moved_off(follower, before)
            futs: list[Future[Any]] = []
            for i in range(n2):
                futs.append(p.enqueue("after-move", f"b{i}"))
                if i == n2 // 3:
                    _until_done(futs, 100)
                    leader.kill9()
            assert p.flush(180)
            results = [f.result() for f in first + futs]
            assert len({r.id for r in results}) == n1 + n2  # each stored once
            for m in cons:  # redeliveries allowed (an ack lost with the leader), losses not
                assert m.content in want
                got.append(m)
                cons.ack(m)
                if {x.content for x in got} == want:
                    break
        new_leader, _ = settle(nodes)
        assert new_leader is not leader and c.router.current == new_leader.grpc_addr
        deadline = time.monotonic() + 60
        while (total := stats(new_leader, "after-move").total) > 0:  # acks lost with the leader
            assert time.monotonic() < deadline, f"{total} messages left"
            for m in c.dequeue("after-move", max_messages=100, wait_ms=500):
                assert m.content in want
                c.ack("after-move", m.id, lease_id=m.lease_id)


def _until_done(futs: list[Future[Any]], k: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(f.done() for f in futs) < k:
        assert time.monotonic() < deadline, "no results"
        time.sleep(0.01)
