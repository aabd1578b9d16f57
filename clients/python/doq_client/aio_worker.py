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
    call_hook,
    lease_lost,
    poll_retryable,
    retry_in_ms,
)
from doq_client.errors import DoqClientError
from doq_client.types import Message

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
        try:
            try:
                error = await self._poll()
            except asyncio.CancelledError:  # run() cancelled: hand back at once what it holds
                self._stopping = True
                await self._shut_down(0)
                raise
            await self._shut_down(self.options.grace_s)
        finally:
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
                await self._settle(h, error)
        finally:
            del self._tasks[h]
            self._wake.set()

    async def _settle(self, h: Held, error: Exception | None) -> None:
        m = h.msg
        try:
            if error is None:
                await self.client._call(_ops.ack(self.queue, m.id, m.lease_id))
                call_hook(self.hooks.on_success, m, time.monotonic() - h.started_s)
                return
            delay = retry_in_ms(m, self._max_attempts, self.options.backoff, self._rng())
            log.info("handler failed on message %d of %r (attempt %d): %r", m.id, self.queue, m.attempts, error)
            await self.client._call(_ops.nack(self.queue, m.id, m.lease_id, delay or 0, None, False))
            call_hook(self.hooks.on_failure, m, error, delay)
        except DoqClientError as e:
            log.warning("settling message %d of %r failed: %s (it will be delivered again)", m.id, self.queue, e)

    async def _release(self, h: Held) -> None:
        m = h.msg
        try:
            await self.client._call(_ops.nack(self.queue, m.id, m.lease_id, 0, None, True))
        except DoqClientError as e:
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
                expires_ms = await self.client._call(_ops.touch(self.queue, m.id, m.lease_id, plan.lease_ms))
            except DoqClientError as e:
                if lease_lost(e):
                    h.lost = True
                    log.warning("the lease of message %d of %r was lost (%s): it will be delivered again",
                                m.id, self.queue, e)
                else:
                    h.next_extend_s = plan.retry_s(time.monotonic())
                continue
            h.leased_at_s = sent_s
            h.next_extend_s = plan.next_extend_s(sent_s)
            call_hook(self.hooks.on_extend, m, expires_ms)

