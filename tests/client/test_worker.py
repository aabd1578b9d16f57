"""The client's worker (sync `Worker` and asyncio `AsyncWorker`) against a real node.

Real `doq serve` process (module fixture `node`), real gRPC on 127.0.0.1; the workers run
in this process (a thread, or this test's event loop). Nothing waits on a timing margin:
every wait is for a condition, bounded by a generous timeout; the lease test's handler
runs for three leases, which only the worker's touches can survive.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from doq_client import (
    AsyncDoqClient,
    Backoff,
    DoqClient,
    Message,
    QueueNotFound,
    QueueSettings,
    Worker,
    WorkerHooks,
    enqueue_request,
)
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

WAIT_S = 60.0  # generous bound of every wait for a condition


def _poll(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


async def _apoll(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class Recorder(WorkerHooks):
    """Records what the hooks saw (from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: list[tuple[int, int]] = []  # (id, attempts)
        self.failed: list[tuple[int, int, int | None]] = []  # (id, attempts, retry_in_ms)
        self.extended: list[int] = []
        self.released: list[int] = []

    def on_success(self, msg: Message, duration_s: float) -> None:
        with self.lock:
            self.acked.append((msg.id, msg.attempts))

    def on_failure(self, msg: Message, error: BaseException, retry_in_ms: int | None) -> None:
        with self.lock:
            self.failed.append((msg.id, msg.attempts, retry_in_ms))

    def on_extend(self, msg: Message, expires_at_ms: int) -> None:
        with self.lock:
            self.extended.append(msg.id)

    def on_release(self, msg: Message) -> None:
        with self.lock:
            self.released.append(msg.id)


def _run_sync(worker: Worker, until: Callable[[], bool], what: str) -> None:
    worker.start()
    try:
        _poll(until, what)
    finally:
        worker.stop()
        assert worker.join(WAIT_S)


async def _run_async(worker: Any, until: Callable[[], bool], what: str) -> None:
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await _apoll(lambda: until() or task.done(), what)
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT_S)


# -- the lease is kept while the handler runs -----------------------------------------------
LEASE_MS = 3_000  # a touch is due every 1 s; each has 2 s to be committed


async def test_a_handler_running_three_leases_long_is_delivered_once(
    client: DoqClient, node: NodeProc, queue_name: str
) -> None:
    """A handler that runs 3x the queue's visibility timeout: the worker's touches keep the
    lease, so the message is delivered once (attempt 1, no second delivery, although the
    worker has a free slot to take one) and its ack, with that delivery's lease id, succeeds.
    The sync worker (a thread) and the asyncio one (this loop) run side by side."""
    queues = {mode: f"{queue_name}-{mode}" for mode in ("sync", "async")}
    ids = {}
    for mode, q in queues.items():
        client.create_queue(q, settings=QueueSettings(visibility_timeout_ms=LEASE_MS))
        ids[mode] = client.enqueue(q, "long").id
    rec = {mode: Recorder() for mode in queues}
    calls: dict[str, list[tuple[int, int]]] = {mode: [] for mode in queues}
    hold_s = 3 * LEASE_MS / 1000

    def done(mode: str) -> bool:  # acked, or delivered a second time (a lost lease)
        return bool(rec[mode].acked) or len(calls[mode]) > 1

    def handle(m: Message) -> None:
        calls["sync"].append((m.id, m.attempts))
        time.sleep(hold_s)

    async def ahandle(m: Message) -> None:
        calls["async"].append((m.id, m.attempts))
        await asyncio.sleep(hold_s)

    sync_worker = client.worker(queues["sync"], handle, concurrency=2, hooks=rec["sync"]).start()
    try:
        async with AsyncDoqClient(node.grpc_addr) as ac:
            await _run_async(ac.worker(queues["async"], ahandle, concurrency=2, hooks=rec["async"]),
                             lambda: done("async"), "the async worker's ack")
        await _apoll(lambda: done("sync"), "the sync worker's ack")
    finally:
        sync_worker.stop()
        assert sync_worker.join(WAIT_S)
    for mode, q in queues.items():
        assert calls[mode] == [(ids[mode], 1)], mode
        assert rec[mode].acked == [(ids[mode], 1)], mode
        assert len(rec[mode].extended) >= 2, mode  # a lease of 3 s lasted 9 s
        stats = client.get_queue(q).stats
        assert (stats.total, stats.dead) == (0, 0), mode


