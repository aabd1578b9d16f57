"""Closing a consumer hands back, at once, every message it did not give the application.

Real `doq serve` process (module fixture `node`), real gRPC on 127.0.0.1. 20 messages are
prefetched, the application takes one, the consumer is closed: the other 19 must be ready
again immediately (no lease expiry), with their attempts unchanged (a release is not a
delivery), and with `ack=True` the one handed out must be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from doq_client import AsyncDoqClient, DoqClient, Message, MessageNotFound, enqueue_request
from tests.support.proc import NodeProc

N = 20
LONG_LEASE_MS = 300_000  # far beyond the test: anything back in the queue was handed back


def _poll(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _enqueue(client: DoqClient, queue: str) -> list[int]:
    res = client.enqueue_batch([enqueue_request(queue, f"{i}") for i in range(N)])
    return [r.id for r in res]  # type: ignore[union-attr]


def _assert_handed_back(client: DoqClient, queue: str, ids: list[int], taken: Message) -> None:
    """Right after close: the taken message is gone, the others are ready, attempts 0."""
    stats = client.get_queue(queue).stats
    assert (stats.ready, stats.in_flight, stats.total) == (N - 1, 0, N - 1), stats
    with pytest.raises(MessageNotFound):
        client.get(queue, taken.id)
    rest = [client.get(queue, i) for i in ids if i != taken.id]
    assert [(m.state, m.attempts) for m in rest] == [("ready", 0)] * (N - 1)
    got = client.dequeue(queue, max_messages=100)  # no wait: they are deliverable now
    assert sorted(m.id for m in got) == sorted(i for i in ids if i != taken.id)
    assert {m.attempts for m in got} == {1}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("ack", [True, False])
def test_close_hands_back_prefetched(client: DoqClient, queue: str, ack: bool, batched: bool) -> None:
    ids = _enqueue(client, queue)
    with client.consumer(
        queue, prefetch=N, ack=ack, batched=batched, visibility_timeout_ms=LONG_LEASE_MS, close_grace_s=20
    ) as c:
        taken = c.next()
        assert taken is not None and taken.id == ids[0]
        _poll(lambda: client.get_queue(queue).stats.ready == 0, "all 20 to be prefetched")
        if not ack:
            c.ack(taken)
    _assert_handed_back(client, queue, ids, taken)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("ack", [True, False])
async def test_async_close_hands_back_prefetched(
    client: DoqClient, node: NodeProc, queue: str, ack: bool, batched: bool
) -> None:
    ids = _enqueue(client, queue)
    async with AsyncDoqClient(node.grpc_addr) as ac:
        async with ac.consumer(
            queue, prefetch=N, ack=ack, batched=batched, visibility_timeout_ms=LONG_LEASE_MS, close_grace_s=20
        ) as c:
            taken = await c.next()
            assert taken is not None and taken.id == ids[0]
            _poll(lambda: client.get_queue(queue).stats.ready == 0, "all 20 to be prefetched")
            if not ack:
                c.ack(taken)
    _assert_handed_back(client, queue, ids, taken)


CRASHING_CONSUMER = """
import sys, time
from doq_client import DoqClient
with DoqClient(sys.argv[1]) as c:
    cons = c.consumer(sys.argv[2], prefetch=int(sys.argv[3]), ack=True, visibility_timeout_ms=6000)
    m = cons.next()
    print(m.id, flush=True)
    time.sleep(600)
"""


def test_ack_true_consumer_killed_loses_nothing_it_did_not_hand_out(
    client: DoqClient, node: NodeProc, queue: str
) -> None:
    """kill -9 of an ack=True consumer: what it had prefetched but not handed out comes back
    when the leases end (the one it handed out is acked, or redelivered: never lost)."""
    ids = _enqueue(client, queue)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_CONSUMER, node.grpc_addr, queue, str(N)], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        taken = int(proc.stdout.readline())
        _poll(lambda: client.get_queue(queue).stats.ready == 0, "all 20 to be prefetched")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    _poll(lambda: client.get_queue(queue).stats.ready >= N - 1, "the leases to end")
    back = client.dequeue(queue, max_messages=100)
    assert {m.id for m in back} >= set(ids) - {taken}
    assert {m.attempts for m in back if m.id != taken} == {2}  # the expired lease counted
