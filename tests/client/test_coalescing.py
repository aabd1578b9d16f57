"""The coalescing producer and the ack-coalescing consumer against a real `doq serve`:
every future resolves exactly once, in submission order, with its own outcome (errors per
message); frames really carry many messages; close flushes; a lone message is sent at
once; coalesced acks settle (also when the application stops iterating). No timings."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from doq_client import AsyncDoqClient, DoqClient, QueueNotFound, TooLarge
from doq_client import _ledger as ledger_mod
from doq_client import _producer_core as producer_core
from doq_client import consumer as consumer_mod
from doq_client._producer_core import FEW_IN_FLIGHT, FRAMES_IN_FLIGHT
from doq_client.consumer import Consumer
from doq_client.producer import Producer
from tests.support.proc import NodeProc

BIG = b"x" * (2 << 20)  # above the node's 1 MiB message limit


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_every_future_resolves_once_in_order_with_its_own_outcome(
    client: DoqClient, queue: str, frames: list[int]
) -> None:
    n = 3000
    calls = [0] * n
    lock = threading.Lock()

    def counter(i: int) -> Callable[[object], None]:
        def done(_: object) -> None:
            with lock:
                calls[i] += 1
        return done

    bad = {7, 1500, 2999}  # too large: fail alone
    lost = {100, 2000}  # a queue that does not exist: fail alone (their own frames)
    with client.producer(window=1000) as p:
        futs = []
        for i in range(n):
            if i in bad:
                f = p.enqueue(queue, BIG)
            elif i in lost:
                f = p.enqueue("no-such-queue", b"lost")
            else:
                f = p.enqueue(queue, b"m%d" % i)
            f.add_done_callback(counter(i))
            futs.append(f)
    assert all(f.done() for f in futs)  # close flushed
    _until(lambda: calls == [1] * n, "every callback")
    ids = []
    for i, f in enumerate(futs):
        if i in bad:
            assert isinstance(f.exception(), TooLarge)
        elif i in lost:
            assert isinstance(f.exception(), QueueNotFound)
        else:
            ids.append(f.result().id)
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == n - len(bad) - len(lost)
    assert max(frames) > 1  # coalesced: frames carry many messages
    got = client.dequeue(queue, max_messages=n, ack=True)
    assert [m.content for m in got] == [b"m%d" % i for i in range(n) if i not in bad | lost]


async def test_async_producer_coalesces_and_keeps_order(node: NodeProc, frames: list[int]) -> None:
    async with AsyncDoqClient(node.grpc_addr, timeout_s=20) as c:
        await c.create_queue("async-coalesce")
        async with c.producer(window=500) as p:
            futs = [await p.enqueue("async-coalesce", b"%d" % i) for i in range(2000)]
            big = await p.enqueue("async-coalesce", BIG)
            last = await p.enqueue("async-coalesce", b"last")
        ids = [(await f).id for f in futs]
        assert ids == sorted(ids) and len(set(ids)) == 2000
        assert isinstance(big.exception(), TooLarge) and (await last).id > ids[-1]
        assert max(frames) > 1 and sum(frames) == 2002


def test_prebuilt_requests_and_enqueue_many_coalesce_too(client: DoqClient, queue: str, frames: list[int]) -> None:
    from doq_client import enqueue_request

    with client.producer() as p:
        one = p.send(enqueue_request(queue, b"a", priority=3))
        many = p.enqueue_many([enqueue_request(queue, b"b", group="g"), enqueue_request(queue, b"c")])
        r1, rs = one.result(), many.result()
    assert r1.priority == 3 and [r.group for r in rs] == ["g", ""]  # type: ignore[union-attr]
    assert frames and sum(frames) == 3


def test_a_lone_message_is_sent_at_once_and_waits_only_while_frames_are_unanswered(node: NodeProc) -> None:
    p = Producer.__new__(Producer)
    producer_core.ProducerCore.__init__(p, 1000, None, True, 1 << 20)
    p._outbox.append(p._message("q", b"x", "", 0, None, "", 0))
    p._queued = 1
    assert p._sendable()  # nothing unanswered: no waiting for a frame to fill
    for _ in range(FRAMES_IN_FLIGHT):
        p._ledger.sent([], ledger_mod.Frame(1, True, None))
    assert p._sendable()  # the frames in flight carry few messages: a low rate, no waiting
    p._ledger.sent([], ledger_mod.Frame(FEW_IN_FLIGHT, True, None))
    assert not p._sendable()  # the pipe is full: gather until an answer or a full batch
    p._queued = p.batch
    assert p._sendable()
    q = Producer.__new__(Producer)
    producer_core.ProducerCore.__init__(q, 1000, 0, True, 1 << 20)  # batch=0: one message per frame
    for _ in range(FRAMES_IN_FLIGHT):
        q._ledger.sent([], None)
    q._outbox.append(q._message("q", b"x", "", 0, None, "", 0))
    assert q._sendable()


def test_one_message_per_frame_on_request(client: DoqClient, queue: str, frames: list[int]) -> None:
    with client.producer(batch=0) as p:
        futs = [p.enqueue(queue, b"%d" % i) for i in range(50)]
    ids = [f.result().id for f in futs]
    assert ids == sorted(ids) and not frames  # EnqueueStream, no column frames


def _stats(client: DoqClient, queue: str) -> tuple[int, int]:
    st = client.get_queue(queue).stats
    return st.ready, st.in_flight


def test_coalesced_acks_settle(client: DoqClient, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    real = Consumer._took

    def spy(self: Consumer) -> object:
        req = real(self)
        sent.append(len(req.ack_ids))
        return req

    monkeypatch.setattr(Consumer, "_took", spy)
    n = 2000
    with client.producer() as p:
        for f in [p.enqueue(queue, b"%d" % i) for i in range(n)]:
            f.result()
    got = 0
    with client.consumer(queue, prefetch=1000) as cons:
        for m in cons:
            cons.ack(m)
            got += 1
            if got == n:
                break
        _until(lambda: _stats(client, queue) == (0, 0), "every ack applied")
    assert sum(sent) == n and len(sent) < n // 10  # many acks per request frame


def test_a_few_acks_go_out_without_more_iteration(client: DoqClient, queue: str) -> None:
    """Below the batch threshold and with the application not waiting for messages, the
    interval alone sends the acks (their credits and their settlement)."""
    with client.producer() as p:
        for f in [p.enqueue(queue, b"%d" % i) for i in range(3)]:
            f.result()
    with client.consumer(queue, prefetch=1000) as cons:
        held = [cons.next() for _ in range(3)]
        _until(lambda: _stats(client, queue) == (0, 3), "three leased")
        for m in held:
            assert m is not None
            cons.ack(m)  # 3 < prefetch // 4, and no next(): only the interval sends them
        _until(lambda: _stats(client, queue) == (0, 0), "the acks applied")


def _ack_frames(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of acks in each request frame the sync consumers send."""
    sent: list[int] = []
    real = Consumer._took

    def spy(self: Consumer) -> object:
        req = real(self)
        sent.append(len(req.ack_ids))
        return req

    monkeypatch.setattr(Consumer, "_took", spy)
    return sent


