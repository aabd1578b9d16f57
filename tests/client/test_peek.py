"""`Peek` over gRPC (the Python client, sync and async) against a real node: the messages
the next dequeues take, in that order, page by page, without leasing any or counting an
attempt; the other states; bad input refused and nothing changed."""

from __future__ import annotations

import time

import pytest

from doq_client import AsyncDoqClient, DoqClient, InvalidArgument, NotFound
from tests.support.proc import NodeProc


def test_peek_shows_what_the_next_dequeues_take_and_takes_nothing(client: DoqClient, queue: str) -> None:
    ids = [client.enqueue(queue, f"m{i}", priority=p).id for i, p in enumerate([5, 1, 3, 1, 9, 2])]
    future = int(time.time() * 1000) + 3_600_000
    late = client.enqueue(queue, "late", priority=future).id  # a timestamp priority: delayed an hour
    first = client.peek(queue, 4)
    rest = client.peek(queue, 4, offset=4)
    assert [m.content for m in first + rest] == [b"m1", b"m3", b"m5", b"m2", b"m0", b"m4"]
    assert {m.state for m in first + rest} == {"ready"} and all(m.attempts == 0 for m in first + rest)
    assert [m.id for m in client.peek(queue, 10, state="delayed")] == [late]
    assert client.get_queue(queue).stats.in_flight == 0  # nothing leased by looking
    taken = client.dequeue(queue, max_messages=6, visibility_timeout_ms=30_000)
    assert [m.id for m in taken] == [m.id for m in first + rest] and sorted(ids) == sorted(m.id for m in taken)
    assert all(m.attempts == 1 for m in taken)  # the peeks counted no attempt
    in_flight = client.peek(queue, 10, state="in_flight")  # by lease expiry (one batch: one expiry, then id)
    assert [m.id for m in in_flight] == sorted(m.id for m in taken) and {m.state for m in in_flight} == {"in_flight"}
    assert client.peek(queue) == []


@pytest.mark.parametrize("kwargs", [{"state": "gone"}, {"limit": 101}, {"offset": 10_000}])
def test_bad_peeks_are_refused(client: DoqClient, queue: str, kwargs: dict[str, object]) -> None:
    client.enqueue(queue, "x")
    args: dict[str, object] = {"limit": 20, **kwargs}
    with pytest.raises(InvalidArgument):
        client.peek(queue, **args)  # type: ignore[arg-type]
    assert client.get_queue(queue).stats.ready == 1


def test_peek_of_a_missing_queue_is_not_found(client: DoqClient, queue_name: str) -> None:
    with pytest.raises(NotFound):
        client.peek(queue_name)


async def test_async_peek(node: NodeProc, queue_name: str) -> None:
    async with AsyncDoqClient(node.grpc_addr) as c:
        await c.create_queue(queue_name, "fair")
        for g in ("a", "a", "b"):
            await c.enqueue(queue_name, g, group=g)
        peeked = await c.peek(queue_name)
        assert [m.group for m in peeked] == ["a", "b", "a"]  # the round-robin's order
        assert [m.id for m in await c.dequeue(queue_name, max_messages=3)] == [m.id for m in peeked]
