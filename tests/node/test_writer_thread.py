"""`WriterThread`: one real thread, jobs in order, results and errors handed back to the
event loop; `run_in_executor` through it; shutdown lets earlier jobs finish."""

from __future__ import annotations

import asyncio
import threading

import pytest

from doq.node.writer import WriterThread


async def test_jobs_run_in_order_on_one_thread_and_answer_on_the_loop() -> None:
    w = WriterThread("test-writer")
    ran: list[tuple[int, str]] = []

    def job(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        return i * 10

    loop = asyncio.get_running_loop()
    futs = [w.call(job, i) if i % 2 else loop.run_in_executor(w, job, i) for i in range(50)]
    assert await asyncio.gather(*futs) == [i * 10 for i in range(50)]
    assert ran == [(i, "test-writer") for i in range(50)]
    w.shutdown()


async def test_an_error_reaches_its_caller_and_the_thread_goes_on() -> None:
    w = WriterThread("test-writer")

    def boom(_: object) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await w.call(boom, None)
    assert await w.call(len, "abc") == 3
    w.shutdown()


async def test_a_cancelled_call_still_runs_and_later_jobs_follow() -> None:
    w = WriterThread("test-writer")
    gate, ran = threading.Event(), []
    first = w.call(lambda _: gate.wait(30), None)
    cancelled = w.call(ran.append, "cancelled")
    cancelled.cancel()
    after = w.call(ran.append, "after")
    gate.set()
    await after
    assert await first is True and ran == ["cancelled", "after"]
    w.shutdown()


async def test_shutdown_finishes_earlier_jobs_then_refuses() -> None:
    w = WriterThread("test-writer")
    gate, ran = threading.Event(), []
    w.call(lambda _: gate.wait(30), None)
    w.call(ran.append, 1)
    stopper = threading.Thread(target=w.shutdown)
    stopper.start()
    gate.set()
    stopper.join(30)
    assert not stopper.is_alive() and ran == [1]
    with pytest.raises(RuntimeError):
        w.call(ran.append, 2)
