"""`DequeueSession`, one state at a time, over the real service and a temporary LMDB; and
the stream rules it implements, over real gRPC on 127.0.0.1 (in-process server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.errors import InvalidArgument, MessageNotFound, QueueNotFound
from doq.queues.commands import Command, Dequeue, Enqueue, EnqueueItem
from doq.queues.model import MessageState
from doq.service import convert as cv
from doq.service.sessions import DequeueSession, Settlement
from tests.support import inproc
from tests.support.inproc import Served, stalled_commits


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def _enqueue(srv: Served, n: int) -> list[int]:
    res = await srv.api.enqueue_many([("q", EnqueueItem(b"%d" % i)) for i in range(n)])
    return [r.id for r in res]  # type: ignore[union-attr]


def _session(srv: Served, **first: object) -> DequeueSession:
    opened = cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", **first))  # type: ignore[arg-type]
    return DequeueSession(srv.api, opened, 64)


def _req(**fields: object) -> Settlement:
    """A later request of the stream, as the gRPC adapter hands it to the session."""
    return cv.settlement_from_pb(pb.DequeueStreamRequest(**fields))  # type: ignore[arg-type]


def _spy_dequeues(srv: Served, monkeypatch: pytest.MonkeyPatch) -> list[Dequeue]:
    """Record the Dequeue commands proposed to the node (which still proposes them)."""
    seen: list[Dequeue] = []
    propose_nowait = srv.api.node.propose_nowait

    def spy(cmd: Command) -> asyncio.Future[object]:
        if isinstance(cmd, Dequeue):
            seen.append(cmd)
        return propose_nowait(cmd)

    monkeypatch.setattr(srv.api.node, "propose_nowait", spy)
    return seen


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- settle -------------------------------------------------------------------------------
async def test_settle_proposes_acks_and_nacks_and_returns_credits(served: Served) -> None:
    ids = await _enqueue(served, 3)
    msgs = await served.api.dequeue("q", max_messages=3)
    s = _session(served, prefetch=3, auto_credit=True)
    s.held.record(msgs)  # as if this stream had delivered them (it settles only those)
    s.credits = 0
    s.settle(_req(
        ack_ids=[msgs[0].id], ack_lease_ids=[msgs[0].lease_id],
        nacks=[pb.NackRequest(id=msgs[1].id, lease_id=msgs[1].lease_id, release=True),
               pb.NackRequest(id=msgs[2].id, lease_id=msgs[2].lease_id, delay_ms=60_000)],
        credits=2,
    ))
    assert s.credits == 3 + 2 and s.wake.is_set()  # one per ack/nack (auto_credit) + explicit
    await s.drain()
    state = served.api.node.state
    with pytest.raises(MessageNotFound):
        state.get_message("q", ids[0])
    released, nacked = state.get_message("q", ids[1]), state.get_message("q", ids[2])
    assert (released.state, released.attempts) == (MessageState.READY, 0)
    assert (nacked.state, nacked.attempts) == (MessageState.DELAYED, 1)


async def test_acks_received_are_applied_when_the_call_is_cancelled_while_they_wait(served: Served) -> None:
    """The client gives up waiting for the end of the stream (cancels the call) while acks
    it sent wait for the commit in progress: they are still applied (cancelling `drain`
    must not cancel them: the node drops a proposal whose future is cancelled)."""
    await _enqueue(served, 2)
    msgs = await served.api.dequeue("q", max_messages=2)
    s = _session(served, prefetch=2, auto_credit=True)
    s.held.record(msgs)  # as if this stream had delivered them (it settles only those)
    with stalled_commits(served.env):
        blocker = served.api.enqueue_nowait("q", EnqueueItem(b"x"))  # a commit in progress, stuck
        await _until(lambda: not served.api.node._pending, "the blocking enqueue to be taken")  # type: ignore[attr-defined]
        s.settle(_req(ack_ids=[m.id for m in msgs], ack_lease_ids=[m.lease_id for m in msgs]))
        drain = asyncio.ensure_future(s.drain())
        await asyncio.sleep(0)
        drain.cancel()  # the call ends (cancelled by the client) while the acks wait
        with pytest.raises(asyncio.CancelledError):
            await drain
    await asyncio.wait_for(blocker, 60)
    state = served.api.node.state
    await _until(lambda: state.get_queue("q").stats.in_flight == 0, "the acks to be applied")
    for m in msgs:
        with pytest.raises(MessageNotFound):
            state.get_message("q", m.id)


async def test_settle_refuses_mismatched_lease_ids_before_proposing(served: Served) -> None:
    await _enqueue(served, 2)
    msgs = await served.api.dequeue("q", max_messages=2)
    s = _session(served, prefetch=2, auto_credit=True)
    for bad in (_req(ack_ids=[m.id for m in msgs], ack_lease_ids=[msgs[0].lease_id]),
                _req(ack_lease_ids=[msgs[0].lease_id])):
        with pytest.raises(InvalidArgument) as ei:
            s.settle(bad)
        assert ei.value.reason == "INVALID_LEASE_IDS"
    assert not s.settles and s.credits == 2
    assert (await served.api.get_queue("q")).stats.in_flight == 2  # nothing was acked


# -- pump ---------------------------------------------------------------------------------
async def test_pump_respects_credits_then_waits(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    dequeues = _spy_dequeues(served, monkeypatch)
    await _enqueue(served, 5)
    s = _session(served, prefetch=2, max_batch=10)
    frames = s.pump()
    first = await anext(frames)
    assert len(first) == 2 and s.credits == 0 and [d.max_messages for d in dequeues] == [2]
    waiting = asyncio.ensure_future(anext(frames))
    s.wake.set()
    await _until(lambda: not s.wake.is_set(), "the pump to wait for credits")
    assert not waiting.done() and len(dequeues) == 1  # no dequeue without credits
    s.add_credits(1)
    assert len(await asyncio.wait_for(waiting, 60)) == 1
    assert [d.max_messages for d in dequeues] == [2, 1]
    await frames.aclose()


async def test_pump_releases_what_it_dequeued_after_the_half_close(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dequeue still committing when the client half-closes: its messages are released
    by the server (attempt not counted, ready at once), not sent."""
    ids = await _enqueue(served, 3)
    dequeues = _spy_dequeues(served, monkeypatch)
    s = _session(served, prefetch=3)
    frames = s.pump()
    with stalled_commits(served.env):
        pending = asyncio.ensure_future(anext(frames))
        await _until(lambda: len(dequeues) == 1, "the dequeue to be proposed")
        s.half_closed.set()  # the client half-closes while the dequeue waits for its commit
        s.wake.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 60)
    await s.drain()
    views = [served.api.node.state.get_message("q", i) for i in ids]
    assert [(v.state, v.attempts) for v in views] == [(MessageState.READY, 0)] * 3


