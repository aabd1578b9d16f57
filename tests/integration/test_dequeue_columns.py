"""DequeueBatchStream frames in columns (`DequeueStreamRequest.columns`), over real gRPC on
127.0.0.1 and a temporary LMDB: the same messages, order, leases and acks as frames of
`Message`s, and both kinds of stream on one queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.queues.commands import EnqueueItem
from doq.queues.model import MessageState
from doq_client.types import MessageRow, rows_from_columns
from tests.support import inproc
from tests.support.inproc import Served

PAST_TS_PRIORITY = 1_600_000_000  # a priority read as a Unix time in the past: deliverable, deliver_at set


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


def _items(n: int) -> list[EnqueueItem]:
    """Messages that set every optional field in some and leave it unset in others."""
    return [EnqueueItem(b"c%d" % i, group="g" if i % 3 == 0 else "", priority=[0, 0, 7, PAST_TS_PRIORITY][i % 4],
                        metadata={"k": str(i)} if i % 5 == 0 else {}, dedup_id=f"d{i}" if i % 2 else "")
            for i in range(n)]


class _Stream:
    """One DequeueBatchStream call fed from a queue of requests."""

    def __init__(self, srv: Served, **first: object) -> None:
        self.requests: asyncio.Queue[pb.DequeueStreamRequest | None] = asyncio.Queue()
        self.requests.put_nowait(pb.DequeueStreamRequest(queue_name="q", auto_credit=True, **first))  # type: ignore[arg-type]
        self.call = srv.stub.DequeueBatchStream(self._send())

    async def _send(self) -> AsyncIterator[pb.DequeueStreamRequest]:
        while (r := await self.requests.get()) is not None:
            yield r

    async def frame(self) -> pb.MessageBatch:
        return await asyncio.wait_for(self.call.read(), 20)

    def ack(self, msgs: list[MessageRow] | list[pb.Message]) -> None:
        self.requests.put_nowait(pb.DequeueStreamRequest(ack_ids=[m.id for m in msgs],
                                                        ack_lease_ids=[m.lease_id for m in msgs]))


async def _half_close(s: _Stream) -> None:
    s.requests.put_nowait(None)
    # the server settles, releases what it did not send and ends the call
    while await asyncio.wait_for(s.call.read(), 20) is not grpc.aio.EOF:
        pass


async def test_columns_frame_carries_the_messages_a_messages_frame_carries(served: Served) -> None:
    await served.api.enqueue_many([("q", it) for it in _items(12)])
    s = _Stream(served, prefetch=12, max_batch=12, columns=True)
    frame = await s.frame()
    assert frame.HasField("columns") and not frame.messages
    rows = rows_from_columns(frame.columns)
    state = served.api.node.state
    for r in rows:  # each is leased, with the lease the server recorded
        v = state.get_message("q", r.id)
        assert (v.state, v.lease_id, v.lease_expires_at_ms, v.attempts) == (
            MessageState.IN_FLIGHT, r.lease_id, r.lease_expires_at_ms, r.attempts)
    s.requests.put_nowait(pb.DequeueStreamRequest(nacks=[
        pb.NackRequest(id=r.id, lease_id=r.lease_id, release=True) for r in rows]))
    await _half_close(s)
    assert (await served.api.get_queue("q")).stats.ready == 12  # released: attempt taken back

    old = _Stream(served, prefetch=12, max_batch=12)
    frame = await old.frame()
    assert frame.messages and not frame.HasField("columns")
    got = list(frame.messages)

    def fields(m: pb.Message) -> pb.Message:  # a delivery's own fields aside
        c = pb.Message()
        c.CopyFrom(m)
        c.ClearField("lease_id")
        c.ClearField("lease_expires_at_ms")
        return c

    assert [fields(r.to_pb()) for r in rows] == [fields(m) for m in got]
    assert any(r.metadata for r in rows) and any(r.group for r in rows) and any(r.dedup_id for r in rows)
    assert any(r.priority for r in rows) and any(r.deliver_at_ms for r in rows)
    old.ack(got)
    await _half_close(old)
    assert (await served.api.get_queue("q")).stats.total == 0


async def test_old_and_new_streams_on_one_queue_get_each_message_once(served: Served) -> None:
    """A stream asking for columns and one without, taking turns on one queue, acking in
    the stream: every message is delivered once, each stream's in queue order, all acked."""
    n = 60
    ids = [r.id for r in await served.api.enqueue_many([("q", EnqueueItem(b"%d" % i)) for i in range(n)])]  # type: ignore[union-attr]
    new = _Stream(served, prefetch=10, max_batch=5, columns=True)
    old = _Stream(served, prefetch=10, max_batch=5)
    seen: dict[str, list[int]] = {"new": [], "old": []}
    while len(seen["new"]) + len(seen["old"]) < n:
        for name, s in (("new", new), ("old", old)):
            if len(seen["new"]) + len(seen["old"]) == n:
                break
            frame = await s.frame()
            msgs: list[MessageRow] | list[pb.Message] = (
                rows_from_columns(frame.columns) if name == "new" else list(frame.messages))
            assert frame.HasField("columns") == (name == "new")
            seen[name] += [m.id for m in msgs]
            s.ack(msgs)
    assert sorted(seen["new"] + seen["old"]) == ids  # each once
    assert seen["new"] == sorted(seen["new"]) and seen["old"] == sorted(seen["old"])
    assert seen["new"] and seen["old"]
    await _half_close(new)
    await _half_close(old)
    deadline = time.monotonic() + 60
    while (await served.api.get_queue("q")).stats.total:
        assert time.monotonic() < deadline, "the acks were not all applied"
        await asyncio.sleep(0.01)


def test_rows_refuse_a_column_of_another_length() -> None:
    cols = pb.MessageColumns(queue_name="q", ids=[1, 2], contents=[b"a", b"b"], lease_ids=[3, 4],
                             attempts=[1, 1], lease_expires_at_ms=[9, 9], enqueued_at_ms=[5, 5],
                             groups=["g"])
    with pytest.raises(ValueError):
        rows_from_columns(cols)
    del cols.groups[:]
    rows = rows_from_columns(cols)
    assert [(r.id, r.content, r.group, r.lease_id, r.state, dict(r.metadata)) for r in rows] == [
        (1, b"a", "", 3, "in_flight", {}), (2, b"b", "", 4, "in_flight", {})]
