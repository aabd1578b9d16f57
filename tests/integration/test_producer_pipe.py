"""The coalescing producer against the real service in process (gRPC on 127.0.0.1), with
commits stalled as behind a stuck disk, so no frame is answered: a frame goes out at once
while the unanswered frames carry few messages, and messages gather once they carry many."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import lmdb
import pytest

from doq.service.api import QueueService
from doq.service.grpc_server import build_server
from doq_client import enqueue_request
from doq_client._producer_core import FEW_IN_FLIGHT, FRAMES_IN_FLIGHT
from doq_client.aio_producer import AsyncProducer
from tests.support import inproc
from tests.support.inproc import stalled_commits


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _sent(frames: list[int], n: int) -> Callable[[], bool]:
    return lambda: len(frames) == n


Served = tuple[QueueService, lmdb.Environment, grpc.aio.Channel]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.local_service(tmp_path) as api:
        await api.create_queue("q")
        server, port = build_server(api, "127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                yield api, api.node.state.env, channel
        finally:
            await server.stop(None)


async def test_messages_sent_one_at_a_time_go_out_at_once_while_few_are_unanswered(
    served: Served, frames: list[int]
) -> None:
    """A low rate (each message alone, nothing answered yet): more than FRAMES_IN_FLIGHT
    frames go out, none waits for an answer that coalescing would need."""
    api, env, channel = served
    p = AsyncProducer(channel)
    with stalled_commits(env):
        futs = []
        for i in range(FRAMES_IN_FLIGHT + 2):
            futs.append(await p.enqueue("q", b"%d" % i))
            await _until(_sent(frames, i + 1), f"message {i} to go out")
        assert frames == [1] * (FRAMES_IN_FLIGHT + 2) and not any(f.done() for f in futs)
    ids = [(await f).id for f in futs]
    assert ids == sorted(ids)
    await p.close()


async def test_messages_gather_once_the_unanswered_frames_carry_many(
    served: Served, frames: list[int]
) -> None:
    api, env, channel = served
    p = AsyncProducer(channel)
    big = [b"x"] * FEW_IN_FLIGHT
    with stalled_commits(env):
        futs = []
        for i in range(FRAMES_IN_FLIGHT):
            futs.append(await p.enqueue_many([enqueue_request("q", b) for b in big]))
            await _until(_sent(frames, i + 1), f"frame {i} to go out")
        lone = [await p.enqueue("q", b"a"), await p.enqueue("q", b"b")]
        await _until(lambda: not p._send._event.is_set(), "the sender to look at them")  # it waits again
        assert len(frames) == FRAMES_IN_FLIGHT  # the pipe is full: they wait for an answer
    await asyncio.gather(*futs, *lone)
    assert frames[FRAMES_IN_FLIGHT:] == [2]  # then went out together
    await p.close()
