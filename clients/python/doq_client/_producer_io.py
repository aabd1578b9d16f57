"""The producer's few steps whose asyncio and thread forms differ in more than `await`,
each as an `*_aio` / `*_sync` pair with the same parameters (as `_worker_io` does for the
worker).

`doq_client/aio_producer.py` (the one hand-written producer) calls the `*_aio` forms; the
synchronous `doq_client/producer.py` is generated from it (`clients/python/unasync.py`),
which renames each `*_aio` name to its `*_sync` twin, `AioSignal` to `ThreadSignal` and
`NoLock` to `threading.RLock`.

The asyncio producer runs on one event loop: its lock is `NoLock` (its sections never
await but in `AioSignal.wait`, and nothing else runs meanwhile), its signals are events.
The thread producer's lock is an `RLock` and its signals conditions of that lock, so
`wait` releases the lock while it waits, as `Condition.wait` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any


class NoLock:
    """The asyncio producer's lock: nothing to exclude on one event loop."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class AioSignal:
    """Wakes the tasks waiting for a change (the caller re-checks what it waits for)."""

    __slots__ = ("_event",)

    def __init__(self, lock: NoLock) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    notify_all = notify

    async def wait(self) -> None:
        """Until the next `notify` (or one since the last wait began: spurious, re-check)."""
        self._event.clear()
        await self._event.wait()


class ThreadSignal:
    """A condition of the producer's lock: `wait` with the lock held."""

    __slots__ = ("_cond", "notify", "notify_all", "wait")

    def __init__(self, lock: Any) -> None:
        self._cond = threading.Condition(lock)
        self.notify = self._cond.notify
        self.notify_all = self._cond.notify_all
        self.wait = self._cond.wait


CANCELLED_aio: tuple[type[BaseException], ...] = (asyncio.CancelledError,)
"""What ends the stream's task from outside (the producer's loop closed under it)."""
CANCELLED_sync: tuple[type[BaseException], ...] = ()  # nothing cancels a thread


def spawn_aio(fn: Callable[[], Any], name: str) -> asyncio.Task[None]:
    """Run the stream `fn()` beside the caller: a task."""
    return asyncio.get_running_loop().create_task(fn(), name=name)


def spawn_sync(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run the stream `fn()` beside the caller: a daemon thread."""
    t = threading.Thread(target=fn, name=name, daemon=True)
    t.start()
    return t


async def wait_for_aio(signal: AioSignal, done: Callable[[], bool], timeout_s: float | None) -> bool:
    """Wait (the lock held) until `done()`, `timeout_s` at most (None: no limit); `done()`."""
    if timeout_s is None:
        while not done():
            await signal.wait()
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while not done():
                await signal.wait()
    return done()


def wait_for_sync(signal: ThreadSignal, done: Callable[[], bool], timeout_s: float | None) -> bool:
    return signal._cond.wait_for(done, timeout_s)


async def join_aio(runner: asyncio.Task[None] | None, timeout_s: float | None) -> None:
    """Wait for the stream's task to end (`timeout_s` at most); never from inside it."""
    if runner is not None and runner is not asyncio.current_task():
        await asyncio.wait([runner], timeout=timeout_s)


def join_sync(runner: threading.Thread | None, timeout_s: float | None) -> None:
    if runner is not None and runner is not threading.current_thread():
        runner.join(timeout_s)
