"""A worker process killed with SIGKILL or stopped with SIGTERM loses nothing.

Real `doq serve` process (module fixture `node`) and real worker processes (`python -c`,
sync `Worker.run()` or asyncio `AsyncWorker.run()` as their main loop, signals handled by
`run()` itself), real gRPC on 127.0.0.1. The worker process reports on stdout what its
hooks saw ("start ID ATTEMPTS", "acked ID", "released ID"). Every wait is for a condition,
bounded by a generous timeout; a handler either returns soon ("quick": 0.5 s) or never
("stuck"), so what the worker must do with it does not depend on the machine's speed.
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from doq_client import DoqClient, Message, QueueSettings, WorkerHooks, enqueue_request
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

WAIT_S = 60.0

WORKER_PROC = r"""
import asyncio, sys, threading, time
from doq_client import AsyncDoqClient, DoqClient, WorkerHooks

addr, queue, mode, concurrency, grace_s, kind = sys.argv[1:7]
concurrency, grace_s = int(concurrency), float(grace_s)
HOLD_S = {"quick": 0.5, "stuck": 3600.0}[kind]

LOCK = threading.Lock()

def say(*a):  # one write per line: hooks run in several threads
    with LOCK:
        sys.stdout.write(" ".join(map(str, a)) + "\n")
        sys.stdout.flush()

class Hooks(WorkerHooks):
    def on_start(self, m): say("start", m.id, m.attempts)
    def on_success(self, m, d): say("acked", m.id)
    def on_release(self, m): say("released", m.id)

opts = dict(concurrency=concurrency, grace_s=grace_s, hooks=Hooks())
if mode == "sync":
    def handle(m):
        time.sleep(HOLD_S)
    with DoqClient(addr) as c:
        c.worker(queue, handle, **opts).run()
else:
    async def handle(m):
        await asyncio.sleep(HOLD_S)
    async def main():
        async with AsyncDoqClient(addr) as c:
            await c.worker(queue, handle, **opts).run()
    asyncio.run(main())
say("exit")
"""


class WorkerProc:
    """A worker child process and the lines it printed (read by a thread)."""

    def __init__(self, node: NodeProc, queue: str, mode: str, concurrency: int, grace_s: float, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_PROC, node.grpc_addr, queue, mode, str(concurrency), str(grace_s), kind],
            stdout=subprocess.PIPE, text=True)
        self.lines: queue_mod.SimpleQueue[str | None] = queue_mod.SimpleQueue()
        self.seen: list[list[str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, cond: Callable[[list[list[str]]], bool], what: str) -> None:
        """Read lines until `cond(all lines so far, split)` holds."""
        deadline = time.monotonic() + WAIT_S
        while not cond(self.seen):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; saw {self.seen}"
            try:
                line = self.lines.get(timeout=left)
            except queue_mod.Empty:
                continue
            assert line is not None, f"the worker ended before {what}; saw {self.seen}"
            self.seen.append(line.split())

    def ids(self, word: str) -> list[int]:
        return [int(w[1]) for w in self.seen if w[0] == word]

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)  # only our child, by pid

    def finish(self) -> int:
        """Wait for the exit and read every line it printed; its exit code."""
        rc = self.proc.wait(WAIT_S)
        while (line := self.lines.get(timeout=WAIT_S)) is not None:
            self.seen.append(line.split())
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT_S)


@contextmanager
def worker_proc(node: NodeProc, queue: str, mode: str, concurrency: int, grace_s: float,
                kind: str) -> Iterator[WorkerProc]:
    w = WorkerProc(node, queue, mode, concurrency, grace_s, kind)
    try:
        yield w
    finally:
        w.kill()


def _started(n: int) -> Callable[[list[list[str]]], bool]:
    return lambda seen: sum(1 for w in seen if w[0] == "start") >= n


def _poll(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Drain(WorkerHooks):
    def __init__(self) -> None:
        self.acked: list[tuple[int, int]] = []

    def on_success(self, msg: Message, duration_s: float) -> None:
        self.acked.append((msg.id, msg.attempts))


def _drain(client: DoqClient, queue: str, n: int) -> list[tuple[int, int]]:
    """Handle the queue's `n` remaining messages with an in-process worker; (id, attempts) acked."""
    rec = Drain()
    w = client.worker(queue, lambda m: None, concurrency=4, hooks=rec).start()
    try:
        _poll(lambda: len(rec.acked) >= n, f"{n} acks")
    finally:
        w.stop()
        assert w.join(WAIT_S)
    return rec.acked


def _enqueue(client: DoqClient, queue: str, n: int) -> list[int]:
    return [r.id for r in client.enqueue_batch([enqueue_request(queue, f"m{i}") for i in range(n)])]  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_killed_mid_message_has_it_redelivered_after_the_lease(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    """SIGKILL while the handler runs: the message is not lost; once its lease ends it is
    delivered to another worker (attempt 2) and acked there."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=6_000))  # extended every 2 s while it runs
    [mid] = _enqueue(client, queue_name, 1)
    with worker_proc(node, queue_name, mode, 1, 30, "stuck") as w:
        w.wait_for(_started(1), "the handler to start")
        assert w.ids("start") == [mid]
        w.kill()
    assert _drain(client, queue_name, 1) == [(mid, 2)]
    stats = client.get_queue(queue_name).stats
    assert (stats.total, stats.dead) == (0, 0)


N = 8
CONCURRENCY = 3


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_finishes_running_handlers_and_hands_back_the_rest(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    """SIGTERM while three handlers run (grace 60 s): they finish and are acked, nothing
    new starts, the process exits 0; what it did not start is ready in the queue as never
    delivered (a message a last poll brought in after the signal is released, not kept).
    Another worker then handles the rest: every message acked exactly once overall."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=300_000))
    ids = _enqueue(client, queue_name, N)
    with worker_proc(node, queue_name, mode, CONCURRENCY, 60, "quick") as w:
        w.wait_for(_started(CONCURRENCY), "three handlers to start")
        w.signal(signal.SIGTERM)
        assert w.finish() == 0
        started, acked = w.ids("start"), w.ids("acked")
    assert ["exit"] in w.seen
    assert sorted(acked) == sorted(started)  # every handler it started finished and was acked
    rest = [i for i in ids if i not in acked]
    stats = client.get_queue(queue_name).stats
    assert (stats.in_flight, stats.ready, stats.total) == (0, len(rest), len(rest)), stats
    assert {(client.get(queue_name, i).state, client.get(queue_name, i).attempts) for i in rest} <= {("ready", 0)}
    later = _drain(client, queue_name, len(rest))
    assert sorted(acked + [i for i, _ in later]) == sorted(ids)  # each once
    assert client.get_queue(queue_name).stats.total == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_releases_what_did_not_finish_in_the_grace_period(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    """SIGTERM while two handlers never return (grace 0.5 s): their messages are released —
    ready at once although their leases had 5 minutes left, the attempt not counted — and
    the process exits 0. Another worker then gets each once more, as a first attempt."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=300_000))
    ids = _enqueue(client, queue_name, 2)
    with worker_proc(node, queue_name, mode, 2, 0.5, "stuck") as w:
        w.wait_for(_started(2), "two handlers to start")
        w.signal(signal.SIGTERM)
        assert w.finish() == 0
    assert sorted(w.ids("released")) == sorted(ids) and w.ids("acked") == []
    assert [(client.get(queue_name, i).state, client.get(queue_name, i).attempts) for i in ids] == [("ready", 0)] * 2
    assert sorted(_drain(client, queue_name, 2)) == sorted((i, 1) for i in ids)
