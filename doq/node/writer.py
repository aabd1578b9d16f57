"""`WriterThread`: a node's one writer thread, with a light hand-off for each Ready."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class WriterThread(concurrent.futures.Executor):
    """One thread running jobs in the order they are given (every write of a node, and
    the reads that must see exactly its applied state). `call(fn, arg)` runs `fn(arg)`
    there and returns a future of the calling event loop: one queue put to start, one
    `call_soon_threadsafe` to end (`run_in_executor` chains a `concurrent.futures.Future`
    and more work on both threads). As an `Executor` (`submit`) it serves
    `run_in_executor` for the rest. The thread starts with the first job; `shutdown`
    lets the jobs given before it finish."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def call(self, fn: Callable[[T], R], arg: T) -> asyncio.Future[R]:
        """Run `fn(arg)` on the thread; the future (of the running loop) gets its result
        or exception. Cancelling the future does not stop `fn`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()

        def job() -> None:
            try:
                result, error = fn(arg), None
            except BaseException as e:  # handed to the loop, like run_in_executor
                result, error = None, e
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, fut, result, error)

        self._put(job)
        return fut

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn()` on the thread after the jobs given before; no result (`fn` reports
        its own outcome). Raises RuntimeError after `shutdown`."""
        self._put(fn)

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[R]:
        f: concurrent.futures.Future[R] = concurrent.futures.Future()

        def job() -> None:
            if not f.set_running_or_notify_cancel():
                return
            try:
                f.set_result(fn(*args, **kwargs))
            except BaseException as e:
                f.set_exception(e)

        self._put(job)
        return f

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None and thread.is_alive():
                self._jobs.put(None)
        if wait and thread is not None:
            thread.join()

    def _put(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new jobs after shutdown")
            if self._thread is None:
                # a daemon, as a node that is never stopped (a test) must not hold the
                # interpreter's exit; a stopped node joins it (`shutdown`)
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put(job)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()


def _settle(fut: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if fut.done():  # cancelled by its waiter
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
