# Generated from doq_client/aio_worker.py by clients/python/unasync.py: do not edit.
# Edit aio_worker.py, then run `python clients/python/unasync.py`.
# The imports keep the source's order:
# ruff: noqa: I001
"""`Worker`: runs a handler on a queue's messages with a concurrency (threads).

Generated from the asyncio worker, `doq_client/aio_worker.py`: one source. Both keep one contract
(the README shows both):
- At most `concurrency` handlers run at once, and the worker holds (has leased) at most
  `concurrency` messages: it long-polls (`Dequeue`, `wait_ms=poll_wait_ms`) for as many
  messages as it has free slots, never more: nothing is buffered.
- While a handler runs, its message's lease is extended (`Touch` with the delivery's lease
  id) once `extend_at` (1/3) of the lease has passed (`LeasePlan`); extending stops when
  the handler returns. A touch that finds the lease gone stops extending it (the ack
  will then fail with `StaleLease`: the message was or will be delivered again).
- The handler returns: the message is acked. It raises: the message is nacked with the
  `Backoff` delay for its attempt; on the queue's `max_attempts`-th attempt the server
  dead-letters it on that nack.
- `stop()` (any thread, or SIGTERM/SIGINT while `run()` runs in the main thread): no new
  message is taken (what a poll returns after the stop is released at once); running
  handlers have `grace_s` to finish and be settled; the messages of those still running
  then are *released* (ready again at once, the attempt not counted) and their handlers'
  outcomes ignored: an asyncio handler is cancelled; a thread's handler runs on in its
  daemon thread, and the process may exit under it. Nothing is lost: a release or ack
  that fails leaves the message leased, and it comes back when its lease ends.
  Cancelling an asyncio `run()` is a stop without grace.
- Acks, nacks, touches and releases are unary calls with the delivery's lease id, so the
  client's failover rules retry them safely (`doq_client.retry`). Acks are coalesced: one
  `AckBatch` call carries every ack that came while the previous one was out; a message's
  slot is free once its ack is answered.

The loops: `concurrency` handler loops take the messages the poll loop (`run`) brings in;
one lease keeper touches the running handlers' messages when due; one ack sender sends
the acks. Where tasks and threads differ in more than `await`, `doq_client._worker_io`
has an `*_aio` / `*_sync` pair.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from doq_client import _ops
from doq_client._handle import SyncClient
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
from doq_client._worker_io import (
    MAIN_WAIT_S,
    SIGNALS,
    ThreadShell,
    abandon_sync,
    check_handler_sync,
    here_sync,
    interrupted_grace_s_sync,
    signals_sync,
    spawn_sync,
    stop_sync,
    wait_sync,
    wait_event_sync,
)
from doq_client.errors import DoqClientError
from doq_client.types import AckResult, Message

log = logging.getLogger("doq_client.worker")

Handler = Callable[[Message], Any]

__all__ = ["SIGNALS", "Handler", "Worker"]


class Worker(ThreadShell):
    """Runs `handler(msg)` on `queue`'s messages, at most `concurrency` at once; see
    the module docstring. Make it with `DoqClient.worker(...)`; `run()` it (blocks), or
    `start()` it in a background thread and `stop()` / `join()` it (or use it as a
    context manager); `stop()` ends it gracefully."""

    def __init__(
        self,
        client: SyncClient,
        queue: str,
        handler: Handler,
        options: WorkerOptions,
        *,
        hooks: WorkerHooks | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        check_handler_sync(handler)
        self.client = client
        self.queue = queue
        self.handler = handler
        self.options = options
        self.hooks = hooks or WorkerHooks()
        self._rng = rng
        self._lock = threading.RLock()  # RLock: stop() may run in a signal handler
        self._changed = threading.Condition(self._lock)  # a slot freed, a stop, a message settled
        self._keeper_wake = threading.Condition(self._lock)
        self._acks_ready = threading.Condition(self._lock)
        self._job_ready = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._held: set[Held] = set()
        self._settling = 0  # messages whose handler returned and whose ack/nack is under way
        self._jobs: deque[Held | None] = deque()
        self._acks: list[Held] = []  # handlers returned: to ack (see _send_acks)
        self._finished = False  # shut down: the ack sender ends once nothing is pending
        self._loops: list[Any] = []  # the handler loops, the lease keeper, the ack sender
        self._loop: Any = None  # where run() runs (see _worker_io.stop_sync)
        self._loop_thread = 0
        self._plan: LeasePlan | None = None
        self._max_attempts = 0

    # -- control -----------------------------------------------------------------------
    def stop(self) -> None:
        """Stop taking messages and shut down gracefully (see the module docstring).
        Returns at once; safe from any thread (and from a signal handler)."""
        stop_sync(self)

    @property
    def running(self) -> int:
        """Handlers running now."""
        return sum(1 for h in list(self._held) if h.state is State.RUNNING)

    # -- the loop ------------------------------------------------------------------------
    def run(self, *, handle_signals: bool = True) -> None:
        """Work until `stop()`, then stop gracefully and return. With `handle_signals` and in
        the main thread, SIGTERM and SIGINT call `stop()` meanwhile. Raises a poll's error
        that retrying cannot cure (e.g. `QueueNotFound`), after the graceful stop."""
        self._loop, self._loop_thread = here_sync()
        q = self.client._call(_ops.get_queue(self.queue))
        self._plan = self.options.plan(q.settings)
        self._max_attempts = q.settings.max_attempts
        n = self.options.concurrency
        self._loops = [spawn_sync(self._serve, f"doq-worker-{i}") for i in range(n)]
        self._loops.append(spawn_sync(self._keep_leases, "doq-worker-leases"))
        self._loops.append(spawn_sync(self._send_acks, "doq-worker-acks"))
        error: DoqClientError | None = None
        grace_s = interrupted_grace_s_sync(self.options.grace_s)
        with signals_sync(handle_signals, self.stop):
            try:
                error = self._poll()
                grace_s = self.options.grace_s
            finally:
                self._shut_down(n, grace_s)
        if error is not None:
            raise error

    def _poll(self) -> DoqClientError | None:
        """Take messages for the free slots until a stop; returns a fatal poll error."""
        assert self._plan is not None
        n = self.options.concurrency
        while True:
            with self._lock:
                while not self._stop.is_set() and len(self._held) >= n:
                    wait_sync(self._changed, MAIN_WAIT_S)
                if self._stop.is_set():
                    return None
                free = n - len(self._held)
            sent_s = time.monotonic()
            try:
                msgs = self.client._call(
                    _ops.dequeue(self.queue, False, free, self.options.poll_wait_ms, self._plan.lease_ms),
                    self.options.poll_wait_ms / 1000)
            except DoqClientError as e:
                if not poll_retryable(e):
                    self.stop()
                    return e
                log.warning("worker poll of %r failed (%s); trying again", self.queue, e)
                wait_event_sync(self._stop, RETRY_POLL_S)
                continue
            late: list[Held] = []
            with self._lock:
                for m in msgs:
                    h = Held(m, sent_s, self._plan.next_extend_s(sent_s))
                    if self._stop.is_set():
                        late.append(h)
                        continue
                    self._held.add(h)
                    self._jobs.append(h)
                    self._job_ready.notify()
                self._keeper_wake.notify()
            for h in late:
                self._release(h)

    def _shut_down(self, n: int, grace_s: float) -> None:
        """After the poll loop: release what no handler started yet, give the running
        handlers `grace_s`, then release the rest; acks and nacks under way are awaited."""
        self._stop.set()
        with self._lock:
            not_started = [h for h in self._jobs if h is not None and h.claim(State.RELEASED)]
            self._jobs.clear()
            self._held.difference_update(not_started)
        for h in not_started:
            self._release(h)
        deadline = time.monotonic() + grace_s
        with self._lock:
            while self._held and (left := deadline - time.monotonic()) > 0:
                wait_sync(self._changed, min(left, MAIN_WAIT_S))
            unfinished = [h for h in self._held if h.claim(State.RELEASED)]
        for h in unfinished:
            self._release(h)
        with self._lock:
            while self._settling:  # acks and nacks under way: bounded by the client's timeouts
                wait_sync(self._changed, MAIN_WAIT_S)
            self._finished = True
            self._acks_ready.notify_all()
            self._held.clear()
            self._jobs.extend([None] * n)  # the idle handler loops end
            self._job_ready.notify_all()
            self._keeper_wake.notify_all()
        abandon_sync(self._loops)

    def _serve(self) -> None:
        """A handler loop: runs the jobs it is given until a None."""
        while True:
            with self._lock:
                while not self._jobs:
                    self._job_ready.wait()
                h = self._jobs.popleft()
            if h is None:
                return
            self._work(h)

    def _work(self, h: Held) -> None:
        call_hook(self.hooks.on_start, h.msg)
        h.started_s = time.monotonic()
        error: Exception | None = None
        try:
            self.handler(h.msg)
        except Exception as e:
            error = e
        with self._lock:
            if not h.claim(State.SETTLING):
                return  # released by a stop meanwhile
            self._settling += 1
            if error is None:  # the ack sender acks it, and frees its slot then
                self._acks.append(h)
                self._acks_ready.notify()
                return
        try:
            self._nack(h, error)
        finally:
            self._settled([h])

    def _settled(self, done: list[Held]) -> None:
        with self._lock:
            self._settling -= len(done)
            self._held.difference_update(done)
            self._changed.notify_all()

    def _nack(self, h: Held, error: Exception) -> None:
        m = h.msg
        delay = retry_in_ms(m, self._max_attempts, self.options.backoff, self._rng())
        log.info("handler failed on message %d of %r (attempt %d): %r", m.id, self.queue, m.attempts, error)
        try:
            self.client._call(_ops.nack(self.queue, m.id, m.lease_id, delay or 0, None, False))
        except DoqClientError as e:  # the lease is gone or the cluster unreachable: it comes back
            log.warning("nack of message %d of %r failed: %s (it will be delivered again)", m.id, self.queue, e)
            return
        call_hook(self.hooks.on_failure, m, error, delay)

    def _send_acks(self) -> None:
        """The ack sender: one AckBatch call for all acks pending (those that come while it
        is out go in the next), until the worker has shut down."""
        while True:
            with self._lock:
                while not self._acks:
                    if self._finished:
                        return
                    self._acks_ready.wait()
                batch, op = take_acks(self._acks, self.queue)
            try:
                results: list[AckResult] | Exception = self.client._call(op)
            except Exception as e:  # e.g. the client was closed: never leave a slot taken
                results = e
            now = time.monotonic()
            for h, err in ack_outcomes(batch, results):
                if err is None:
                    call_hook(self.hooks.on_success, h.msg, now - h.started_s)
                else:  # the lease is gone or the cluster unreachable: it comes back
                    log.warning("ack of message %d of %r failed: %s (it will be delivered again)",
                                h.msg.id, self.queue, err)
            self._settled(batch)

    def _release(self, h: Held) -> None:
        m = h.msg
        try:
            self.client._call(_ops.nack(self.queue, m.id, m.lease_id, 0, None, True))
        except Exception as e:  # the lease is gone, the cluster unreachable or the client closed
            log.warning("releasing message %d of %r failed: %s (it comes back when its lease ends)",
                        m.id, self.queue, e)
            return
        call_hook(self.hooks.on_release, m)

    def _keep_leases(self) -> None:
        """The lease keeper: touches each running handler's message when due."""
        plan = self._plan
        assert plan is not None
        while True:
            with self._lock:
                while True:
                    if self._stop.is_set() and not self._held:
                        return
                    now = time.monotonic()
                    due = [h for h in self._held if h.wants_extend(now)]
                    if due:
                        break
                    waits = [h.next_extend_s - now for h in self._held if h.state is State.RUNNING and not h.lost]
                    wait_sync(self._keeper_wake, min(waits) if waits else None)
            for h in due:
                self._extend(h, plan)

    def _extend(self, h: Held, plan: LeasePlan) -> None:
        m = h.msg
        sent_s = time.monotonic()
        try:
            outcome: int | Exception = self.client._call(
                _ops.touch(self.queue, m.id, m.lease_id, plan.lease_ms))
        except Exception as e:  # e.g. the client was closed: the keeper goes on
            outcome = e
        if note_touch(h, plan, self.queue, sent_s, outcome, time.monotonic()):
            call_hook(self.hooks.on_extend, m, outcome)
