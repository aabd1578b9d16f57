"""What a node holds for one stream is bounded by its `Limits`, and settlements of
messages the state knows to be gone never reach the log.

Real service over a temporary LMDB and a real grpc.aio server on 127.0.0.1 (in-process);
commits are stalled the way a stuck disk stalls them (another thread holds LMDB's write
lock) to hold proposals pending.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.errors import MessageNotFound
from doq.queues.commands import Ack, Command, EnqueueItem, Nack, Touch
from doq.queues.model import MessageView
from doq.service import convert as cv
from doq.service.sessions import DequeueSession, Settlement
from tests.support import inproc
from tests.support.inproc import Served, stalled_commits


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _spy(srv: Served, monkeypatch: pytest.MonkeyPatch) -> list[Command]:
    """The commands proposed to the node from now on (the node still proposes them; its
    `propose` goes through `propose_nowait`)."""
    seen: list[Command] = []
    propose_nowait = srv.api.node.propose_nowait

    def spy_nowait(cmd: Command) -> asyncio.Future[object]:
        seen.append(cmd)
        return propose_nowait(cmd)

    monkeypatch.setattr(srv.api.node, "propose_nowait", spy_nowait)
    return seen


async def _gone(srv: Served, n: int) -> list[MessageView]:
    """The deliveries of `n` messages that existed and were acked."""
    await srv.api.enqueue_many([("q", EnqueueItem(b"x"))] * n)
    msgs = await srv.api.dequeue("q", max_messages=n)
    assert await srv.api.ack_many("q", [m.id for m in msgs]) == [None] * n
    return list(msgs)


async def _gone_ids(srv: Served, n: int) -> list[int]:
    """Ids of `n` messages that existed and were acked."""
    return [m.id for m in await _gone(srv, n)]


async def _stream_status(srv: Served, *requests: pb.DequeueStreamRequest) -> tuple[grpc.StatusCode, str]:
    """Open a DequeueStream with `requests` (then keep it open) and read until it ends."""
    async def send() -> AsyncIterator[pb.DequeueStreamRequest]:
        for r in requests:
            yield r
        await asyncio.Event().wait()  # never half-closes

    call = srv.stub.DequeueStream(send())
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await asyncio.wait_for(call.read(), 20)  # the stream must end, with a status
    return ei.value.code(), dict(ei.value.trailing_metadata() or ())["doq-reason"]


# -- caps on the first request and on credits -----------------------------------------------
@pytest.mark.parametrize(("first", "reason"), [
    ({"prefetch": 100_001}, "INVALID_PREFETCH"),
    ({"prefetch": 2**32 - 1}, "INVALID_PREFETCH"),
    ({"max_batch": 10_001}, "INVALID_MAX_BATCH"),
    ({"max_batch": 2**32 - 1, "prefetch": 10}, "INVALID_MAX_BATCH"),
])
async def test_a_stream_asking_more_than_the_node_allows_is_refused(served: Served, first: dict[str, int],
                                                                   reason: str) -> None:
    await served.api.enqueue("q", EnqueueItem(b"x"))
    code, why = await _stream_status(served, pb.DequeueStreamRequest(queue_name="q", **first))
    assert (code, why) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert (await served.api.get_queue("q")).stats.ready == 1  # nothing was leased


async def test_credits_beyond_the_limit_end_the_stream(served: Served) -> None:
    code, why = await _stream_status(served, pb.DequeueStreamRequest(queue_name="q", prefetch=10),
                                     pb.DequeueStreamRequest(credits=100_000))
    assert (code, why) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CREDITS")


async def test_too_many_acks_in_one_request_end_the_stream(served: Served) -> None:
    code, why = await _stream_status(served, pb.DequeueStreamRequest(queue_name="q", prefetch=10),
                                     pb.DequeueStreamRequest(ack_ids=list(range(1, 10_002))))
    assert (code, why) == (grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE")


async def test_auto_credits_never_exceed_the_prefetch(served: Served) -> None:
    gone = await _gone_ids(served, 5)
    s = DequeueSession(served.api, cv.stream_open_from_pb(
        pb.DequeueStreamRequest(queue_name="q", prefetch=3, auto_credit=True)), 64)
    s.settle(Settlement(ack_ids=gone))  # 5 acks, none of a message this stream holds
    assert s.credits == 3


# -- settlements of messages known to be gone -----------------------------------------------
async def test_stream_acks_and_nacks_of_gone_messages_write_nothing(served: Served,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    delivered = await _gone(served, 3)
    gone = [m.id for m in delivered]
    live = await served.api.enqueue("q", EnqueueItem(b"live"))
    leased = await served.api.dequeue("q")
    assert [m.id for m in leased] == [live.id]
    seen = _spy(served, monkeypatch)
    s = DequeueSession(served.api, cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", prefetch=10)), 64)
    s.held.record([*delivered, *leased])  # as if this stream had delivered them (it settles only those)
    s.settle(Settlement(ack_ids=[*gone, live.id], nacks=[cv.settlement_from_pb(pb.DequeueStreamRequest(
        nacks=[pb.NackRequest(id=gone[0])])).nacks[0]]))
    await s.drain()
    assert seen == [Ack("q", [live.id], [leased[0].lease_id])]  # only the live message's ack was proposed
    assert s.dropped == 4
    assert (await served.api.get_queue("q")).stats.total == 0


async def test_stream_acks_of_ids_never_assigned_are_dropped_after_a_read_barrier(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(served, monkeypatch)
    barriers = 0
    read_barrier = served.api.node.read_barrier

    async def counted() -> None:
        nonlocal barriers
        barriers += 1
        await read_barrier()

    monkeypatch.setattr(served.api.node, "read_barrier", counted)
    s = DequeueSession(served.api, cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", prefetch=10)), 64)
    s.held.leases.update({10**12: 1, 10**12 + 1: 2})  # deliveries it holds (it settles only those)
    unborn = s.settle(Settlement(ack_ids=[10**12, 10**12 + 1]))
    assert unborn == [10**12, 10**12 + 1]
    await s.settle_unborn(unborn)
    await s.drain()
    assert (seen, s.dropped, barriers) == ([], 2, 1)


async def test_unary_settlements_of_gone_messages_are_answered_without_a_log_entry(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = await _gone_ids(served, 2)
    applied = served.api.node.applied_index
    seen = _spy(served, monkeypatch)
    for call in (served.api.ack("q", gone[0]), served.api.nack("q", gone[0]), served.api.touch("q", gone[1]),
                 served.api.ack("q", 10**12)):
        with pytest.raises(MessageNotFound):
            await call
    res = await served.api.ack_many("q", [gone[0], 10**12, gone[1]])
    assert [type(r) for r in res] == [MessageNotFound] * 3
    assert seen == [] and served.api.node.applied_index == applied
    # the errors are the machine's own: the same answer as if they had been proposed
    assert str(res[0]) == str(served.api.node.state.machine._ack(Ack("q", [gone[0]], []))[0])


async def test_settlements_of_messages_the_state_holds_are_proposed(served: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    await served.api.enqueue_many([("q", EnqueueItem(b"x"))] * 3)
    msgs = await served.api.dequeue("q", max_messages=3)
    seen = _spy(served, monkeypatch)
    await served.api.touch("q", msgs[0].id)
    await served.api.nack("q", msgs[1].id)
    await served.api.ack("q", msgs[2].id)
    assert [type(cmd) for cmd in seen] == [Touch, Nack, Ack]


# -- pending settlements: the reader stops -------------------------------------------------
async def test_a_stream_stops_reading_at_its_pending_acks_bound(served: Served,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bound = 10
    monkeypatch.setattr(served.api.door, "limits", dataclasses.replace(served.api.limits,
                                                                       max_stream_pending_acks=bound))
    await served.api.enqueue_many([("q", EnqueueItem(b"x"))] * 40)
    msgs = await served.api.dequeue("q", max_messages=40)
    read = 0

    async def requests() -> AsyncIterator[Settlement]:
        nonlocal read
        for i in range(0, 40, 4):  # 10 requests of 4 acks each
            read += 1
            yield Settlement(ack_ids=[m.id for m in msgs[i:i + 4]])

    s = DequeueSession(served.api, cv.stream_open_from_pb(pb.DequeueStreamRequest(queue_name="q", prefetch=10)), 64)
    s.held.record(msgs)  # as if this stream had delivered them (it settles only those)
    with stalled_commits(served.env):
        s.start(requests())
        await _until(lambda: s.pending >= bound, "the bound to be reached")
        await asyncio.sleep(0.2)  # the reader would read on here if it did not stop
        assert (read, s.pending) == (3, 12)  # 3 requests read: 12 pending, nothing more
    await _until(lambda: s.half_closed.is_set(), "the reader to read every request")
    await s.drain()
    assert read == 10
    assert (await served.api.get_queue("q")).stats.total == 0
    await s.close()


async def test_a_producer_stream_naming_ever_new_queues_remembers_a_bounded_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The names a producer stream remembers as admitted (so the door checks each once,
    not per message) are at most `stream_admitted_queues`, however many it names; every
    request is still admitted and answered (real gRPC on 127.0.0.1)."""
    from doq.service import api as api_mod
    from doq.service.door import AdmittedQueues
    from doq.service.limits import Limits

    caches: list[AdmittedQueues] = []
    peak = [0]

    class Counted(AdmittedQueues):
        __slots__ = ()

        def __init__(self, capacity: int) -> None:
            super().__init__(capacity)
            caches.append(self)

        def remember(self, queue: str) -> None:
            super().remember(queue)
            peak[0] = max(peak[0], len(self))

    monkeypatch.setattr(api_mod, "AdmittedQueues", Counted)
    cap, names = 16, 600
    async with inproc.local_service(tmp_path, Limits(stream_admitted_queues=cap)) as api, \
            inproc.grpc_stub(api) as stub:
        await api.create_queue("q")
        admits: list[str | None] = []
        api.door.add_check(lambda caller, action, queue: admits.append(queue))  # sees every admission

        async def requests() -> AsyncIterator[pb.EnqueueRequest]:
            for i in range(names):
                yield pb.EnqueueRequest(queue_name=f"gone-{i}", content=b"x")  # no such queue
                yield pb.EnqueueRequest(queue_name="q", content=b"%d" % i)

        got = [r async for r in stub.EnqueueStream(requests())]
    assert len(got) == 2 * names
    assert all(r.error.reason == "QUEUE_NOT_FOUND" for r in got[0::2])
    assert all(r.success for r in got[1::2])
    assert len(caches) == 1 and peak[0] == cap and len(caches[0]) <= cap  # bounded, however many names
    assert admits.count("q") > 1  # evicted with the others, then simply admitted again
    assert {f"gone-{i}" for i in range(names)} <= set(admits)  # every name still passed the door
