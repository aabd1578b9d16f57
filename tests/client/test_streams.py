"""Producers (window, many in flight) and consumers (prefetch, acks in the stream)."""

from __future__ import annotations

import asyncio
import time

import pytest

from doq_client import (
    DoqClient,
    EnqueueResult,
    InvalidArgument,
    Message,
    QueueNotFound,
    enqueue_request,
)
from doq_client.aio import AsyncDoqClient
from doq_client.types import MessageRow
from tests.support.proc import NodeProc


def _drain_ids(client: DoqClient, queue: str) -> list[int]:
    ids: list[int] = []
    while got := client.dequeue(queue, ack=True, max_messages=1000):
        ids.extend(m.id for m in got)
    return ids


def _wait_total(client: DoqClient, queue: str, total: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (t := client.get_queue(queue).stats.total) != total:
        assert time.monotonic() < deadline, f"queue total is {t}, expected {total}"
        time.sleep(0.01)


@pytest.mark.parametrize("batch", [0, 50])
def test_producer_window_many_in_flight(client: DoqClient, queue: str, batch: int) -> None:
    n = 3000
    with client.producer(window=256, batch=batch) as p:
        futs = [p.enqueue(queue, f"m{i}") for i in range(n)]
        assert p._inflight > 1  # pipelined: more than one unacknowledged at once
        many = p.enqueue_many([enqueue_request(queue, b"x") for _ in range(10)])
    ids = [f.result(timeout=10).id for f in futs]
    extra = many.result(timeout=10)
    assert all(isinstance(r, EnqueueResult) for r in extra)
    ids += [r.id for r in extra]  # type: ignore[union-attr]
    assert len(set(ids)) == n + 10
    assert ids[:n] == sorted(ids[:n])  # responses in order
    assert sorted(_drain_ids(client, queue)) == sorted(ids)


def test_producer_item_error_fails_alone(client: DoqClient, queue: str) -> None:
    with client.producer(window=16) as p:
        ok = p.enqueue(queue, b"ok")
        bad = p.enqueue("no-such-queue-xyz", b"x")
        bad_name = p.enqueue("bad name!", b"x")
        ok2 = p.enqueue(queue, b"ok2")
    assert ok.result().id < ok2.result().id
    with pytest.raises(QueueNotFound):
        bad.result()
    with pytest.raises(InvalidArgument):
        bad_name.result()
    assert client.get_queue(queue).stats.ready == 2


def test_producer_batch_frame_is_all_or_nothing(client: DoqClient, queue: str) -> None:
    """EnqueueBatchStream follows the batch rule: one invalid message refuses its frame."""
    with client.producer(window=64, batch=50) as p:
        refused = p.enqueue_many(
            [enqueue_request(queue, b"a"), enqueue_request("bad name!", b"b"), enqueue_request(queue, b"c")]
        )
        p.flush()
        after = p.enqueue(queue, b"d")  # the stream goes on
    outcomes = refused.result(timeout=10)
    assert [type(o) for o in outcomes] == [InvalidArgument] * 3
    assert all(o.reason == "INVALID_QUEUE_NAME" for o in outcomes)  # type: ignore[union-attr]
    assert outcomes[0].message.startswith("messages[1]: ")  # type: ignore[union-attr]
    assert after.result(timeout=10).id > 0
    assert client.get_queue(queue).stats.total == 1


@pytest.mark.parametrize("batched", [False, True])
def test_consumer_prefetch_and_stream_acks(client: DoqClient, queue: str, batched: bool) -> None:
    n = 300
    client.enqueue_batch([enqueue_request(queue, f"{i}") for i in range(n)])
    seen: list[int] = []
    with client.consumer(queue, prefetch=20, batched=batched, max_batch=7) as c:
        for m in c:
            seen.append(m.id)
            if len(seen) % 50 == 0:  # prefetch bounds what is leased and unacked
                assert client.get_queue(queue).stats.in_flight <= 20
            c.ack(m)
            if len(seen) == n:
                break
    assert len(set(seen)) == n
    assert seen == sorted(seen)  # queue order, also with several dequeues in flight (20 > 7)
    _wait_total(client, queue, 0)


@pytest.mark.parametrize("sync", [True, False])
def test_batched_consumer_takes_frames_in_columns(node: NodeProc, client: DoqClient, queue: str, sync: bool) -> None:
    """The batched consumers ask for frames in columns: each message is handed out once, in
    the queue's order, with every field as it was enqueued (`pb` too), and acks settle it."""
    n = 13
    reqs = {f"m{i}".encode(): enqueue_request(
        queue, f"m{i}", group="g" if i % 3 == 0 else "", priority=7 if i % 4 == 1 else 0,
        metadata={"k": str(i)} if i % 5 == 0 else None, dedup_id=f"d{i}" if i % 2 else "") for i in range(n)}
    client.enqueue_batch(list(reqs.values()))
    msgs: list[Message] = []
    if sync:
        with client.consumer(queue, prefetch=10, max_batch=4) as c:
            for m in c:
                msgs.append(m)
                c.ack(m)
                if len(msgs) == n:
                    break
    else:
        async def consume() -> None:
            async with AsyncDoqClient(node.grpc_addr) as ac:
                async with ac.consumer(queue, prefetch=10, max_batch=4) as c:
                    async for m in c:
                        msgs.append(m)
                        c.ack(m)
                        if len(msgs) == n:
                            break
        asyncio.run(consume())
    assert len(msgs) == n and all(isinstance(m._m, MessageRow) for m in msgs)  # came in columns
    assert [(m.priority, m.id) for m in msgs] == sorted((m.priority, m.id) for m in msgs)
    assert {m.content for m in msgs} == set(reqs)
    for m in msgs:
        r = reqs[m.content]
        assert (m.group, m.priority, m.metadata, m.dedup_id, m.attempts, m.state, m.queue_name) == (
            r.group, r.priority, dict(r.metadata), r.dedup_id, 1, "in_flight", queue)
        assert m.pb.id == m.id and dict(m.pb.metadata) == m.metadata and m.pb.lease_id == m.lease_id
    _wait_total(client, queue, 0)


def test_consumer_prefetch_limits_unacked(client: DoqClient, queue: str) -> None:
    client.enqueue_batch([enqueue_request(queue, f"{i}") for i in range(50)])
    with client.consumer(queue, prefetch=5) as c:
        got = [c.next() for _ in range(5)]
        time.sleep(0.3)  # the server must not send more without credits
        assert client.get_queue(queue).stats.in_flight == 5
        c.ack(*[m for m in got if m is not None])
        more = c.next()
        assert more is not None and more.id not in {m.id for m in got if m}
        c.ack(more)
    _wait_total(client, queue, 44)


def test_consumer_nack_redelivers_and_close_releases(client: DoqClient, queue: str) -> None:
    first = client.enqueue(queue, b"a").id
    second = client.enqueue(queue, b"b").id
    with client.consumer(queue, prefetch=1, visibility_timeout_ms=300_000) as c:
        m = c.next()
        assert m is not None and m.id == first and m.attempts == 1
        c.nack(m, priority=-1)
        again = c.next()
        assert again is not None and again.id == first and again.attempts == 2
        c.ack(again)
    # "b" (sent for the credit the ack returned, never handed out) was released on close
    b = client.get(queue, second)
    assert (b.state, b.attempts) == ("ready", 0)
    got = client.dequeue(queue)
    assert got[0].content == b"b"


def test_consumer_auto_ack_mode(client: DoqClient, queue: str) -> None:
    client.enqueue_batch([enqueue_request(queue, f"{i}") for i in range(40)])
    with client.consumer(queue, prefetch=4, ack=True, batched=True) as c:
        contents = []
        for m in c:
            contents.append(m.text)
            if len(contents) == 40:
                break
        with pytest.raises(ValueError):
            c.ack(1)
    assert sorted(contents, key=int) == [str(i) for i in range(40)]
    assert client.get_queue(queue).stats.total == 0


def test_consumer_unknown_queue(client: DoqClient) -> None:
    with pytest.raises(QueueNotFound) as ei:
        with client.consumer("no-such-queue-xyz") as c:
            c.next()
    assert ei.value.reason == "QUEUE_NOT_FOUND"
