"""A delivery is settled only by whoever holds it (`doq.service.held`): the real service over
LMDB and its real gRPC server on 127.0.0.1 (tests/support/inproc)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.queues.commands import EnqueueItem
from doq.queues.model import MessageState
from doq.service.held import NO_LEASE, Held
from tests.support import inproc
from tests.support.inproc import Served


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def _stream_acks(srv: Served, ids: list[int], lease_ids: list[int]) -> None:
    """A second DequeueStream on q (it gets nothing: the queue's one message is leased) that
    acks `ids` and ends; returns once the call is over (its acks are settled by then)."""
    async def requests() -> AsyncIterator[pb.DequeueStreamRequest]:
        yield pb.DequeueStreamRequest(queue_name="q", prefetch=1)
        yield pb.DequeueStreamRequest(ack_ids=ids, ack_lease_ids=lease_ids)

    async for _ in srv.stub.DequeueStream(requests()):
        pass


async def test_a_stream_settles_only_what_it_delivered(served: Served) -> None:
    [res] = await served.api.enqueue_many([("q", EnqueueItem(b"x"))])
    holder_requests: asyncio.Queue[pb.DequeueStreamRequest | None] = asyncio.Queue()
    holder_requests.put_nowait(pb.DequeueStreamRequest(queue_name="q", prefetch=1))

    async def holder_send() -> AsyncIterator[pb.DequeueStreamRequest]:
        while (r := await holder_requests.get()) is not None:
            yield r

    holder = served.stub.DequeueStream(holder_send())
    m = await anext(aiter(holder))
    assert m.id == res.id  # type: ignore[union-attr]
    await _stream_acks(served, [m.id], [])  # another stream, no lease id
    await _stream_acks(served, [m.id], [m.lease_id])  # another stream, the holder's lease id
    got = served.api.node.state.get_message("q", m.id)
    assert (got.state, got.lease_id) == (MessageState.IN_FLIGHT, m.lease_id)
    holder_requests.put_nowait(pb.DequeueStreamRequest(ack_ids=[m.id]))  # the holder: settled
    holder_requests.put_nowait(None)
    async for _ in holder:
        pass
    assert (await served.api.get_queue("q")).stats.total == 0


@pytest.mark.parametrize("call", ["Ack", "Nack", "Touch"])
async def test_settling_by_id_needs_the_lease_id(served: Served, call: str) -> None:
    await served.api.enqueue_many([("q", EnqueueItem(b"x"))])
    [m] = await served.api.dequeue("q")
    request = {"Ack": pb.AckRequest, "Nack": pb.NackRequest, "Touch": pb.TouchRequest}[call]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await getattr(served.stub, call)(request(queue_name="q", id=m.id))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(ei.value.trailing_metadata() or ())["doq-reason"] == "LEASE_REQUIRED"
    got = served.api.node.state.get_message("q", m.id)
    assert (got.state, got.lease_id, got.lease_expires_at_ms) == (MessageState.IN_FLIGHT, m.lease_id,
                                                                   m.lease_expires_at_ms)
    await getattr(served.stub, call)(request(queue_name="q", id=m.id, lease_id=m.lease_id))


def test_held_gives_its_own_lease_and_never_a_wildcard() -> None:
    class View:
        def __init__(self, id_: int, lease_id: int) -> None:
            self.id, self.lease_id = id_, lease_id

    h = Held()
    h.record([View(1, 10), View(2, 20)])  # type: ignore[list-item]
    assert h.acks([1, 3], []) == [10, NO_LEASE]
    assert h.acks([2], [21]) == [NO_LEASE]  # a lease id other than the one it holds
    assert h.take(1, 0) == NO_LEASE  # settled already
    assert h.leases == {}