# -- a failing handler: backoff, then the dead-letter queue ---------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failing_handler_is_nacked_with_backoff_then_dead_lettered(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    dlq = queue_name + "-dlq"
    client.create_queue(dlq)
    client.create_queue(queue_name, settings=QueueSettings(max_attempts=3, dead_letter_queue=dlq))
    mid = client.enqueue(queue_name, "poison").id
    rec = Recorder()
    backoff = Backoff(base_ms=20, factor=3, cap_ms=50, jitter=0)

    def dead() -> bool:
        return len(rec.failed) == 3

    if mode == "sync":
        def handle(m: Message) -> None:
            raise RuntimeError("boom")

        _run_sync(client.worker(queue_name, handle, backoff=backoff, hooks=rec), dead, "three failures")
    else:
        async with AsyncDoqClient(node.grpc_addr) as ac:
            async def ahandle(m: Message) -> None:
                raise RuntimeError("boom")

            await _run_async(ac.worker(queue_name, ahandle, backoff=backoff, hooks=rec), dead, "three failures")
    # 20 ms after the first attempt, 60 capped to 50 after the second, the third is the last
    assert rec.failed == [(mid, 1, 20), (mid, 2, 50), (mid, 3, None)]
    assert rec.acked == []
    src = client.get_queue(queue_name).stats
    assert (src.total, src.dead) == (0, 1)
    [moved] = client.dequeue(dlq)
    assert moved.text == "poison"


async def test_the_nack_carries_the_backoff_delay(client: DoqClient, node: NodeProc, queue_name: str) -> None:
    """After a failure the message waits out its backoff on the server (delayed, due
    `base_ms` after the nack), not in the worker."""
    client.create_queue(queue_name)
    mid = client.enqueue(queue_name, "later").id
    rec = Recorder()
    backoff = Backoff(base_ms=600_000, cap_ms=600_000, jitter=0)
    async with AsyncDoqClient(node.grpc_addr) as ac:
        async def ahandle(m: Message) -> None:
            raise ValueError("not yet")

        await _run_async(ac.worker(queue_name, ahandle, backoff=backoff, hooks=rec), lambda: bool(rec.failed),
                         "the failure")
    assert rec.failed == [(mid, 1, 600_000)]
    m = client.get(queue_name, mid)
    assert (m.state, m.attempts) == ("delayed", 1)
    assert m.deliver_at_ms >= m.enqueued_at_ms + 600_000


# -- concurrency ----------------------------------------------------------------------------
N_MSGS = 12
CONCURRENCY = 3


