"""The worker's few steps whose asyncio and thread forms differ in more than `await`,
each as an `*_aio` / `*_sync` pair with the same parameters (as `_transport` does for
gRPC's two APIs).

`doq_client/aio_worker.py` (the one hand-written worker) calls the `*_aio` forms; the
synchronous `doq_client/worker.py` is generated from it (`clients/python/unasync.py`),
which renames each `*_aio` name to its `*_sync` twin and `AioShell` to `ThreadShell`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Self

SIGNALS = (signal.SIGTERM, signal.SIGINT)
MAIN_WAIT_S = 0.2  # the waits of the main loop wake up this often, so a signal is never missed

_notifying: set[asyncio.Task[None]] = set()  # stop()'s wake-ups under way (kept referenced)


class AioShell:
    """What only the asyncio worker has: nothing (it runs as `await worker.run()`)."""


class ThreadShell:
    """What only the synchronous worker has: running in a background thread (`start`,
    `join`, and `with worker:` = start, then stop and join)."""

    queue: str
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def run(self, *, handle_signals: bool = True) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Run the worker in a background thread (no signal handlers); `stop()` and `join()` it."""
        def main() -> None:
            try:
                self.run(handle_signals=False)
            except BaseException as e:  # re-raised by join()
                self._error = e

        self._thread = threading.Thread(target=main, name=f"doq-worker-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for a started worker to end; True if it ended (re-raises what stopped it)."""
        assert self._thread is not None, "join() a worker that was start()ed"
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()


# -- the handler ------------------------------------------------------------------------------
def check_handler_aio(handler: Any) -> None:
    """The asyncio worker awaits its handler: it must be a coroutine function."""
    if not inspect.iscoroutinefunction(handler) and not inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        raise TypeError("an AsyncWorker's handler must be a coroutine function (async def)")


def check_handler_sync(handler: Any) -> None:
    """Any callable will do."""


# -- where run() runs -------------------------------------------------------------------------
def here_aio() -> tuple[Any, int]:
    """(the running event loop, its thread): where `stop_aio` sends a stop from elsewhere."""
    return asyncio.get_running_loop(), threading.get_ident()


def here_sync() -> tuple[Any, int]:
    return None, 0


def spawn_aio(fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> asyncio.Task[None]:
    """Run `fn()` beside the caller: a task."""
    return asyncio.get_running_loop().create_task(fn(), name=name)


def spawn_sync(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run `fn()` beside the caller: a daemon thread."""
    t = threading.Thread(target=fn, name=name, daemon=True)
    t.start()
    return t


async def abandon_aio(loops: list[asyncio.Task[None]]) -> None:
    """After the shutdown: cancel the loops still running (a handler past the grace period,
    its message released) and wait for them to end."""
    for t in loops:
        t.cancel()
    if loops:
        await asyncio.wait(loops)


def abandon_sync(loops: list[threading.Thread]) -> None:
    """After the shutdown: the idle threads end; a busy one runs its handler on (daemon)."""


def interrupted_grace_s_aio(grace_s: float) -> float:
    """The grace period when `run()` is interrupted: none (cancelling `run()` hands back at
    once what the worker holds)."""
    return 0.0


def interrupted_grace_s_sync(grace_s: float) -> float:
    return grace_s


# -- waits ------------------------------------------------------------------------------------
async def wait_aio(cond: asyncio.Condition, timeout_s: float | None) -> None:
    """`cond.wait()` (the caller holds its lock), for at most `timeout_s` (None: no limit)."""
    if timeout_s is None:
        await cond.wait()
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await cond.wait()


def wait_sync(cond: threading.Condition, timeout_s: float | None) -> None:
    cond.wait(timeout_s)


async def wait_event_aio(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set, `timeout_s` at most."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


def wait_event_sync(event: threading.Event, timeout_s: float) -> None:
    event.wait(timeout_s)


# -- stopping ---------------------------------------------------------------------------------
def stop_aio(worker: Any) -> None:
    """Set the worker's `_stop` and wake its main loop; from any thread (hops to the loop)."""
    loop = worker._loop
    if loop is not None and threading.get_ident() != worker._loop_thread:
        loop.call_soon_threadsafe(stop_aio, worker)
        return
    worker._stop.set()
    if loop is not None:
        task = loop.create_task(_notify_all(worker._lock, worker._changed))
        _notifying.add(task)
        task.add_done_callback(_notifying.discard)


async def _notify_all(lock: asyncio.Lock, cond: asyncio.Condition) -> None:
    async with lock:
        cond.notify_all()


def stop_sync(worker: Any) -> None:
    """Set the worker's `_stop` and wake its main loop; from any thread or a signal handler
    (the worker's lock is an RLock)."""
    worker._stop.set()
    with worker._lock:
        worker._changed.notify_all()


@contextlib.contextmanager
def signals_aio(enabled: bool, stop: Callable[[], None]) -> Iterator[None]:
    """While inside: SIGTERM and SIGINT call `stop` (if `enabled` and in the main thread)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    for s in SIGNALS:
        loop.add_signal_handler(s, stop)
    try:
        yield
    finally:
        for s in SIGNALS:
            loop.remove_signal_handler(s)


@contextlib.contextmanager
def signals_sync(enabled: bool, stop: Callable[[], None]) -> Iterator[None]:
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, lambda *_: stop()) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
