"""Delivery before confirmation, and what a cancelled consumer leaves behind.

- A real `doq serve` (a one-node Raft cluster, as users run it) and two gRPC streams on
  one channel: the frame of a message that its enqueue's own commit leased to a parked
  consumer stream leaves before that enqueue's confirmation (both go out in the same
  event-loop turn after the commit; the frame first).
- In-process service over LMDB: a leasing session cancelled while its dequeue commits
  still releases what that dequeue leased (it waits for the result with
  `wait_for_result`, which never cancels a proposal in a log entry); the results of
  dequeues committed together go out in one frame (up to `max_batch`).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.node.base import ProposalFuture
from doq.queues.commands import Command, Dequeue, EnqueueItem
from doq.queues.model import MessageState
from doq.service import convert as cv
from doq.service.sessions import DequeueSession
from tests.support import inproc
from tests.support.inproc import Served, stalled_commits
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _parked_long_polls(node: NodeProc) -> int:
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("doq_long_polls_waiting "):
                return int(float(line.split()[1]))
    raise AssertionError("no doq_long_polls_waiting in /metrics")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProc]:
    with running_node(tmp_path / "node") as n:
        yield n


async def _requests(q: asyncio.Queue[object]) -> AsyncIterator[object]:
    while (r := await q.get()) is not None:
        yield r


async def test_a_message_leased_by_its_enqueues_commit_is_sent_before_the_confirmation(
    node: NodeProc,
) -> None:
    count = 20
    events: list[tuple[str, int]] = []  # in arrival order, on one channel (one connection)
    async with grpc.aio.insecure_channel(node.grpc_addr) as channel:
        stub = pb_grpc.DOQStub(channel)
        await stub.CreateQueue(pb.CreateQueueRequest(name="q"))
        deq: asyncio.Queue[object] = asyncio.Queue()
        deq.put_nowait(pb.DequeueStreamRequest(queue_name="q", prefetch=count * 2))
        frames = stub.DequeueBatchStream(_requests(deq))
        enq: asyncio.Queue[object] = asyncio.Queue()
        confirms = stub.EnqueueBatchStream(_requests(enq))

        async def read_frames() -> None:
            async for f in frames:
                events.extend(("frame", int(m.content)) for m in f.messages)

        async def read_confirms() -> None:
            n = 0
            async for r in confirms:
                assert list(r.ids) and not r.error_positions, r
                events.append(("confirm", n))
                n += 1

        readers = [asyncio.create_task(read_frames()), asyncio.create_task(read_confirms())]
        try:
            # the consumer stream waits in its queue's long poll (and stays there: it has credits)
            await _until(lambda: _parked_long_polls(node) == 1, "the consumer stream to park")
            for i in range(count):
                enq.put_nowait(pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(
                    queue_name="q", contents=[b"%d" % i])))
                await _until(lambda i=i: {("frame", i), ("confirm", i)} <= set(events),  # type: ignore[misc]
                             f"message {i} delivered and confirmed")
        finally:
            for t in readers:
                t.cancel()
            frames.cancel()
            confirms.cancel()
    late = [i for i in range(count) if events.index(("frame", i)) > events.index(("confirm", i))]
    assert not late, f"confirmed before its frame was sent: {late} ({events})"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def test_a_session_cancelled_while_its_dequeue_commits_releases_what_it_leased(
    served: Served, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = DequeueSession(served.api, cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", prefetch=10)), 64)
    frames = s.pump()
    got = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the long poll")
    dequeues: list[asyncio.Future[object]] = []
    propose_nowait = served.api.node.propose_nowait

    def spy(cmd: Command) -> asyncio.Future[object]:
        fut = propose_nowait(cmd)
        if isinstance(cmd, Dequeue):
            dequeues.append(fut)
        return fut

    monkeypatch.setattr(served.api.node, "propose_nowait", spy)
    with stalled_commits(served.env):
        served.api.enqueue_nowait("q", EnqueueItem(b"m"))  # leases for the session in its entry
        assert len(dequeues) == 1 and isinstance(dequeues[0], ProposalFuture)
        await _until(lambda: dequeues[0].in_log, "the session's dequeue to be taken into an entry")
        got.cancel()  # the call ends while that entry commits
        await asyncio.sleep(0)
        assert not dequeues[0].cancelled()
    with pytest.raises(asyncio.CancelledError):
        await got
    leased = dequeues[0].result()
    assert isinstance(leased, list) and [m.content for m in leased] == [b"m"]
    await s.drain()
    view = served.api.node.state.get_message("q", leased[0].id)
    assert (view.state, view.attempts) == (MessageState.READY, 0)


async def test_dequeues_committed_together_go_out_in_frames_of_at_most_max_batch(served: Served) -> None:
    s = DequeueSession(served.api, cv.stream_open_from_pb(
        pb.DequeueStreamRequest(queue_name="q", prefetch=10, max_batch=2)), 64)
    frames = s.pump()
    first = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the long poll")
    with stalled_commits(served.env):  # three enqueues, each leasing for the session, one commit
        stored = [served.api.enqueue_nowait("q", EnqueueItem(b"%d" % i)) for i in range(3)]
    assert [m.content for m in await asyncio.wait_for(first, 20)] == [b"0", b"1"]
    assert [m.content for m in await asyncio.wait_for(anext(frames), 20)] == [b"2"]
    await asyncio.gather(*stored)
    await frames.aclose()

