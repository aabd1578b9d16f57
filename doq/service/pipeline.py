"""The pipe of a producer stream: requests started as they arrive, outcomes in order,
a bounded window in between (the service's EnqueueStream / EnqueueBatchStream).

Every task it starts ends with it (also when the call is cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")


async def finish(task: asyncio.Task[object] | asyncio.Future[object]) -> None:
    """Cancel `task` and wait until it has ended (its own errors are not raised here)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a reader error was already reported or is moot


class ProducerSession(Generic[R, T]):
    """The pipe of one producer stream (EnqueueStream, EnqueueBatchStream): a reader task
    starts each request (`start`: proposes it, without a task where possible) as it
    arrives; `next` gives the started requests in request order (without a coroutine of
    its own: this is on every message's path). At most `window` are
    started and not taken by `next`: beyond it the reader stops reading the client's
    requests. `close` ends the reader, and `abandon`s each started request nobody will
    answer (the default ends a task: its outcome ends with the call)."""

    def __init__(self, requests: AsyncIterator[R], start: Callable[[R], T], window: int,
                 abandon: Callable[[T], Awaitable[None]] | None = None) -> None:
        self._start = start
        self._abandon = abandon or _finish_task
        self._inflight: asyncio.Queue[T | None] = asyncio.Queue(window)
        self._putting: T | None = None  # started, waiting for room in the window
        self._task = asyncio.create_task(self._read(requests), name="doq.ProducerSession.reader")

    async def _read(self, requests: AsyncIterator[R]) -> None:
        """`put(start(r))` for each request, then the end mark None. Cancelled (by `close`),
        it ends at once without the end mark: waiting to put it into a full queue nobody
        drains would keep the task forever."""
        put = self._inflight.put
        try:
            async for r in requests:
                self._putting = self._start(r)
                await put(self._putting)
                self._putting = None
        except asyncio.CancelledError:
            raise
        except BaseException:
            await put(None)
            raise
        await put(None)

    def next(self) -> Awaitable[T | None]:
        """Await it: the next started request, or None after the last one (then `finished`
        raises the reader's own error, if any)."""
        return self._inflight.get()

    async def finished(self) -> None:
        """After `next` gave None: wait for the reader, raising its error."""
        await self._task

    async def close(self, current: T | None = None) -> None:
        """End the reader and abandon what is started and not answered: `current` (the
        request the caller was answering, if any) and those left in the window."""
        await finish(self._task)
        left = [x for x in (current, self._putting) if x is not None]
        while not self._inflight.empty():
            if (item := self._inflight.get_nowait()) is not None:
                left.append(item)
        for item in left:
            await self._abandon(item)


async def _finish_task(item: object) -> None:
    if isinstance(item, asyncio.Task) and not item.done():
        await finish(item)
