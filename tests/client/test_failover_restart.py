"""Streams survive their node: a real `doq serve` is killed (SIGKILL) under a producer or
a consumer and restarted on the same address; the client reconnects and goes on.

Producer: every future resolves exactly once, and the queue holds every message exactly
once (what was stored before the kill and resent is found by its dedup id). Consumer: it
goes on on a new stream, and the messages the application held across the restart are
acked by lease id (unary calls) and never delivered again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from doq_client import AsyncDoqClient, DoqClient, FailoverPolicy, MessageNotFound
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

FAILOVER = FailoverPolicy(timeout_s=90)  # a restart on a busy machine takes seconds


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProc]:
    n = NodeProc(tmp_path / "data").start()
    try:
        yield n
    finally:
        n.kill9()


def _restart_in_background(node: NodeProc) -> threading.Thread:
    """kill -9 the node, then start it again (same data, same ports) in a thread."""
    node.kill9()
    t = threading.Thread(target=node.start, name="test-restart", daemon=True)
    t.start()
    return t


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _drain(c: DoqClient, queue: str) -> list[bytes]:
    out: list[bytes] = []
    while got := c.dequeue(queue, ack=True, max_messages=1000):
        out.extend(m.content for m in got)
    return out


def test_a_producer_resumes_after_its_node_is_killed_and_restarted(node: NodeProc) -> None:
    n = 3000
    resolved = [0] * n
    lock = threading.Lock()

    def count(i: int) -> Callable[[object], None]:
        def done(_: object) -> None:
            with lock:
                resolved[i] += 1

        return done

    with DoqClient(node.grpc_addr, timeout_s=10, failover=FAILOVER) as c:
        c.create_queue("q")
        with c.producer(window=256) as p:
            futs = []
            restart: threading.Thread | None = None
            for i in range(n):
                f = p.enqueue("q", f"m{i}")
                f.add_done_callback(count(i))
                futs.append(f)
                if i == n // 3:
                    _until(lambda: sum(f.done() for f in futs) >= 100, "first results")
                    restart = _restart_in_background(node)  # with messages in flight
            assert p.flush(120)
        assert restart is not None
        restart.join(60)
        results = [f.result() for f in futs]
        assert resolved == [1] * n  # every future resolved exactly once
        assert len({r.id for r in results}) == n
        contents = _drain(c, "q")
    assert len(contents) == n and set(contents) == {f"m{i}".encode() for i in range(n)}


async def test_an_async_batch_producer_resumes_after_a_restart(node: NodeProc) -> None:
    n = 2000
    async with AsyncDoqClient(node.grpc_addr, timeout_s=10, failover=FAILOVER) as c:
        await c.create_queue("q")
        async with c.producer(window=256, batch=16) as p:
            futs = []
            restart: threading.Thread | None = None
            for i in range(n):
                futs.append(await p.enqueue("q", f"m{i}"))
                if i == n // 3:
                    while sum(f.done() for f in futs) < 100:
                        await asyncio.sleep(0.01)
                    restart = _restart_in_background(node)
            await asyncio.wait_for(p.flush(), 120)
        assert restart is not None
        await asyncio.to_thread(restart.join, 60)
        ids = [(await f).id for f in futs]
        assert len(set(ids)) == n
    with DoqClient(node.grpc_addr, timeout_s=10) as sc:
        contents = await asyncio.to_thread(_drain, sc, "q")
    assert len(contents) == n and set(contents) == {f"m{i}".encode() for i in range(n)}


def test_a_consumer_goes_on_after_its_node_restarts(node: NodeProc) -> None:
    with DoqClient(node.grpc_addr, timeout_s=10, failover=FAILOVER) as c:
        c.create_queue("q")
        for i in range(5):
            c.enqueue("q", f"old{i}")
        with c.consumer("q", prefetch=5, visibility_timeout_ms=120_000) as cons:
            held = [cons.next() for _ in range(5)]  # leased, not acked: no credit left
            assert all(m is not None for m in held)
            node.kill9()
            node.start()
            for i in range(20):
                c.enqueue("q", f"new{i}")
            got = []
            for m in cons:  # the old stream fails: the consumer reopens it
                got.append(m)
                cons.ack(m)
                if len(got) == 1:
                    cons.ack(*[h for h in held if h is not None])  # by lease id, unary
                if len(got) == 20:
                    break
        assert sorted(m.content for m in got) == sorted(f"new{i}".encode() for i in range(20))
        _until(lambda: c.get_queue("q").stats.total == 0, "every message acked")
        for h in held:
            assert h is not None
            with pytest.raises(MessageNotFound):
                c.get("q", h.id)
