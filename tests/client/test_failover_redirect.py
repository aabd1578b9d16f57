"""The client follows the leader: a follower's refusal redirects unary calls, producer
streams and consumer streams; a leader deposed after its commit (outcome unknown to the
client) gets repeatable calls sent again, and the dedup id / "gone" rules make the
repeat harmless. Real gRPC on 127.0.0.1 over the real service and LMDB
(`tests.support.fake_cluster`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.queues.commands import Ack, Enqueue, EnqueueColumns, Nack
from doq_client import (
    AsyncDoqClient,
    DoqClient,
    EnqueueResult,
    FailoverPolicy,
    InvalidArgument,
    MessageNotFound,
    OutcomeUnknown,
    enqueue_request,
)
from tests.support.fake_cluster import Servers, serving
from tests.support.proc import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    with serving(tmp_path) as s:
        s.api_call(lambda api: api.create_queue("q"))
        yield s


def _stats(s: Servers) -> tuple[int, int]:
    """(total, in_flight) of queue "q", read on the leader."""
    info = s.api_call(lambda api: api.get_queue("q"))
    return info.stats.total, info.stats.in_flight


def _wait_stats(s: Servers, want: tuple[int, int], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := _stats(s)) != want:
        assert time.monotonic() < deadline, f"queue q has (total, in_flight) {got}, expected {want}"
        time.sleep(0.01)


def _contents(s: Servers) -> list[bytes]:
    """Every message of queue "q" (drained on the leader)."""
    out: list[bytes] = []

    async def drain() -> None:
        while got := await s.api.dequeue("q", max_messages=1000, ack=True):
            out.extend(m.content for m in got)

    s.loop.run(drain())
    return out


# -- the server's hint ----------------------------------------------------------------------
def test_a_follower_names_the_leaders_grpc_address(servers: Servers) -> None:
    with grpc.insecure_channel(servers.follower_addr) as ch:
        stub = pb_grpc.DOQStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x"), timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        md = dict(ei.value.trailing_metadata())
        assert md["doq-reason"] == "NOT_LEADER" and md["doq-leader"] == "node-1"
        assert md["doq-leader-grpc"] == servers.leader_addr
        servers.api_call(lambda api: api.enqueue("q", _item(b"m")))
        call = stub.DequeueStream(iter([pb.DequeueStreamRequest(queue_name="q", prefetch=1)]), timeout=10)
        with pytest.raises(grpc.RpcError) as ei:
            list(call)
        md = dict(ei.value.trailing_metadata())
        assert md["doq-reason"] == "NOT_LEADER" and md["doq-leader-grpc"] == servers.leader_addr
    assert _stats(servers) == (1, 0)  # refused: nothing leased


def _item(content: bytes) -> object:
    from doq.queues.commands import EnqueueItem

    return EnqueueItem(content)


# -- unary ----------------------------------------------------------------------------------
def test_unary_calls_follow_the_leader(servers: Servers) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: the client goes on to the next one
    with DoqClient(f"{dead}, {servers.follower_addr}", timeout_s=10) as c:
        r = c.enqueue("q", "a", dedup_id="d-a")  # repeatable: sent again on the leader
        assert not r.duplicate and c.router.current == servers.leader_addr
        assert c.get_queue("q").stats.total == 1
    with DoqClient([servers.follower_addr], timeout_s=10) as c:
        # not repeatable (no dedup id), but NOT_LEADER proves the follower did not store it:
        # sent again, to the leader the refusal names
        c.enqueue("q", "b")
        assert c.router.current == servers.leader_addr
        c.enqueue("q", "c")
        [m] = c.dequeue("q", max_messages=1)
        assert m.content == b"a"
    with DoqClient(servers.follower_addr, timeout_s=10) as c:
        c.ack("q", m.id, lease_id=m.lease_id)
    assert _contents(servers) == [b"b", b"c"]  # "b" refused by the follower, sent to the leader
    assert _stats(servers) == (0, 0)


async def test_async_unary_calls_follow_the_leader(servers: Servers) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with AsyncDoqClient([dead, servers.follower_addr], timeout_s=10) as c:
        await c.create_queue("q2")
        assert c.router.current == servers.leader_addr
        r = await c.enqueue("q2", "x", dedup_id="d-x")
        [m] = await c.dequeue("q2")
        assert m.id == r.id
        await c.nack("q2", m.id, lease_id=m.lease_id, release=True)
        assert (await c.get_queue("q2")).stats.ready == 1


def test_a_failover_gives_up_after_its_timeout() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with DoqClient(dead, timeout_s=120, failover=FailoverPolicy(timeout_s=0.5)) as c:
        t0 = time.monotonic()
        with pytest.raises(Exception) as ei:
            c.get_queue("q")
        assert getattr(ei.value, "code", None) == grpc.StatusCode.UNAVAILABLE
        # bounded by the failover timeout, not per-call ones (a wide margin: a loaded CI machine)
        assert time.monotonic() - t0 < 60


# -- producer -------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [0, 16])
def test_a_producer_follows_the_leader(servers: Servers, batch: int) -> None:
    n = 300
    with DoqClient(servers.follower_addr, timeout_s=10) as c, c.producer(window=64, batch=batch) as p:
        futs = [p.enqueue("q", f"m{i}") for i in range(n)]
        many = p.enqueue_many([enqueue_request("q", f"x{i}") for i in range(5)])
        ids = [f.result(timeout=30).id for f in futs]
        extra = many.result(timeout=30)
        assert c.router.current == servers.leader_addr
    assert all(isinstance(r, EnqueueResult) for r in extra)
    assert len(set(ids)) == n and ids == sorted(ids)
    assert sorted(_contents(servers)) == sorted([f"m{i}".encode() for i in range(n)] + [f"x{i}".encode() for i in range(5)])


async def test_an_async_producer_follows_the_leader(servers: Servers) -> None:
    n = 200
    async with AsyncDoqClient(servers.follower_addr, timeout_s=10) as c:
        async with c.producer(window=32, batch=8) as p:
            futs = [await p.enqueue("q", f"m{i}") for i in range(n)]
        ids = [(await f).id for f in futs]
    assert len(set(ids)) == n
    assert sorted(_contents(servers)) == sorted(f"m{i}".encode() for i in range(n))


# -- consumer -------------------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_a_consumer_follows_the_leader(servers: Servers, batched: bool) -> None:
    n = 60
    servers.api_call(lambda api: api.enqueue_many([("q", _item(b"%d" % i)) for i in range(n)]))  # type: ignore[misc]
    got: list[bytes] = []
    with DoqClient(servers.follower_addr, timeout_s=10) as c, c.consumer("q", prefetch=10, batched=batched) as cons:
        for m in cons:
            got.append(m.content)
            cons.ack(m)
            if len(got) == n:
                break
        assert c.router.current == servers.leader_addr
    assert sorted(got) == sorted(b"%d" % i for i in range(n))
    _wait_stats(servers, (0, 0))


async def test_an_async_consumer_follows_the_leader(servers: Servers) -> None:
    n = 30
    servers.api_call(lambda api: api.enqueue_many([("q", _item(b"%d" % i)) for i in range(n)]))  # type: ignore[misc]
    got: list[bytes] = []
    async with AsyncDoqClient(servers.follower_addr, timeout_s=10) as c:
        async with c.consumer("q", prefetch=8) as cons:
            async for m in cons:
                got.append(m.content)
                cons.ack(m)
                if len(got) == n:
                    break
    assert sorted(got) == sorted(b"%d" % i for i in range(n))
    await asyncio.to_thread(_wait_stats, servers, (0, 0))


# -- outcome unknown: a leader deposed after its commit ---------------------------------------
def _deposed(s: Servers, command: type, times: int) -> None:
    def arm() -> None:
        s.leader.refusals[command] = times

    s.loop.call(arm)


@pytest.mark.parametrize("batch", [0, 4, None])
def test_a_producer_resends_by_dedup_id_and_gets_the_original_ids(servers: Servers, batch: int | None) -> None:
    _deposed(servers, Enqueue if batch == 0 else EnqueueColumns, 3)  # coalesced: column frames
    n = 40
    with DoqClient(servers.leader_addr, timeout_s=10) as c, c.producer(window=8, batch=batch) as p:
        futs = [p.enqueue("q", f"m{i}") for i in range(n)]
        results = [f.result(timeout=30) for f in futs]
    # the first commands were stored, then refused: sent again, they were found by their
    # dedup ids and answer with the ids they were stored under
    assert results[0].duplicate
    assert len({r.id for r in results}) == n
    assert sorted(_contents(servers)) == sorted(f"m{i}".encode() for i in range(n))


def test_without_dedup_ids_a_maybe_stored_message_fails_instead_of_being_resent(servers: Servers) -> None:
    _deposed(servers, EnqueueColumns, 1)  # the producer coalesces into column frames
    with DoqClient(servers.leader_addr, timeout_s=10) as c, c.producer(window=4, auto_dedup=False) as p:
        futs = [p.enqueue("q", f"m{i}") for i in range(12)]
        p.flush()
    failed = [f for f in futs if f.exception() is not None]
    assert failed and all(isinstance(f.exception(), OutcomeUnknown) for f in failed)
    assert isinstance(futs[0].exception(), OutcomeUnknown)
    contents = _contents(servers)
    stored_ok = {f"m{i}".encode() for i, f in enumerate(futs) if f.exception() is None}
    assert len(contents) == len(set(contents)) and stored_ok <= set(contents)
    assert b"m0" in contents  # failed, yet stored (once): what "outcome unknown" means


def test_unary_repeats_after_an_unknown_outcome(servers: Servers) -> None:
    with DoqClient(servers.leader_addr, timeout_s=10) as c:
        _deposed(servers, Enqueue, 1)
        r = c.enqueue("q", "a", dedup_id="d-1")  # stored, refused, sent again: found by dedup id
        assert r.duplicate
        _deposed(servers, Enqueue, 1)
        with pytest.raises(OutcomeUnknown):
            c.enqueue("q", "b")  # no dedup id: not sent again (and it was stored)
        assert c.get_queue("q").stats.total == 2
        m1, m2 = c.dequeue("q", max_messages=2)
        # an ack repeated after an unknown outcome that answers MESSAGE_NOT_FOUND did its work
        _deposed(servers, Ack, 1)
        c.ack("q", m1.id, lease_id=m1.lease_id)
        _deposed(servers, Nack, 1)
        c.nack("q", m2.id, lease_id=m2.lease_id, delay_ms=0)  # repeat answers STALE_LEASE
        assert c.get_queue("q").stats.total == 1 and c.get_queue("q").stats.ready == 1
        [m2] = c.dequeue("q")
        with pytest.raises(InvalidArgument) as ei:
            c.ack("q", m2.id)  # no lease id: refused before anything is proposed
        assert ei.value.reason == "LEASE_REQUIRED"
        c.ack("q", m2.id, lease_id=m2.lease_id)
        with pytest.raises(MessageNotFound):
            c.ack("q", m2.id, lease_id=m2.lease_id)  # a first answer is never reinterpreted
        for content in ("c", "d"):
            c.enqueue("q", content)
        ms = c.dequeue("q", max_messages=2)
        _deposed(servers, Ack, 1)
        res = c.ack_batch("q", [m.id for m in ms], [m.lease_id for m in ms])
        assert [r.error for r in res] == [None, None]
    assert _stats(servers) == (0, 0)