def test_acks_wait_for_their_interval_while_the_server_has_credits(
    client: DoqClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer that acks each message and then waits for the next one does not send a
    frame per ack while the server still has most of its credits (messages arriving one
    at a time would cost a request frame and a commit participant each)."""
    monkeypatch.setattr(consumer_mod, "ACK_INTERVAL_S", 3600.0)  # only the other rules send
    sent = _ack_frames(monkeypatch)
    with client.consumer(queue, prefetch=1000) as cons:
        for i in range(3):
            client.enqueue(queue, b"%d" % i)
            m = cons.next()  # waits for the message (each time: about to wait)
            assert m is not None and m.content == b"%d" % i
            cons.ack(m)
        assert sum(sent) == 0  # three acks held: 3 of 1000 credits out, below the batch
        assert _stats(client, queue) == (0, 3)


def test_acks_go_out_before_waiting_when_the_server_is_short_of_credits(
    client: DoqClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half or more of `prefetch` received and not settled: acks held back (below the
    batch threshold) go out as soon as the consumer waits, so the server goes on sending."""
    monkeypatch.setattr(consumer_mod, "ACK_INTERVAL_S", 3600.0)  # only the other rules send
    sent = _ack_frames(monkeypatch)
    with client.producer() as p:
        for f in [p.enqueue(queue, b"%d" % i) for i in range(30)]:
            f.result()
    with client.consumer(queue, prefetch=20) as cons:  # batch threshold: 5 acks
        held = [cons.next() for _ in range(20)]  # every credit used
        for m in held[:4]:
            assert m is not None
            cons.ack(m)  # 4 < 5: not a batch
        assert sum(sent) == 0
        got = []
        thread = threading.Thread(target=lambda: got.append(cons.next()), daemon=True)
        thread.start()  # waits: the 4 acks go out, their credits bring message 20
        thread.join(30)
        assert [m.content for m in got if m is not None] == [b"20"]
        assert sum(sent) == 4


async def test_async_consumer_acks_settle(node: NodeProc) -> None:
    async with AsyncDoqClient(node.grpc_addr, timeout_s=20) as c:
        await c.create_queue("async-acks")
        async with c.producer() as p:
            futs = [await p.enqueue("async-acks", b"%d" % i) for i in range(500)]
        await asyncio.gather(*futs)
        async with c.consumer("async-acks", prefetch=1000) as cons:
            held = [await cons.next() for _ in range(5)]
            for m in held:
                assert m is not None
                cons.ack(m)
            deadline = time.monotonic() + 30
            while (await c.get_queue("async-acks")).stats.in_flight != 495:
                assert time.monotonic() < deadline, "the acks were not sent"
                await asyncio.sleep(0.005)
