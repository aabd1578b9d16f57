"""The consumer's few steps whose asyncio and thread forms differ in more than `await`,
each as an `*_aio` / `*_sync` pair with the same parameters (as `_producer_io` does for
the producer and `_worker_io` for the worker).

`doq_client/aio_consumer.py` (the one hand-written consumer) calls the `*_aio` forms; the
synchronous `doq_client/consumer.py` is generated from it (`clients/python/unasync.py`),
which renames each `*_aio` name to its `*_sync` twin, `AioWake` to `ThreadWake`, the
`NoLock` to a `threading.Lock` and asyncio's event to threading's.

- A stream's wake-up (`AioWake` / `ThreadWake`): each stream's request iterator waits on
  its own, so that replacing the stream (a failover, a move to the leader) wakes the old
  iterator to end without taking a wake-up meant for the new one.
- Reading a frame: `None` at the end of the stream (asyncio's `EOF` / the iterator's
  `StopIteration`).
- Unary settlements (of messages from a failed stream, releases of what arrived after a
  half-close): the asyncio consumer sends them as tasks, not awaited (`close()` waits for
  them, `close_grace_s` at most); the thread consumer sends them in the calling thread and
  returns once they are answered.
- Draining a stream being ended: every frame until the server ends it, `close_grace_s` at
  most, then the call is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue as queue_mod
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from doq_client._producer_io import NoLock as NoLock  # the asyncio consumer's lock too
from doq_client.errors import DoqClientError
from doq_proto.v1 import doq_pb2 as pb

log = logging.getLogger("doq_client.consumer")

Calls = set[Any]
"""Unary settlements in progress: asyncio tasks (the thread consumer's stays empty)."""


class AioWake:
    """A stream's wake-up on one event loop: `set` wakes its waiter (which re-checks)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float | None) -> None:
        """Until the next `set`, `timeout_s` at most (None: no limit). The caller checked
        its state just before, with no await in between: nothing set meanwhile is lost."""
        self._event.clear()
        if timeout_s is None:
            await self._event.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._event.wait()


class ThreadWake:
    """A stream's wake-up across threads: each `set` is kept until a `wait` takes it (never
    lost between the waiter's check and its wait; a kept one is a spurious wake-up)."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue_mod.SimpleQueue[None] = queue_mod.SimpleQueue()

    def set(self) -> None:
        self._queue.put(None)

    def wait(self, timeout_s: float | None) -> None:
        with contextlib.suppress(queue_mod.Empty):
            self._queue.get(timeout=timeout_s)


async def read_aio(call: Any) -> Any | None:
    """The stream's next frame; None when the server ended it."""
    resp = await call.read()
    return None if resp is grpc.aio.EOF else resp


def read_sync(call: Any) -> Any | None:
    try:
        return next(call)
    except StopIteration:
        return None


async def _settled(call: Awaitable[Any]) -> None:
    """Await a settlement sent by a unary call; a failure is logged, not raised (the
    message comes back when its lease ends, as with an ack lost with a stream)."""
    try:
        await call
    except (DoqClientError, grpc.RpcError, ValueError) as e:  # ValueError: the client was closed
        log.debug("settlement by unary call failed: %s", e)


def _track(calls: Calls, call: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(_settled(call))
    calls.add(task)
    task.add_done_callback(calls.discard)


def settle_aio(calls: Calls, send: Callable[[], Awaitable[Any]]) -> None:
    """Send one settlement by `send()` (a unary call) as a task, tracked in `calls`."""
    _track(calls, send())


def settle_sync(calls: Calls, send: Callable[[], Any]) -> None:
    """Send one settlement by `send()` and wait for its answer (a failure is logged)."""
    try:
        send()
    except (DoqClientError, grpc.RpcError, ValueError) as e:  # ValueError: the client was closed
        log.debug("settlement by unary call failed: %s", e)


async def release_aio(calls: Calls, stub: Any, requests: Sequence[pb.NackRequest], timeout_s: float) -> None:
    """Release messages by unary Nacks to the stream's node (tasks tracked in `calls`)."""
    try:
        for req in requests:
            _track(calls, stub.Nack(req, timeout=timeout_s))
    except ValueError:  # the client was closed: their leases end instead
        pass


def release_sync(calls: Calls, stub: Any, requests: Sequence[pb.NackRequest], timeout_s: float) -> None:
    """Release messages by unary Nacks sent together; returns once all are answered."""
    try:
        futures = [stub.Nack.future(req, timeout=timeout_s) for req in requests]
    except ValueError:  # the client was closed: their leases end instead
        return
    for f in futures:
        try:
            f.result()
        except grpc.RpcError:
            pass  # e.g. its lease already ended: it is back in the queue anyway


async def drain_aio(call: Any, on_frame: Callable[[Any], None], timeout_s: float) -> None:
    """`on_frame` each frame until the server ends the stream (or it fails), `timeout_s`
    at most; then cancel the call."""

    async def drain() -> None:
        while (resp := await call.read()) is not grpc.aio.EOF:
            on_frame(resp)

    try:
        await asyncio.wait_for(drain(), timeout_s)
    except (TimeoutError, grpc.RpcError):
        pass
    finally:
        call.cancel()


def drain_sync(call: Any, on_frame: Callable[[Any], None], timeout_s: float) -> None:
    timer = threading.Timer(timeout_s, call.cancel)  # ends the iteration below (RpcError)
    timer.daemon = True
    timer.start()
    try:
        for resp in call:
            on_frame(resp)
    except grpc.RpcError:
        pass
    finally:
        timer.cancel()
        call.cancel()


async def join_aio(calls: Calls, timeout_s: float) -> None:
    """Wait for the unary settlements in progress, `timeout_s` at most."""
    if calls:
        await asyncio.wait(list(calls), timeout=timeout_s)


def join_sync(calls: Calls, timeout_s: float) -> None:
    return None  # each was answered before its call returned
