"""`LazyFuture` behaves as `concurrent.futures.Future` for every use a caller makes of it
(results, exceptions, timeouts, callbacks, cancel, wait/as_completed, cross-thread)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from doq_client._future import LazyFuture


def test_resolved_before_anyone_looks() -> None:
    f = LazyFuture()
    assert not f.done() and not f.cancelled()
    f.set_result(7)
    assert f.done() and f.result() == 7 and f.exception() is None
    assert "_condition" not in f.__dict__  # nobody waited: no condition was made
    calls: list[object] = []
    f.add_done_callback(calls.append)  # on a done future: called at once
    assert calls == [f]
    with pytest.raises(cf.InvalidStateError):
        f.set_result(8)


def test_exception_and_timeout() -> None:
    f = LazyFuture()
    with pytest.raises(cf.TimeoutError):
        f.result(timeout=0.01)
    err = ValueError("boom")
    f.set_exception(err)
    assert f.exception() is err
    with pytest.raises(ValueError):
        f.result()
    with pytest.raises(cf.InvalidStateError):
        f.set_exception(err)


def test_callbacks_registered_before_run_once() -> None:
    f = LazyFuture()
    calls: list[object] = []
    f.add_done_callback(calls.append)
    f.set_result(1)
    assert calls == [f]


def test_cancel() -> None:
    f = LazyFuture()
    assert f.cancel() and f.cancelled() and f.done()
    with pytest.raises(cf.CancelledError):
        f.result()


def test_wait_and_as_completed() -> None:
    fs = [LazyFuture() for _ in range(5)]
    fs[0].set_result(0)
    done, pending = cf.wait(fs, timeout=0)
    assert done == {fs[0]} and len(pending) == 4

    def resolve() -> None:
        for i, f in enumerate(fs[1:], 1):
            f.set_result(i)

    t = threading.Thread(target=resolve)
    t.start()
    assert sorted(f.result() for f in cf.as_completed(fs, timeout=30)) == [0, 1, 2, 3, 4]
    t.join()


def test_a_waiter_is_always_woken_across_threads() -> None:
    """Many rounds of one thread waiting while another resolves: none is missed (a lost
    wakeup would hang `result` and fail by its timeout)."""
    for _ in range(2000):
        f = LazyFuture()
        t = threading.Thread(target=f.set_result, args=(1,))
        t.start()
        assert f.result(timeout=30) == 1
        t.join()
