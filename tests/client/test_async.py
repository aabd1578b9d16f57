"""The asyncio client, producer and consumer against a real node."""

from __future__ import annotations

import asyncio

import pytest

from doq_client import (
    AsyncDoqClient,
    EnqueueResult,
    InvalidArgument,
    NotFound,
    QueueNotFound,
    QueueSettings,
    enqueue_request,
)
from tests.support.proc import NodeProc


async def test_async_unary_methods(node: NodeProc, queue_name: str) -> None:
    async with AsyncDoqClient(node.grpc_addr) as c:
        q = await c.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=9000))
        assert q.settings.visibility_timeout_ms == 9000
        assert (
            await c.update_queue(queue_name, QueueSettings(max_attempts=5))
        ).settings.max_attempts == 5
        assert queue_name in [x.name for x in await c.list_queues()]
        r = await c.enqueue(queue_name, "a", group="g", priority=3, metadata={"x": "1"})
        batch = await c.enqueue_batch([enqueue_request(queue_name, b"b", priority=4)])
        assert isinstance(batch[0], EnqueueResult)
        assert (await c.get(queue_name, r.id)).metadata == {"x": "1"}
        assert (await c.get_queue(queue_name)).stats.ready == 2
        [m] = await c.dequeue(queue_name, visibility_timeout_ms=5000)
        assert m.id == r.id
        assert await c.touch(queue_name, m.id, lease_id=m.lease_id) > 0
        await c.nack(queue_name, m.id, lease_id=m.lease_id, priority=10)
        assert (await c.update_priority(queue_name, m.id, 1)).priority == 1
        ms = await c.dequeue(queue_name, max_messages=2)
        assert [x.id for x in ms] == [r.id, batch[0].id]  # type: ignore[union-attr]
        await c.ack(queue_name, ms[0].id, lease_id=ms[0].lease_id)
        results = await c.ack_batch(queue_name, [ms[1].id], [ms[1].lease_id])
        assert results[0].ok
        r3 = await c.enqueue(queue_name, b"c")
        await c.delete(queue_name, r3.id)
        with pytest.raises(NotFound):
            await c.get(queue_name, r3.id)
        await c.enqueue(queue_name, b"d")
        assert await c.purge_queue(queue_name) == 1
        # long poll: a dequeue waiting in the server returns when a message arrives
        waiter = asyncio.ensure_future(c.dequeue(queue_name, wait_ms=60_000, ack=True))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await c.enqueue(queue_name, b"wake")
        got = await asyncio.wait_for(waiter, 60)  # woken by the message, not the poll's end
        assert [x.content for x in got] == [b"wake"]
        with pytest.raises(InvalidArgument):
            await c.enqueue("bad name!", b"x")
        await c.delete_queue(queue_name)
        with pytest.raises(QueueNotFound) as ei:
            await c.delete_queue(queue_name)
        assert ei.value.reason == "QUEUE_NOT_FOUND"


@pytest.mark.parametrize("batch", [0, 64])
async def test_async_producer_and_consumer(node: NodeProc, queue_name: str, batch: int) -> None:
    n = 2000
    async with AsyncDoqClient(node.grpc_addr) as c:
        await c.create_queue(queue_name)
        async with c.producer(window=200, batch=batch) as p:
            futs = [await p.enqueue(queue_name, f"{i}") for i in range(n)]
            bad = await p.enqueue("no-such-queue-xyz", b"x")
            many = await p.enqueue_many([enqueue_request(queue_name, b"m") for _ in range(5)])
            await p.flush()
        ids = [f.result().id for f in futs]
        assert len(set(ids)) == n and ids == sorted(ids)
        with pytest.raises(QueueNotFound):
            bad.result()
        assert all(isinstance(x, EnqueueResult) for x in many.result())

        seen: set[int] = set()
        async with c.consumer(queue_name, prefetch=50, batched=bool(batch), max_batch=32) as cons:
            async for m in cons:
                seen.add(m.id)
                cons.ack(m)
                if len(seen) == n + 5:
                    break
        assert ids[0] in seen and len(seen) == n + 5
        for _ in range(500):
            if (await c.get_queue(queue_name)).stats.total == 0:
                break
            await asyncio.sleep(0.01)
        assert (await c.get_queue(queue_name)).stats.total == 0