async def test_pump_with_prefetch_0_pushes_without_credits(served: Served) -> None:
    """prefetch 0 = no limit (push mode): frames come without any credit returned."""
    await _enqueue(served, 5)
    s = _session(served, prefetch=0, max_batch=2)
    frames = s.pump()
    got = [len(await anext(frames)) for _ in range(3)]
    assert got == [2, 2, 1] and s.credits == 0
    await frames.aclose()


async def test_pump_proposes_dequeues_up_to_its_credits_while_one_commits(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease mode with prefetch and a deliverable backlog: the session proposes as many
    dequeues as its credits allow (no more than the queue can deliver), without waiting
    for the first to commit, so the next commit carries them; frames follow in their order."""
    ids = await _enqueue(served, 25)
    dequeues = _spy_dequeues(served, monkeypatch)
    s = _session(served, prefetch=40, max_batch=10)
    frames = s.pump()
    with stalled_commits(served.env):
        first = asyncio.ensure_future(anext(frames))
        await _until(lambda: len(dequeues) > 0, "the first dequeue")
        # 25 deliverable: three dequeues of 10 (the third may come back short), not a fourth
        assert [d.max_messages for d in dequeues] == [10, 10, 10]
    got = [await asyncio.wait_for(first, 60)]
    got += [await asyncio.wait_for(anext(frames), 60) for _ in range(2)]
    assert [[m.id for m in f] for f in got] == [ids[:10], ids[10:20], ids[20:]]
    assert [m.lease_id for f in got for m in f] == sorted({m.lease_id for f in got for m in f})
    assert s.credits == 15
    await frames.aclose()


async def test_pump_without_prefetch_proposes_one_dequeue_at_a_time(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prefetch 0 (push mode, no credits to bound it): one dequeue of its own in flight."""
    await _enqueue(served, 5)
    dequeues = _spy_dequeues(served, monkeypatch)
    s = _session(served, prefetch=0, max_batch=2)
    frames = s.pump()
    with stalled_commits(served.env):
        first = asyncio.ensure_future(anext(frames))
        await _until(lambda: len(dequeues) > 0, "the first dequeue")
        assert [d.max_messages for d in dequeues] == [2]
    assert len(await asyncio.wait_for(first, 60)) == 2
    await frames.aclose()


def _spy_proposals(srv: Served, monkeypatch: pytest.MonkeyPatch) -> list[type]:
    """Record the type of every command proposed to the node from now on."""
    proposed: list[type] = []
    propose_nowait = srv.api.node.propose_nowait

    def spy(cmd: Command) -> asyncio.Future[object]:
        proposed.append(type(cmd))
        return propose_nowait(cmd)

    monkeypatch.setattr(srv.api.node, "propose_nowait", spy)
    return proposed


async def test_pump_is_parked_for_the_next_frame_while_a_frame_is_being_sent(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease mode: once a frame is handed out (and until it is taken: while it is sent),
    the session already waits in the long poll, so the next enqueue leases for it in the
    enqueue's own log entry (an early dequeue), not in a second commit."""
    s = _session(served, prefetch=10, max_batch=10)
    frames = s.pump()
    first = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the first long poll")
    await _enqueue(served, 1)
    assert [m.content for m in await asyncio.wait_for(first, 60)] == [b"0"]
    # the first frame is not taken yet (being sent): the session waits for the next one
    assert served.api.long_polls.waiting("q") == 1
    proposed = _spy_proposals(served, monkeypatch)
    served.api.enqueue_nowait("q", EnqueueItem(b"1"))  # proposes the session's dequeue with it
    assert proposed == [Enqueue, Dequeue]
    assert [m.content for m in await asyncio.wait_for(anext(frames), 60)] == [b"1"]
    assert proposed == [Enqueue, Dequeue]  # no second dequeue
    await frames.aclose()


async def test_pump_stays_parked_while_its_dequeues_commit(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enqueues arriving while the session's earlier dequeues are still committing each
    lease for it in their own entry (as long as credits last); frames come in log order,
    the results of dequeues committed together in one frame."""
    s = _session(served, prefetch=2, max_batch=10)
    frames = s.pump()
    first = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the long poll")
    proposed = _spy_proposals(served, monkeypatch)
    with stalled_commits(served.env):
        stored = [served.api.enqueue_nowait("q", EnqueueItem(b"%d" % i)) for i in range(3)]
        # credits 2: the first two enqueues lease for the session, the third does not
        assert proposed == [Enqueue, Dequeue, Enqueue, Dequeue, Enqueue]
        assert served.api.long_polls.waiting("q") == 0  # no room left: out of the FIFO
    assert [m.content for m in await asyncio.wait_for(first, 60)] == [b"0", b"1"]  # one commit
    await asyncio.gather(*stored)
    assert (await served.api.get_queue("q")).stats.ready == 1  # the third waits for a credit
    s.add_credits(1)
    assert [m.content for m in await asyncio.wait_for(anext(frames), 60)] == [b"2"]
    await frames.aclose()


async def test_parked_sessions_take_turns(served: Served) -> None:
    """Two leasing sessions waiting on one queue: arrivals alternate between them (FIFO)."""
    a, b = _session(served, prefetch=10), _session(served, prefetch=10)
    fa, fb = a.pump(), b.pump()
    got_a, got_b = asyncio.ensure_future(anext(fa)), asyncio.ensure_future(anext(fb))
    await _until(lambda: served.api.long_polls.waiting("q") == 2, "both long polls")
    for i in range(2):
        await asyncio.gather(served.api.enqueue_nowait("q", EnqueueItem(b"%d" % i)))
    assert [m.content for m in await asyncio.wait_for(got_a, 60)] == [b"0"]
    assert [m.content for m in await asyncio.wait_for(got_b, 60)] == [b"1"]
    await fa.aclose()
    await fb.aclose()


async def test_a_parked_session_takes_what_a_commit_makes_deliverable(served: Served) -> None:
    """Not only enqueues: a message that becomes deliverable otherwise (here released by
    another consumer) wakes the parked session, which dequeues it itself."""
    ids = await _enqueue(served, 1)
    other = await served.api.dequeue("q")  # leased elsewhere: nothing deliverable now
    s = _session(served, prefetch=10)
    frames = s.pump()
    got = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the long poll")
    await served.api.nack("q", ids[0], lease_id=other[0].lease_id, release=True)
    assert [m.id for m in await asyncio.wait_for(got, 60)] == ids
    await frames.aclose()


async def test_a_parked_session_sees_its_queue_deleted(served: Served) -> None:
    s = _session(served, prefetch=10)
    frames = s.pump()
    got = asyncio.ensure_future(anext(frames))
    await _until(lambda: served.api.long_polls.waiting("q") == 1, "the long poll")
    await served.api.delete_queue("q")
    with pytest.raises(QueueNotFound):
        await asyncio.wait_for(got, 60)
    assert served.api.long_polls.waiting() == 0


async def test_pump_closed_early_releases_what_its_next_dequeue_leased(served: Served) -> None:
    """The frames stop being taken (the call ends) while a dequeue for the session is
    committing: it ends, and what it leased is released (ready at once, attempt not counted)."""
    await _enqueue(served, 1)
    s = _session(served, prefetch=10, max_batch=1)
    frames = s.pump()
    first = await asyncio.wait_for(anext(frames), 60)  # the session waits for more meanwhile
    ids = await _enqueue(served, 1)
    await _until(lambda: served.api.node.state.get_message("q", ids[0]).state == MessageState.IN_FLIGHT,
                 "the message to be leased for the session")
    await frames.aclose()
    await s.drain()
    view = served.api.node.state.get_message("q", ids[0])
    assert (view.state, view.attempts) == (MessageState.READY, 0)
    assert len(first) == 1 and served.api.long_polls.waiting() == 0


# -- the rules over gRPC --------------------------------------------------------------------
async def test_stream_refuses_mismatched_ack_lease_ids(served: Served) -> None:
    await _enqueue(served, 2)
    requests: asyncio.Queue[pb.DequeueStreamRequest] = asyncio.Queue()
    requests.put_nowait(pb.DequeueStreamRequest(queue_name="q", prefetch=2, auto_credit=True))

    async def send() -> AsyncIterator[pb.DequeueStreamRequest]:
        while True:
            yield await requests.get()

    call = served.stub.DequeueStream(send())
    got = [await call.read(), await call.read()]
    requests.put_nowait(pb.DequeueStreamRequest(ack_ids=[m.id for m in got], ack_lease_ids=[got[0].lease_id]))
    async def read_to_the_end() -> None:
        while True:
            await call.read()

    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await asyncio.wait_for(read_to_the_end(), 60)  # the stream must end, with that status
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(ei.value.trailing_metadata() or ())["doq-reason"] == "INVALID_LEASE_IDS"
    assert (await served.api.get_queue("q")).stats.in_flight == 2  # nothing was acked


async def test_ack_batch_lease_ids(served: Served) -> None:
    await _enqueue(served, 3)
    msgs = await served.api.dequeue("q", max_messages=3)
    ids = [m.id for m in msgs]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await served.stub.AckBatch(pb.AckBatchRequest(queue_name="q", ids=ids, lease_ids=[msgs[0].lease_id]))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(ei.value.trailing_metadata() or ())["doq-reason"] == "INVALID_LEASE_IDS"
    assert (await served.api.get_queue("q")).stats.in_flight == 3
    with pytest.raises(grpc.aio.AioRpcError) as ei:  # 0 ("any lease"): refused, nothing acked
        await served.stub.AckBatch(pb.AckBatchRequest(queue_name="q", ids=ids, lease_ids=[msgs[0].lease_id, 1, 0]))
    assert dict(ei.value.trailing_metadata() or ())["doq-reason"] == "LEASE_REQUIRED"
    lease_ids = [msgs[0].lease_id, msgs[1].lease_id + 1000, msgs[2].lease_id]  # current, stale, current
    res = (await served.stub.AckBatch(pb.AckBatchRequest(queue_name="q", ids=ids, lease_ids=lease_ids))).results
    assert [r.success for r in res] == [True, False, True]
    assert res[1].error.reason == "STALE_LEASE"
