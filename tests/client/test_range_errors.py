"""A value out of its protobuf field's range is the client's `InvalidArgument` (with the
server's reason for that field), never a bare protobuf `ValueError`; nothing is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from doq_client import AsyncDoqClient, DoqClient, InvalidArgument, QueueSettings, enqueue_request
from tests.support.proc import NodeProc

I64_OVER, I64_UNDER, U64_OVER = 2**63, -(2**63) - 1, 2**64

CASES: list[tuple[str, Callable[[DoqClient, str], Any], str]] = [
    ("enqueue priority > int64", lambda c, q: c.enqueue(q, b"x", priority=I64_OVER), "INVALID_PRIORITY"),
    ("enqueue priority < int64", lambda c, q: c.enqueue(q, b"x", priority=I64_UNDER), "INVALID_PRIORITY"),
    ("enqueue delay_ms < 0", lambda c, q: c.enqueue(q, b"x", delay_ms=-1), "INVALID_DELAY"),
    ("enqueue_request priority", lambda c, q: enqueue_request(q, b"x", priority=I64_OVER), "INVALID_PRIORITY"),
    ("update_priority", lambda c, q: c.update_priority(q, 1, I64_OVER), "INVALID_PRIORITY"),
    ("get id < 0", lambda c, q: c.get(q, -1), "INVALID_ID"),
    ("delete id > uint64", lambda c, q: c.delete(q, U64_OVER), "INVALID_ID"),
    ("ack lease_id < 0", lambda c, q: c.ack(q, 1, lease_id=-1), "INVALID_ARGUMENT"),
    ("ack_batch ids", lambda c, q: c.ack_batch(q, [1, -1]), "INVALID_ID"),
    ("nack delay_ms < 0", lambda c, q: c.nack(q, 1, delay_ms=-5), "INVALID_DELAY"),
    ("nack priority", lambda c, q: c.nack(q, 1, priority=I64_OVER), "INVALID_PRIORITY"),
    ("touch visibility", lambda c, q: c.touch(q, 1, visibility_timeout_ms=-1), "INVALID_TIMEOUT"),
    ("dequeue max_messages", lambda c, q: c.dequeue(q, max_messages=-1), "INVALID_MAX"),
    ("dequeue wait_ms", lambda c, q: c.dequeue(q, wait_ms=-1), "INVALID_WAIT"),
    ("settings", lambda c, q: c.update_queue(q, QueueSettings(max_attempts=-1)), "INVALID_SETTINGS"),
    ("producer priority", lambda c, q: _with_producer(c, lambda p: p.enqueue(q, b"x", priority=I64_OVER)),
     "INVALID_PRIORITY"),
    ("consumer prefetch", lambda c, q: c.consumer(q, prefetch=2**32), "INVALID_ARGUMENT"),
    ("consumer ack id", lambda c, q: _with_consumer(c, q, lambda k: k.ack(-1)), "INVALID_ID"),
    ("consumer nack delay", lambda c, q: _with_consumer(c, q, lambda k: k.nack(1, delay_ms=-1)), "INVALID_DELAY"),
]


def _with_producer(c: DoqClient, fn: Callable[[Any], Any]) -> None:
    with c.producer() as p:
        fn(p)


def _with_consumer(c: DoqClient, q: str, fn: Callable[[Any], Any]) -> None:
    with c.consumer(q, prefetch=1) as k:
        fn(k)


@pytest.mark.parametrize(("call", "reason"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_out_of_range_is_invalid_argument(
    client: DoqClient, queue: str, call: Callable[[DoqClient, str], Any], reason: str
) -> None:
    with pytest.raises(InvalidArgument) as ei:
        call(client, queue)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and ei.value.reason == reason
    assert "must be an integer within" in ei.value.message
    q = client.get_queue(queue)
    assert q.stats.total == 0 and q.settings.max_attempts == 0  # nothing was sent


async def test_async_client_out_of_range(node: NodeProc, queue: str) -> None:
    async with AsyncDoqClient(node.grpc_addr) as c:
        with pytest.raises(InvalidArgument) as ei:
            await c.enqueue(queue, b"x", priority=I64_OVER)
        assert ei.value.reason == "INVALID_PRIORITY"
        with pytest.raises(InvalidArgument) as ei:
            await c.get(queue, -1)
        assert ei.value.reason == "INVALID_ID"
        assert (await c.get_queue(queue)).stats.total == 0
