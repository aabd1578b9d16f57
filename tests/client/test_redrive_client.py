"""Redrive through the Python client (sync and async) and `doq queues redrive` (a child
process), against a real `doq serve`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from doq_client import AsyncDoqClient, DoqClient, QueueSettings, RedriveTask
from doq_client.errors import DoqClientError
from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def _dead_letters(c: DoqClient, prefix: str, n: int) -> None:
    """`prefix`-src (max 1 attempt, dead-letters into `prefix`-dlq) and `n` messages dead-lettered
    there the real way: delivered once, never acked, lease expired."""
    c.create_queue(f"{prefix}-dlq")
    c.create_queue(f"{prefix}-src", settings=QueueSettings(max_attempts=1, dead_letter_queue=f"{prefix}-dlq",
                                                           visibility_timeout_ms=100))
    for i in range(n):
        c.enqueue(f"{prefix}-src", f"m{i}", metadata={"i": str(i)})
    taken = 0
    while taken < n:
        taken += len(c.dequeue(f"{prefix}-src", max_messages=n))
    until("dead-lettered", lambda: c.get_queue(f"{prefix}-dlq").stats.ready == n)


def test_sync_client(client: DoqClient) -> None:
    _dead_letters(client, "s", 7)
    t = client.redrive("s-dlq")
    assert isinstance(t, RedriveTask) and (t.to, t.total) == ("s-src", 7)
    done = until("completed", lambda: (g := client.get_redrive("s-dlq")).state == "completed" and g)
    assert (done.moved, done.remaining, done.running) == (7, 0, False)
    # the queue's own 100 ms lease could end before a loaded node's commit of this dequeue
    # (then nothing is handed out: `doq_leases_ended_before_delivery_total`): ask for a long one
    msgs = client.dequeue("s-src", max_messages=10, visibility_timeout_ms=60_000)
    assert sorted(m.metadata["i"] for m in msgs) == [str(i) for i in range(7)]
    assert {m.attempts for m in msgs} == {1}  # reset to 0 by the move; 1 is this delivery
    assert client.cancel_redrive("s-dlq").state == "completed"
    with pytest.raises(DoqClientError) as e:
        client.redrive("s-dlq", to="s-dlq")
    assert e.value.reason == "REDRIVE_TO_ITSELF"
    with pytest.raises(DoqClientError) as e:
        client.redrive("s-dlq", max_per_second=-1)  # refused before anything is sent
    assert e.value.reason in ("INVALID_ARGUMENT", "INVALID_RATE")


async def test_async_client(node: NodeProc, client: DoqClient) -> None:
    _dead_letters(client, "a", 30)
    async with AsyncDoqClient(node.grpc_addr) as ac:
        t = await ac.redrive("a-dlq", max_per_second=1)
        assert t.running and t.max_per_second == 1
        with pytest.raises(DoqClientError) as e:
            await ac.redrive("a-dlq")
        assert e.value.reason == "REDRIVE_RUNNING"
        c = await ac.cancel_redrive("a-dlq")
        assert c.state == "cancelled" and c.moved < 30
        assert (await ac.get_redrive("a-dlq")).state == "cancelled"


def test_cli(node: NodeProc, client: DoqClient) -> None:
    _dead_letters(client, "c", 5)

    def doq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "doq", "queues", "redrive", *args, "--server", node.http_url],
                              capture_output=True, text=True, timeout=120)

    p = doq("c-dlq", "--rate", "1000", "--wait", "--interval", "0.1", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["state"], doc["moved"], doc["to"], doc["max_per_second"]) == ("completed", 5, "c-src", 1000)
    p = doq("c-dlq", "--status")
    assert p.returncode == 0 and "completed, moved 5, remaining 0 of 5" in p.stdout, p.stdout
    p = doq("c-dlq", "--to", "c-dlq")
    assert p.returncode == 1 and "REDRIVE_TO_ITSELF" in p.stderr
    p = doq("c-dlq", "--cancel", "--rate", "3")
    assert p.returncode == 2 and "--status or --cancel" in p.stderr
    p = doq("c-dlq", "--cancel")
    assert p.returncode == 0 and "completed" in p.stdout
