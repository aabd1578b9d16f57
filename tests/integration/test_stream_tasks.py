"""No task a gRPC stream starts outlives its call, even when the call is cancelled while
its window is full.

In-process grpc.aio server on 127.0.0.1 over the real service and a temporary LMDB. To hold
a window full, commits are stalled the way a stuck disk would stall them: another thread
holds LMDB's write lock, so the node's writer waits and no proposal resolves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from doq_proto.v1 import doq_pb2 as pb

import doq
from doq.service import grpc_server
from tests.support import inproc
from tests.support.inproc import Served, stalled_commits

# Tasks the service may start: its own coroutines, and asyncio's (e.g. Event.wait in a long poll).
SERVICE_DIRS = (str(Path(doq.__file__).parent), str(Path(asyncio.__file__).parent))
WINDOW = 2


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


class Counter:
    """Counts calls of a wrapped function (a spy: the wrapped function still runs)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.n = 0

    def __call__(self, *a: Any, **kw: Any) -> Any:
        self.n += 1
        return self.fn(*a, **kw)

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        return self if obj is None else functools.partial(self, obj)  # bound like a method


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _leftovers(before: set[asyncio.Task[Any]]) -> list[str]:
    """Tasks of the service started since `before` and still running (not grpc's, not ours)."""
    out = []
    for t in asyncio.all_tasks() - before:
        code = getattr(t.get_coro(), "cr_code", None)
        if t is asyncio.current_task() or t.done() or code is None or not code.co_filename.startswith(SERVICE_DIRS):
            continue
        out.append(f"{t.get_name()}: {code.co_qualname} ({code.co_filename})")
    return out


async def _no_leftovers(before: set[asyncio.Task[Any]], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while left := _leftovers(before):
        assert time.monotonic() < deadline, f"tasks outlived their cancelled call: {left}"
        await asyncio.sleep(0.01)


async def test_enqueue_stream_cancelled_with_a_full_window(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served.api.door, "limits", dataclasses.replace(served.api.limits, stream_window_messages=WINDOW))
    proposed = Counter(served.api.enqueue_nowait)
    monkeypatch.setattr(served.api, "enqueue_nowait", proposed)
    before = asyncio.all_tasks()
    with stalled_commits(served.env):
        call = served.stub.EnqueueStream()
        for i in range(WINDOW + 8):
            await call.write(pb.EnqueueRequest(queue_name="q", content=b"%d" % i))
        # The writer waits for the 1st result, the window holds the next WINDOW, and the
        # reader has proposed one more that it cannot put: the window is full.
        await _until(lambda: proposed.n >= WINDOW + 2, "the window to fill")
        call.cancel()
        await _no_leftovers(before)


async def test_enqueue_batch_stream_cancelled_with_a_full_window(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served.api.door, "limits", dataclasses.replace(served.api.limits, stream_window_frames=WINDOW))
    frames = Counter(served.api._enqueue_many)
    monkeypatch.setattr(served.api, "_enqueue_many", frames)
    before = asyncio.all_tasks()
    with stalled_commits(served.env):
        call = served.stub.EnqueueBatchStream()
        for i in range(WINDOW + 8):
            await call.write(pb.EnqueueBatchRequest(messages=[pb.EnqueueRequest(queue_name="q", content=b"%d" % i)]))
        await _until(lambda: frames.n >= WINDOW + 2, "the window to fill")
        call.cancel()
        await _no_leftovers(before)


@pytest.mark.parametrize("messages", [5, 0])  # prefetch window full / waiting in a long poll
async def test_dequeue_stream_cancelled_with_a_full_window(served: Served, messages: int) -> None:
    if messages:
        await served.api.enqueue_many([("q", grpc_server.cv.item_from_pb(pb.EnqueueRequest(content=b"m")))] * messages)
    before = asyncio.all_tasks()
    requests: asyncio.Queue[pb.DequeueStreamRequest] = asyncio.Queue()
    requests.put_nowait(pb.DequeueStreamRequest(queue_name="q", prefetch=3, auto_credit=True))

    async def send() -> AsyncIterator[pb.DequeueStreamRequest]:
        while True:
            yield await requests.get()

    call = served.stub.DequeueStream(send())
    if messages:  # the server sent its 3 and waits for credits the client never returns
        await _until(lambda: served.api.node.state.get_queue("q").stats.in_flight == 3, "3 in flight")
    else:  # the server waits in a long poll for a message
        await _until(lambda: len(_leftovers(before)) > 0, "the stream to start")
    call.cancel()
    await _no_leftovers(before)
