"""Delivery before confirmation, and what a cancelled consumer leaves behind.

All in-process, the service over a one-node Raft cluster on LMDB:
- the frame of a message that its enqueue's own commit leased to a parked consumer stream
  is handed out before that enqueue's confirmation (both in the same event-loop turn
  after the commit; the frame first);
- a leasing session cancelled while its dequeue commits
  still releases what that dequeue leased (it waits for the result with
  `wait_for_result`, which never cancels a proposal in a log entry); the results of
  dequeues committed together go out in one frame (up to `max_batch`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.errors import DoqError
from doq.node.base import ProposalFuture
from doq.queues.commands import Command, Dequeue, EnqueueItem
from doq.queues.model import MessageState
from doq.service import convert as cv
from doq.service.sessions import DequeueSession
from tests.support import inproc
from tests.support.inproc import Served, stalled_commits


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _requests(q: asyncio.Queue[object]) -> AsyncIterator[object]:
    while (r := await q.get()) is not None:
        yield r


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def test_a_message_leased_by_its_enqueues_commit_is_sent_before_the_confirmation(
    served: Served,
) -> None:
    """The service generators the gRPC handlers iterate (`dequeue_stream` for
    DequeueBatchStream, `enqueue_frames` for EnqueueBatchStream), each in a task of its
    own as a handler runs: a frame yielded is a frame handed to gRPC. (Checked here, in
    one event loop, not at a client: gRPC does not order two streams' messages as they
    reach the client's readers, even on one connection.)"""
    count = 20
    events: list[tuple[str, int]] = []  # in the order the server hands them out
    first = cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", prefetch=count * 2))
    settlements: asyncio.Queue[object] = asyncio.Queue()
    enq: asyncio.Queue[object] = asyncio.Queue()

    async def dequeue_handler() -> None:
        async for msgs in served.api.dequeue_stream(first, _requests(settlements),  # type: ignore[arg-type]
                                                    batch_default=100):
            events.extend(("frame", int(m.content)) for m in msgs)

    async def enqueue_handler() -> None:
        n = 0
        async for out in served.api.enqueue_frames(_requests(enq), cv.frame_from_pb):  # type: ignore[arg-type]
            assert not isinstance(out.result, DoqError), out
            events.append(("confirm", n))
            n += 1

    handlers = [asyncio.create_task(dequeue_handler()), asyncio.create_task(enqueue_handler())]
    try:
        # the consumer stream waits in its queue's long poll (and stays there: it has credits)
        await _until(lambda: served.api.long_polls.waiting("q") == 1, "the consumer stream to park")
        for i in range(count):
            enq.put_nowait(pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(queue_name="q", contents=[b"%d" % i])))
            await _until(lambda i=i: {("frame", i), ("confirm", i)} <= set(events),  # type: ignore[misc]
                         f"message {i} delivered and confirmed")
    finally:
        for t in handlers:
            t.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
    late = [i for i in range(count) if events.index(("frame", i)) > events.index(("confirm", i))]
    assert not late, f"confirmed before its frame was handed out: {late} ({events})"


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
    assert [m.content for m in await asyncio.wait_for(first, 60)] == [b"0", b"1"]
    assert [m.content for m in await asyncio.wait_for(anext(frames), 60)] == [b"2"]
    await asyncio.gather(*stored)
    await frames.aclose()

