"""Virtual time for asyncio tests: an event loop whose clock jumps to the next timer
instead of sleeping, and an executor that runs work inline (no threads).

With both, a RaftNode test is deterministic for a given seed (timers, message delays and
the order of callbacks depend only on the seed) and runs without real waiting; LMDB I/O
is real.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import Callable
from typing import Any


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual: when nothing is ready, it jumps to the next timer."""

    def __init__(self) -> None:
        super().__init__(selectors.SelectSelector())
        self._vtime = 0.0
        real_select = self._selector.select

        def select(timeout: float | None = None) -> list[Any]:
            events = real_select(0)  # only the loop's own wakeup pipe: never block
            if not events and timeout is not None and timeout > 0:
                self._vtime += timeout
            return events

        self._selector.select = select  # type: ignore[method-assign]

    def time(self) -> float:
        return self._vtime


class InlineExecutor(concurrent.futures.Executor):
    """Runs each submitted call at once, on the calling thread (also as a node's
    `WriterThread`: `call`)."""

    def call(self, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(fn(arg))
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def post(self, fn: Callable[[], None]) -> None:
        fn()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None