def _held_at_most(client: DoqClient, queue: str) -> None:
    """While CONCURRENCY handlers are blocked, the worker leases nothing more."""
    stats = client.get_queue(queue).stats
    assert (stats.in_flight, stats.ready) == (CONCURRENCY, N_MSGS - CONCURRENCY), stats


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_concurrency_n_runs_n_handlers_at_once_and_leases_no_more(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    """The first CONCURRENCY handlers block until all of them run (a worker running fewer at
    once would never get there); meanwhile the worker holds no more than CONCURRENCY
    messages. Then all are handled, never more than CONCURRENCY at once."""
    client.create_queue(queue_name)
    ids = [r.id for r in client.enqueue_batch([enqueue_request(queue_name, str(i)) for i in range(N_MSGS)])]  # type: ignore[union-attr]
    rec = Recorder()
    active = 0
    most = 0
    started = 0
    lock = threading.Lock()

    def enter() -> int:
        nonlocal active, most, started
        with lock:
            active += 1
            started += 1
            most = max(most, active)
            return started

    def leave() -> None:
        nonlocal active
        with lock:
            active -= 1

    def all_acked() -> bool:
        return len(rec.acked) == N_MSGS

    if mode == "sync":
        go = threading.Event()

        def handle(m: Message) -> None:
            n = enter()
            try:
                if n <= CONCURRENCY:
                    assert go.wait(WAIT_S)
            finally:
                leave()

        w = client.worker(queue_name, handle, concurrency=CONCURRENCY, hooks=rec).start()
        try:
            _poll(lambda: started >= CONCURRENCY, "three handlers at once")
            _held_at_most(client, queue_name)
            go.set()
            _poll(all_acked, "every ack")
        finally:
            w.stop()
            assert w.join(WAIT_S)
    else:
        ago = asyncio.Event()
        async with AsyncDoqClient(node.grpc_addr) as ac:
            async def ahandle(m: Message) -> None:
                n = enter()
                try:
                    if n <= CONCURRENCY:
                        await asyncio.wait_for(ago.wait(), WAIT_S)
                    await asyncio.sleep(0.01)
                finally:
                    leave()

            aw = ac.worker(queue_name, ahandle, concurrency=CONCURRENCY, hooks=rec)
            task = asyncio.ensure_future(aw.run(handle_signals=False))
            try:
                await _apoll(lambda: started >= CONCURRENCY, "three handlers at once")
                assert aw.running == CONCURRENCY
                _held_at_most(client, queue_name)
                ago.set()
                await _apoll(all_acked, "every ack")
            finally:
                aw.stop()
                await asyncio.wait_for(task, WAIT_S)
    assert most == CONCURRENCY
    assert sorted(i for i, _ in rec.acked) == sorted(ids)
    assert client.get_queue(queue_name).stats.total == 0


# -- stop() ----------------------------------------------------------------------------------
def test_stop_releases_a_handler_that_outlives_the_grace_period(client: DoqClient, queue_name: str) -> None:
    """stop() with a handler still running after `grace_s`: its message is released (ready
    at once, attempt not counted: the lease is 5 minutes) and the handler's later return
    settles nothing."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=300_000))
    mid = client.enqueue(queue_name, "stuck").id
    rec = Recorder()
    entered = threading.Event()
    leave = threading.Event()

    def handle(m: Message) -> None:
        entered.set()
        leave.wait(WAIT_S)

    w = client.worker(queue_name, handle, grace_s=0.2, hooks=rec).start()
    try:
        assert entered.wait(WAIT_S)
        w.stop()
        assert w.join(WAIT_S)
        m = client.get(queue_name, mid)
        assert (m.state, m.attempts) == ("ready", 0)
        assert rec.released == [mid]
    finally:
        leave.set()
    _poll(lambda: w.running == 0, "the late handler to return")
    assert rec.acked == [] and rec.failed == []
    assert client.get(queue_name, mid).state == "ready"


def test_decorator_form_makes_a_worker(client: DoqClient, queue_name: str) -> None:
    client.create_queue(queue_name)
    mid = client.enqueue(queue_name, "hi").id
    seen: list[str] = []
    rec = Recorder()

    @client.worker(queue_name, concurrency=2, hooks=rec)
    def handle(m: Message) -> None:
        seen.append(m.text)

    assert isinstance(handle, Worker)
    _run_sync(handle, lambda: bool(rec.acked), "the ack")
    assert seen == ["hi"] and rec.acked == [(mid, 1)]


def test_a_worker_on_a_missing_queue_raises_queue_not_found(client: DoqClient, queue_name: str) -> None:
    with pytest.raises(QueueNotFound):
        client.worker(queue_name, lambda m: None).run(handle_signals=False)


def test_a_queue_deleted_under_a_running_worker_ends_it_with_the_error(client: DoqClient, queue_name: str) -> None:
    client.create_queue(queue_name)
    w = client.worker(queue_name, lambda m: None, poll_wait_ms=50).start()
    client.delete_queue(queue_name)
    with pytest.raises(QueueNotFound):
        w.join(WAIT_S)


async def test_cancelling_an_async_worker_hands_back_what_it_holds_at_once(
    client: DoqClient, node: NodeProc, queue_name: str
) -> None:
    """Cancelling `run()` is a stop without grace: the running handler's message is released
    (ready, attempt not counted, although its lease had 5 minutes left), its handler cancelled."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=300_000))
    mid = client.enqueue(queue_name, "stuck").id
    rec = Recorder()
    entered = asyncio.Event()
    cancelled: list[int] = []
    async with AsyncDoqClient(node.grpc_addr) as ac:
        async def ahandle(m: Message) -> None:
            entered.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(m.id)
                raise

        task = asyncio.ensure_future(ac.worker(queue_name, ahandle, hooks=rec).run(handle_signals=False))
        await asyncio.wait_for(entered.wait(), WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)
    assert rec.released == [mid] and cancelled == [mid]
    m = client.get(queue_name, mid)
    assert (m.state, m.attempts) == ("ready", 0)


def _long_polls_waiting(node: NodeProc) -> int:
    """The node's `doq_long_polls_waiting` gauge (the module's tests run one at a time)."""
    with node.urlopen(node.http_url + "/metrics") as r:
        text = r.read().decode()
    [line] = [x for x in text.splitlines() if x.startswith("doq_long_polls_waiting ")]
    return int(float(line.split()[1]))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_message_a_last_poll_brings_in_after_stop_is_released_not_run(
    client: DoqClient, node: NodeProc, queue_name: str, mode: str
) -> None:
    """stop() while the worker is parked in a long poll: the message that poll then brings
    in is released at once (ready, attempt not counted; the lease is 5 minutes), never run."""
    client.create_queue(queue_name, settings=QueueSettings(visibility_timeout_ms=300_000))
    _poll(lambda: _long_polls_waiting(node) == 0, "an earlier test's long polls to end")
    rec = Recorder()
    ran: list[int] = []
    if mode == "sync":
        w = client.worker(queue_name, lambda m: ran.append(m.id), poll_wait_ms=60_000, hooks=rec).start()
        try:
            _poll(lambda: _long_polls_waiting(node) == 1, "the worker's long poll")
            w.stop()
            mid = client.enqueue(queue_name, "late").id
        finally:
            w.stop()
            assert w.join(WAIT_S)
    else:
        async with AsyncDoqClient(node.grpc_addr) as ac:
            async def ahandle(m: Message) -> None:
                ran.append(m.id)

            aw = ac.worker(queue_name, ahandle, poll_wait_ms=60_000, hooks=rec)
            task = asyncio.ensure_future(aw.run(handle_signals=False))
            try:
                await _apoll(lambda: _long_polls_waiting(node) == 1, "the worker's long poll")
                aw.stop()
                mid = (await ac.enqueue(queue_name, "late")).id
            finally:
                aw.stop()
                await asyncio.wait_for(task, WAIT_S)
    assert rec.released == [mid] and ran == []
    m = client.get(queue_name, mid)
    assert (m.state, m.attempts) == ("ready", 0)
