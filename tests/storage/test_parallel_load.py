"""A start's load on two processes (`StateStore(parallel_load_min=...)`, the worker
`doq.storage.load_worker`): the same state as a load on one; a worker that fails in any
way leaves a load on one, logged once, the worker reaped; later rebuilds stay on one."""

from __future__ import annotations

import logging
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage import state as S
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.storage.test_rebuild_order import NOW, _fill, _seen


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process may run on two CPUs, whatever the machine running the tests has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of four queues (ties, random priorities, timestamps half due, fair groups
    as blocks), some messages in flight, some acked and not swept (gone)."""
    path = tmp_path_factory.mktemp("parallel") / "db"
    env = open_env(path, map_size=1 << 30)
    _fill(StateStore(env))
    env.close()
    return path


class _Watch:
    """The load workers started (and what they ended as) while the test runs."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.splits: list[bytes] = []
        init, close = S._LoadWorker.__init__, S._LoadWorker.close  # noqa: SLF001

        def watched_init(w: Any, *a: Any) -> None:
            init(w, *a)
            self.procs.append(w.proc)
            self.splits.append(w.split)

        def watched_close(w: Any) -> None:
            close(w)
            assert w.proc.returncode is not None  # reaped

        mp.setattr(S._LoadWorker, "__init__", watched_init)  # noqa: SLF001
        mp.setattr(S._LoadWorker, "close", watched_close)  # noqa: SLF001


