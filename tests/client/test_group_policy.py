"""Group weights and rates through the Python client (sync and async) against a real
`doq serve` process: the calls, their errors, and the 5:1 ratio measured over 10,000
deliveries (decided by the replicated state machine, so exact whatever the timing)."""

from __future__ import annotations

from collections import Counter

import pytest

from doq_client import (
    AsyncDoqClient,
    DoqClient,
    FailedPrecondition,
    GroupInfo,
    InvalidArgument,
    QueueNotFound,
    QueueSettings,
    enqueue_request,
)
from tests.support.proc import NodeProc


def test_set_list_reset_and_errors(client: DoqClient, queue_name: str) -> None:
    client.create_queue(queue_name, "fair", QueueSettings(default_group_weight=2, default_group_max_per_second=7))
    assert client.get_queue(queue_name).settings.default_group_max_per_second == 7
    g = client.set_group_policy(queue_name, "paying", 5, max_per_second=0)
    assert g == GroupInfo("paying", 0, 0, 5, 0, False, True)
    client.enqueue(queue_name, "x", group="free")
    assert client.list_groups(queue_name) == [GroupInfo("free", 1, 0, 2, 7, False, False), g]
    assert client.reset_group(queue_name, "paying") == GroupInfo("paying", 0, 0, 2, 7, False, False)
    for call, err in [
        (lambda: client.set_group_policy(queue_name, "g", 0), InvalidArgument),
        (lambda: client.set_group_policy(queue_name, "g", 10_001), InvalidArgument),
        (lambda: client.set_group_policy(queue_name, "g", -1), InvalidArgument),
        (lambda: client.set_group_policy(queue_name, "g", max_per_second=-1), InvalidArgument),
        (lambda: client.set_group_policy("nope-" + queue_name, "g", 2), QueueNotFound),
    ]:
        with pytest.raises(err):
            call()
    client.create_queue(queue_name + "-d")
    with pytest.raises(FailedPrecondition) as e:
        client.set_group_policy(queue_name + "-d", "g", 2)
    assert e.value.reason == "NOT_FAIR_QUEUE"
    assert [x.group for x in client.list_groups(queue_name)] == ["free"]


def test_weights_5_to_1_over_10000_deliveries_through_a_real_server(client: DoqClient, queue_name: str) -> None:
    client.create_queue(queue_name, "fair")
    client.set_group_policy(queue_name, "paying", 5)
    for g in ("paying", "free"):
        for _ in range(12):
            client.enqueue_batch([enqueue_request(queue_name, b"m", group=g) for _ in range(1000)])
    n: Counter[str] = Counter()
    sizes = [1, 7, 100, 33, 250]
    i = 0
    while sum(n.values()) < 10_000:
        want = min(sizes[i % len(sizes)], 10_000 - sum(n.values()))
        i += 1
        got = client.dequeue(queue_name, max_messages=want, ack=True)
        assert got
        n.update(m.group for m in got)
    assert sum(n.values()) == 10_000
    assert abs(n["paying"] / n["free"] - 5) <= 5 * 0.02, n


async def test_async_client_methods(node: NodeProc, queue_name: str) -> None:
    async with AsyncDoqClient(node.grpc_addr) as c:
        await c.create_queue(queue_name, "fair")
        g = await c.set_group_policy(queue_name, "t", max_per_second=100)
        assert (g.weight, g.max_per_second, g.overridden) == (1, 100, True)
        assert [x.group for x in await c.list_groups(queue_name)] == ["t"]
        assert (await c.reset_group(queue_name, "t")).overridden is False
        with pytest.raises(InvalidArgument):
            await c.set_group_policy(queue_name, "t", weight=0)


def test_a_long_poll_gets_a_throttled_groups_message_when_its_bucket_refills(client: DoqClient,
                                                                              queue_name: str) -> None:
    """Nothing else happens on the node: the wake time is a due time of the replicated
    state, so the node proposes a tick then and the waiting dequeue is served."""
    client.create_queue(queue_name, "fair", QueueSettings(default_group_max_per_second=1))
    client.enqueue_batch([enqueue_request(queue_name, b"m", group="a") for _ in range(2)])
    assert len(client.dequeue(queue_name, max_messages=10, ack=True)) == 1  # a one-message bucket
    assert client.list_groups(queue_name)[0].throttled
    got = client.dequeue(queue_name, max_messages=10, ack=True, wait_ms=60_000)
    assert [m.group for m in got] == ["a"]
