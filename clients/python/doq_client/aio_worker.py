"""`AsyncWorker`: the asyncio twin of `doq_client.worker.Worker` (same contract; read its
module docstring). The handler is a coroutine function, run as one task per message; each
running message's lease is kept by a task beside it. After the grace period the handlers
still running are released and then cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from doq_client import _ops
from doq_client._handle import AsyncClient
from doq_client._worker_core import (
    RETRY_POLL_S,
    Held,
    LeasePlan,
    State,
    WorkerHooks,
    WorkerOptions,
    ack_outcomes,
    call_hook,
    note_touch,
    poll_retryable,
    retry_in_ms,
    take_acks,
)
from doq_client.errors import DoqClientError
from doq_client.types import AckResult, Message

log = logging.getLogger("doq_client.worker")

AsyncHandler = Callable[[Message], Awaitable[Any]]
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class AsyncWorker:
    """Runs `await handler(msg)` on `queue`'s messages, at most `concurrency` at once; make
    it with `AsyncDoqClient.worker(...)` and `await worker.run()`; `stop()` ends it
    gracefully (see `doq_client.worker`)."""

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        handler: AsyncHandler,
        options: WorkerOptions,
        *,
        hooks: WorkerHooks | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not inspect.iscoroutinefunction(handler) and not inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
        ):
            raise TypeError("an AsyncWorker's handler must be a coroutine function (async def)")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.options = options
        self.hooks = hooks or WorkerHooks()
        self._rng = rng
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._wake: asyncio.Event | None = None  # a slot freed or a stop
        self._tasks: dict[Held, asyncio.Task[None]] = {}
        self._acks: list[Held] = []  # handlers returned: to ack (see _send_acks)
        self._acks_done: dict[Held, asyncio.Future[None]] = {}
        self._acks_ready = asyncio.Event()
        self._plan: LeasePlan | None = None
        self._max_attempts = 0

    def stop(self) -> None:
        """Stop taking messages and shut down gracefully; returns at once. Safe from any thread."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread_id:
            loop.call_soon_threadsafe(self.stop)
            return
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    @property
    def running(self) -> int:
        """Handlers running now."""
        return sum(1 for h in self._tasks if h.state is State.RUNNING)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Work until `stop()`, then stop gracefully and return. With `handle_signals` and in
        the main thread, SIGTERM and SIGINT call `stop()` meanwhile. Raises a poll's error
        that retrying cannot cure (e.g. `QueueNotFound`), after the graceful stop."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._wake = asyncio.Event()
        q = await self.client._call(_ops.get_queue(self.queue))
        self._plan = self.options.plan(q.settings)
        self._max_attempts = q.settings.max_attempts
        installed = handle_signals and threading.current_thread() is threading.main_thread()
        if installed:
            for s in SIGNALS:
                self._loop.add_signal_handler(s, self.stop)
        sender = asyncio.ensure_future(self._send_acks())
        try:
            try:
                error = await self._poll()
            except asyncio.CancelledError:  # run() cancelled: hand back at once what it holds
                self._stopping = True
                await self._shut_down(0)
                raise
            await self._shut_down(self.options.grace_s)
        finally:
            sender.cancel()
            if installed:
                for s in SIGNALS:
                    self._loop.remove_signal_handler(s)
        if error is not None:
            raise error

    async def _poll(self) -> DoqClientError | None:
        assert self._plan is not None and self._wake is not None
        n = self.options.concurrency
        while True:
            while not self._stopping and len(self._tasks) >= n:
                self._wake.clear()
                await self._wake.wait()
            if self._stopping:
                return None
            sent_s = time.monotonic()
            try:
                msgs = await self.client._call(
                    _ops.dequeue(self.queue, False, n - len(self._tasks), self.options.poll_wait_ms,
                                 self._plan.lease_ms),
                    self.options.poll_wait_ms / 1000)
            except DoqClientError as e:
                if not poll_retryable(e):
                    self._stopping = True
                    return e
                log.warning("worker poll of %r failed (%s); trying again", self.queue, e)
                self._wake.clear()
                if not self._stopping:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), RETRY_POLL_S)
                continue
            for m in msgs:
                h = Held(m, sent_s, self._plan.next_extend_s(sent_s))
                if self._stopping:
                    h.state = State.RELEASED
                    await self._release(h)
                    continue
                self._tasks[h] = asyncio.ensure_future(self._work(h))

    async def _shut_down(self, grace_s: float) -> None:
        """After the poll loop: `grace_s` for the running handlers, then release the rest
        (and cancel their handlers); acks and nacks under way are awaited."""
        if self._tasks and grace_s > 0:
            await asyncio.wait(list(self._tasks.values()), timeout=grace_s)
        unfinished = [(h, t) for h, t in self._tasks.items() if h.claim(State.RELEASED)]
        for h, t in unfinished:
            await self._release(h)
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    async def _work(self, h: Held) -> None:
        assert self._plan is not None and self._wake is not None
        call_hook(self.hooks.on_start, h.msg)
        h.started_s = time.monotonic()
        keeper = asyncio.ensure_future(self._keep_lease(h, self._plan))
        error: Exception | None = None
        try:
            try:
                await self.handler(h.msg)
            except asyncio.CancelledError:
                if h.claim(State.RELEASED):  # cancelled by its caller, not by a stop: hand it back
                    await self._release(h)
                    raise
            except Exception as e:
                error = e
            finally:
                keeper.cancel()
            if h.claim(State.SETTLING):
                if error is None:  # the ack sender acks it; the slot is free once it is answered
                    done = asyncio.get_running_loop().create_future()
                    self._acks.append(h)
                    self._acks_done[h] = done
                    self._acks_ready.set()
                    await asyncio.shield(done)
                else:
                    await self._nack(h, error)
        finally:
            del self._tasks[h]
            self._wake.set()

    async def _nack(self, h: Held, error: Exception) -> None:
        m = h.msg
        delay = retry_in_ms(m, self._max_attempts, self.options.backoff, self._rng())
        log.info("handler failed on message %d of %r (attempt %d): %r", m.id, self.queue, m.attempts, error)
        try:
            await self.client._call(_ops.nack(self.queue, m.id, m.lease_id, delay or 0, None, False))
        except DoqClientError as e:
            log.warning("nack of message %d of %r failed: %s (it will be delivered again)", m.id, self.queue, e)
            return
        call_hook(self.hooks.on_failure, m, error, delay)

    async def _send_acks(self) -> None:
        """The ack sender task (see `doq_client.worker.Worker._send_acks`); cancelled once
        the worker has shut down (nothing is pending then)."""
        while True:
            while not self._acks:
                self._acks_ready.clear()
                await self._acks_ready.wait()
            batch, op = take_acks(self._acks, self.queue)
            try:
                results: list[AckResult] | Exception = await self.client._call(op)
            except Exception as e:  # e.g. the client was closed: never leave a slot taken
                results = e
            now = time.monotonic()
            for h, err in ack_outcomes(batch, results):
                if err is None:
                    call_hook(self.hooks.on_success, h.msg, now - h.started_s)
                else:
                    log.warning("ack of message %d of %r failed: %s (it will be delivered again)",
                                h.msg.id, self.queue, err)
                self._acks_done.pop(h).set_result(None)

    async def _release(self, h: Held) -> None:
        m = h.msg
        try:
            await self.client._call(_ops.nack(self.queue, m.id, m.lease_id, 0, None, True))
        except Exception as e:  # the lease is gone, the cluster unreachable or the client closed
            log.warning("releasing message %d of %r failed: %s (it comes back when its lease ends)",
                        m.id, self.queue, e)
            return
        call_hook(self.hooks.on_release, m)

    async def _keep_lease(self, h: Held, plan: LeasePlan) -> None:
        """Beside a running handler: extends its message's lease when due (cancelled when
        the handler ends)."""
        m = h.msg
        while h.state is State.RUNNING and not h.lost:
            await asyncio.sleep(max(0.0, h.next_extend_s - time.monotonic()))
            sent_s = time.monotonic()
            try:
                outcome: int | Exception = await self.client._call(
                    _ops.touch(self.queue, m.id, m.lease_id, plan.lease_ms))
            except Exception as e:  # e.g. the client was closed
                outcome = e
            if note_touch(h, plan, self.queue, sent_s, outcome, time.monotonic()):
                call_hook(self.hooks.on_extend, m, outcome)