def test_a_start_loads_on_two_processes_what_one_loads(filled: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Above the threshold a start's load runs a worker (reaped when done) and builds the
    state a load on one process builds; below it, and in a later rebuild, no worker."""
    env = open_env(filled, map_size=1 << 30)
    watch = _Watch(monkeypatch)
    one = _seen(StateStore(env))
    assert not watch.procs
    with caplog.at_level(logging.INFO, logger="doq.storage"):
        two = StateStore(env, parallel_load_min=1000)
    assert len(watch.procs) == 1 and watch.procs[0].returncode == 0
    assert "loaded on two processes" in caplog.text and "failed" not in caplog.text
    assert _seen(two) == one
    two.rebuild()  # a later rebuild (a failed write's): one process
    assert len(watch.procs) == 1 and _seen(two) == one
    StateStore(env, parallel_load_min=10**9)  # too few records
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert _seen(StateStore(env, parallel_load_min=1000)) == one  # one CPU
    assert len(watch.procs) == 1
    env.close()


@pytest.mark.parametrize("mode", ["exit", "garbage", "other transaction", "unfit columns", "hang"])
def test_a_failed_worker_leaves_a_load_on_one_process(filled: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture, mode: str) -> None:
    """A worker that exits with an error, answers garbage, answers for another read
    transaction, answers columns that fit no queue, or does not answer in time: the start
    loads alone (the state of a load on one process), logs it once, and the worker is
    killed if need be and reaped."""
    env = open_env(filled, map_size=1 << 30)
    one = _seen(StateStore(env))
    watch = _Watch(monkeypatch)
    monkeypatch.setattr(S._LoadWorker, "module", "tests.storage.fake_load_worker")  # noqa: SLF001
    monkeypatch.setenv("DOQ_FAKE_LOAD_WORKER", mode)
    if mode == "hang":
        monkeypatch.setattr(S, "LOAD_WORKER_STALL_S", 0.5)
    with caplog.at_level(logging.INFO, logger="doq.storage"):
        two = StateStore(env, parallel_load_min=1000)
    assert len(watch.procs) == 1 and watch.procs[0].returncode is not None
    if mode == "hang":
        assert watch.procs[0].returncode < 0  # killed
    assert caplog.text.count("loading on one CPU") == 1 and "loaded on two processes" not in caplog.text
    assert _seen(two) == one
    env.close()


def test_a_worker_that_cannot_start_leaves_a_load_on_one_process(filled: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """No interpreter to run the worker with: the start loads alone and logs it once."""
    env = open_env(filled, map_size=1 << 30)
    one = _seen(StateStore(env))
    monkeypatch.setattr(S.sys, "executable", str(filled / "no-such-python"))
    with caplog.at_level(logging.INFO, logger="doq.storage"):
        two = StateStore(env, parallel_load_min=1000)
    assert caplog.text.count("loading on one CPU") == 1 and "loaded on two processes" not in caplog.text
    assert _seen(two) == one
    env.close()


def test_a_worker_killed_in_its_read_transaction_leaves_no_reader_slot(filled: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that stops progressing inside its read transaction is killed; its reader
    slot is cleared (`reader_check`), else every page freed from then on stays unused."""
    env = open_env(filled, map_size=1 << 30)
    one = _seen(StateStore(env))
    watch = _Watch(monkeypatch)
    monkeypatch.setattr(S._LoadWorker, "module", "tests.storage.fake_load_worker")  # noqa: SLF001
    monkeypatch.setenv("DOQ_FAKE_LOAD_WORKER", "hang in its read transaction")
    monkeypatch.setattr(S, "LOAD_WORKER_STALL_S", 3.0)
    two = StateStore(env, parallel_load_min=1000)
    assert watch.procs[0].returncode is not None and watch.procs[0].returncode < 0  # killed
    assert env.reader_check() == 0  # no stale slot left to clear
    assert f"{watch.procs[0].pid}" not in env.readers().split()
    assert _seen(two) == one
    env.close()


def test_a_slow_worker_that_progresses_is_waited_for(filled: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A worker slower than the start, and than the stall time, but progressing: its
    answer is taken (no deadline from the start's own time)."""
    env = open_env(filled, map_size=1 << 30)
    one = _seen(StateStore(env))
    watch = _Watch(monkeypatch)
    monkeypatch.setattr(S._LoadWorker, "module", "tests.storage.fake_load_worker")  # noqa: SLF001
    monkeypatch.setenv("DOQ_FAKE_LOAD_WORKER", "slow")
    monkeypatch.setattr(S, "LOAD_WORKER_STALL_S", 5.0)
    with caplog.at_level(logging.INFO, logger="doq.storage"):
        two = StateStore(env, parallel_load_min=1000)
    assert watch.procs[0].returncode == 0
    assert "loaded on two processes" in caplog.text and "loading on one CPU" not in caplog.text
    assert _seen(two) == one
    env.close()


def test_an_error_of_the_starts_own_part_is_raised_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Messages of a queue whose record is gone, below the split: the load raises as a
    load on one process does, without a second load or a line blaming the worker."""
    env = open_env(tmp_path / "db", map_size=1 << 28)
    st = StateStore(env)
    with st.write() as txn:
        st.apply_entries(txn, [(1, encode_batch(c.CommandBatch(NOW, [
            *(c.CreateQueue(n, "delayed", QueueSettings()) for n in "az"),
            c.Enqueue("a", [c.EnqueueItem(b"x") for _ in range(10)]),
            c.Enqueue("z", [c.EnqueueItem(b"x") for _ in range(3000)])])))])
    with env.begin(write=True) as txn:
        qdb = env.open_db(b"state_queues", txn=txn)
        txn.delete(next(k for k, _ in txn.cursor(db=qdb) if k.endswith(b"a")), db=qdb)
    with pytest.raises(Exception) as serial:
        StateStore(env)
    watch = _Watch(monkeypatch)
    with caplog.at_level(logging.INFO, logger="doq.storage"), pytest.raises(type(serial.value)):
        StateStore(env, parallel_load_min=1000)
    assert len(watch.procs) == 1 and "loading on one CPU" not in caplog.text
    env.close()


def test_the_split_counts_a_sparse_queues_records_not_its_ids(tmp_path: Path) -> None:
    """Queue "a" holds two messages enqueued far apart (its ids span the whole history)
    and "z" thousands: the split falls inside "z" at about `SPLIT_AT` of the records."""
    env = open_env(tmp_path / "db", map_size=1 << 28)
    st = StateStore(env)
    cmds: list[c.Command] = [c.CreateQueue(n, "delayed", QueueSettings()) for n in "az"]
    cmds += [c.Enqueue("a", [c.EnqueueItem(b"x")]), c.Enqueue("z", [c.EnqueueItem(b"x") for _ in range(4000)]),
             c.Enqueue("a", [c.EnqueueItem(b"x")])]
    with st.write() as txn:
        st.apply_entries(txn, [(1, encode_batch(c.CommandBatch(NOW, cmds)))])
    with env.begin() as txn:
        split = S.split_key(txn, env.open_db(b"state_messages", txn=txn, create=False))
        keys = [bytes(k) for k in txn.cursor(db=env.open_db(b"state_messages", txn=txn, create=False)).iternext(values=False)]
    assert split is not None and split[:-8] == keys[-1][:-8]  # "z" sorts last
    below = sum(k < split for k in keys)
    assert abs(below - len(keys) * S.SPLIT_AT[0] // S.SPLIT_AT[1]) < len(keys) // 20
    env.close()


@pytest.mark.parametrize(("cpu_max", "cpus"), [("max 100000\n", 2), ("100000 100000\n", 1), ("150000 100000\n", 1),
                                               ("400000 100000\n", 2), (None, 2), ("garbage\n", 2)])
def test_a_cpu_quota_counts_as_fewer_cpus(tmp_path: Path, cpu_max: str | None, cpus: int) -> None:
    """A cgroup quota (`cpu.max`, a container's CPU limit) below two CPUs: one CPU, no worker."""
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    assert S.cpus_allowed(str(path)) == cpus


def test_a_start_with_many_ready_pairs_joins_the_pair_ranges_both_processes_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue of random priorities and one of timestamps (half due) split between the two
    processes, each part above `machine.RANGES_MIN`: each process distributes its part of
    the ready pairs into ranges (the worker before it answers), the start joins them
    (`PairList.from_ranges`: two parts for the split queue, the late timestamps cut off);
    the same state as a load on one process."""
    from doq.queues import machine as M
    from doq.queues.pairlist import PairList

    env = open_env(tmp_path / "db", map_size=1 << 30)
    st = StateStore(env)
    rnd = random.Random(7)
    with st.write() as txn:
        st.apply_entries(txn, [(1, encode_batch(c.CommandBatch(NOW, [
            c.CreateQueue(qn, "delayed", QueueSettings()) for qn in ("random", "stamps")])))])
    index = 1
    for qn, n in (("random", 20_000), ("stamps", 80_000)):
        for _ in range(0, n, 10_000):
            index += 1
            items = [c.EnqueueItem(b"x", priority=rnd.randrange(1_000_000_000) if qn == "random"
                                   else NOW // 1000 + rnd.randrange(-3600, 3600)) for _ in range(10_000)]
            with st.write() as txn:
                st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(NOW, [c.Enqueue(qn, items)])))])
    one = _seen(StateStore(env))
    joined: list[tuple[int, int | None]] = []
    from_ranges = PairList.from_ranges.__func__  # type: ignore[attr-defined]

    def spy(cls: type[PairList], parts: Any, split_a: int | None = None) -> Any:
        joined.append((len(parts), split_a))
        return from_ranges(cls, parts, split_a)

    monkeypatch.setattr(PairList, "from_ranges", classmethod(spy))
    watch = _Watch(monkeypatch)
    two = StateStore(env, parallel_load_min=1000)
    assert len(watch.procs) == 1 and _seen(two) == one
    assert M.RANGES_MIN <= 35_000 and sorted(joined, key=str) == [(1, None), (2, NOW // 1000)]


def test_the_work_beside_a_load_on_two_processes_runs_once_before_the_start_waits(
        filled: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`meanwhile` runs once a load on two processes has read its own part, before it
    reads the worker's answer; one that raises is logged and the load goes on (on two
    processes, the same state); a load on one process does not call it."""
    env = open_env(filled, map_size=1 << 30)
    one = _seen(StateStore(env))
    events: list[str] = []
    segments = S._LoadWorker.segments  # noqa: SLF001

    def watched(w: Any) -> Any:
        events.append("worker's answer")
        return segments(w)

    monkeypatch.setattr(S._LoadWorker, "segments", watched)  # noqa: SLF001
    two = StateStore(env, parallel_load_min=1000, meanwhile=lambda: events.append("meanwhile"))
    assert events == ["meanwhile", "worker's answer"] and _seen(two) == one

    def fails() -> None:
        events.append("failed")
        raise ImportError("no such module")

    events.clear()
    with caplog.at_level(logging.INFO, logger="doq.storage"):
        two = StateStore(env, parallel_load_min=1000, meanwhile=fails)
    assert events == ["failed", "worker's answer"] and _seen(two) == one
    assert "no such module" in caplog.text and "loaded on two processes" in caplog.text
    events.clear()
    StateStore(env, parallel_load_min=10**9, meanwhile=lambda: events.append("meanwhile"))  # too few: one process
    assert events == []
    env.close()
