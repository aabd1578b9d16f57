"""A store reopened on LMDB rebuilds every queue's order exactly (the rebuild's fast paths:
records read as columns, overridden records found by bisecting, timestamp records told due
as columns, the packed-key float sort by merged runs): ties on priority, equal timestamps,
in-flight, not-before and acked-but-not-swept records, fair groups filled as blocks."""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest

from doq.queues import commands as c
from doq.queues import machine as M
from doq.queues import pairlist
from doq.queues.codec import encode_batch
from doq.queues.model import MessageState, QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore

NOW = 1_800_000_000_000
N = 3000


def _seen(st: StateStore) -> list[object]:
    m = st.machine
    return [(qn, m.queue_info(qn).stats,
             [m.peek_ids(qn, s, 0, 10 * N) for s in (MessageState.READY, MessageState.DELAYED, MessageState.IN_FLIGHT)])
            for qn in sorted(m.queues)] + [m.next_due_ms(), [k >> 32 for k in m.leases]]  # (lease end, id): qnum is a handle


def _fill(st: StateStore) -> None:
    rnd = random.Random(5)
    index = 0

    def apply(*cmds: c.Command, now: int = NOW) -> None:
        nonlocal index
        index += 1
        with st.write() as txn:
            st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(now, list(cmds))))])

    apply(*(c.CreateQueue(qn, "fair" if qn == "fair" else "delayed", QueueSettings())
            for qn in ("ties", "random", "stamps", "fair")))
    for start in range(0, N, 500):
        apply(c.Enqueue("ties", [c.EnqueueItem(b"x", priority=rnd.randrange(-3, 4),
                                               delay_ms=1000 * rnd.choice([0, 0, 0, 5, 5, 9000]))
                                 for _ in range(500)]),
              c.Enqueue("random", [c.EnqueueItem(b"x", priority=rnd.randrange(1_000_000_000)) for _ in range(500)]),
              # timestamps (s): half due, half later, many equal
              c.Enqueue("stamps", [c.EnqueueItem(b"x", priority=NOW // 1000 + rnd.randrange(-20, 20))
                                   for _ in range(500)]),
              c.Enqueue("fair", [c.EnqueueItem(b"x", group=f"g{(start + i) // 50:04d}",
                                               priority=rnd.randrange(3)) for i in range(500)]))
    for qn in ("ties", "random", "stamps", "fair"):
        apply(c.Dequeue(qn, 400, seed=3))  # in flight
        inflight = st.machine.peek_ids(qn, MessageState.IN_FLIGHT, 0, 1000)
        apply(c.Ack(qn, inflight[::3]))  # acked: noted gone, bodies not yet swept


def test_a_reopened_store_holds_every_queue_in_the_same_order(tmp_path: Path) -> None:
    env = open_env(tmp_path / "db", map_size=1 << 30)
    st = StateStore(env)
    _fill(st)
    want = _seen(st)
    assert st._sink.gone and st._sink.leased  # noqa: SLF001  (overrides of both kinds are read)
    env.close()
    with pytest.MonkeyPatch.context() as mp:  # many chunks and several float runs per queue
        mp.setattr(M, "_CHUNK", 97)
        mp.setattr(pairlist, "_RUN", 64)
        env = open_env(tmp_path / "db", map_size=1 << 30)
        again = StateStore(env)
        assert _seen(again) == want
        again.rebuild()
        assert _seen(again) == want
    env.close()


def test_a_rebuild_pauses_the_gc_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    env = open_env(tmp_path / "db", map_size=1 << 30)
    st = StateStore(env)
    seen: list[bool] = []
    load = st.machine.load

    def spy(*a: object, **kw: object) -> None:
        seen.append(gc.isenabled())
        load(*a, **kw)  # type: ignore[arg-type]

    st.machine.load = spy  # type: ignore[method-assign]
    was = gc.isenabled()
    try:
        gc.enable()
        st.rebuild()
        assert gc.isenabled()
        gc.disable()
        st.rebuild()
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
    assert seen == [False, False]
    env.close()


def _apply(st: StateStore, index: int, *cmds: c.Command, now: int = NOW) -> str:
    """The results of one entry of `cmds`, as text (errors compare by type and message)."""
    with st.write() as txn:
        return repr(st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(now, list(cmds))))]))


def test_a_rebuild_with_unsorted_chunks_goes_on_as_the_store_that_never_restarted(tmp_path: Path) -> None:
    """A copy of the store opened again (small chunks and ranges: the ready and delayed pairs
    left in unsorted chunks, `PairList.from_unsorted`) holds the same order as the live
    store, and the same commands then give the same results on both: deliveries, nacks with
    new priorities, enqueues into the unsorted chunks, priority updates, time passing."""
    env = open_env(tmp_path / "db", map_size=1 << 30)
    st = StateStore(env)
    _fill(st)
    (tmp_path / "copy").mkdir(mode=0o700)
    env.copy(str(tmp_path / "copy"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pairlist, "LOAD", 16)  # ranges of ~128 pairs, at most 256 unsorted
        env2 = open_env(tmp_path / "copy", map_size=1 << 30)
        again = StateStore(env2)
        for qn in ("random", "stamps"):
            index = again.machine.queues[qn].index
            assert any(index.ready._unsorted)  # type: ignore[union-attr]  # noqa: SLF001
        assert any(again.machine.queues["stamps"].delayed._unsorted)  # noqa: SLF001
        rnd = random.Random(9)
        index = 1000
        for step in range(12):
            cmds: list[c.Command] = []
            for qn in ("ties", "random", "stamps", "fair"):
                cmds.append(c.Dequeue(qn, 37, seed=step))
                cmds.append(c.Enqueue(qn, [c.EnqueueItem(b"y", group=f"g{rnd.randrange(80):04d}",
                                                         priority=rnd.randrange(1_000_000_000) if qn != "stamps"
                                                         else NOW // 1000 + rnd.randrange(-20, 40))
                                           for _ in range(23)]))
            index += 1
            now = NOW + step * 3000
            assert _apply(again, index, *cmds, now=now) == _apply(st, index, *cmds, now=now)
            for qn in ("ties", "random", "stamps", "fair"):
                flight = st.machine.peek_ids(qn, MessageState.IN_FLIGHT, 0, 10 * N)
                assert again.machine.peek_ids(qn, MessageState.IN_FLIGHT, 0, 10 * N) == flight
                some = flight[step::7]
                ready = st.machine.peek_ids(qn, MessageState.READY, 0, 10 * N)[::97]
                more = [c.Ack(qn, some[::2]),
                        *(c.Nack(qn, i, 0, priority=rnd.randrange(100)) for i in some[1::2]),
                        *(c.UpdatePriority(qn, i, rnd.randrange(-5, 5)) for i in ready[:5])]
                index += 1
                assert _apply(again, index, *more, now=now) == _apply(st, index, *more, now=now)
            assert _seen(again) == _seen(st)
        env2.close()
    env.close()


def test_acked_records_cut_from_the_columns_beside_delayed_and_timestamp_records(tmp_path: Path) -> None:
    """Chunks whose only overridden records are acked ones not yet swept (gone) are read as
    columns with those records cut out (`_Loader._drop`), beside records with a not-before
    time, timestamp priorities (due and later) and plain ones: the reopened store holds the
    same queues as the live one, and goes on as it does."""
    env = open_env(tmp_path / "db", map_size=1 << 30)
    st = StateStore(env)
    rnd = random.Random(11)
    index = 1
    _apply(st, index, *(c.CreateQueue(qn, "delayed", QueueSettings()) for qn in ("mixed", "stamps", "plain")))
    for _ in range(0, N, 500):
        index += 1
        _apply(st, index,
               c.Enqueue("mixed", [c.EnqueueItem(b"x", priority=rnd.choice([rnd.randrange(-3, 4), NOW // 1000 + rnd.randrange(-20, 20)]),
                                                 delay_ms=1000 * rnd.choice([0, 0, 0, 5, 9000])) for _ in range(500)]),
               c.Enqueue("stamps", [c.EnqueueItem(b"x", priority=NOW // 1000 + rnd.randrange(-20, 20))
                                    for _ in range(500)]),
               c.Enqueue("plain", [c.EnqueueItem(b"x", priority=rnd.randrange(1000)) for _ in range(500)]))
    for qn in ("mixed", "stamps", "plain"):
        index += 1
        _apply(st, index, c.Dequeue(qn, 700, seed=3))
        index += 1
        _apply(st, index, c.Ack(qn, st.machine.peek_ids(qn, MessageState.IN_FLIGHT, 0, 1000)))  # gone, none in flight
    assert st._sink.gone and not st._sink.leased  # noqa: SLF001
    want = _seen(st)
    (tmp_path / "copy").mkdir(mode=0o700)
    env.copy(str(tmp_path / "copy"))
    cuts: list[bool] = []  # a cut beside special records (not plainly ready), per call
    drop = M._Loader._drop  # noqa: SLF001

    def spy(d: list[int], ps: object, ids: object, special: set[int]) -> set[int]:
        cuts.append(bool(special.difference(d)))
        return drop(d, ps, ids, special)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_CHUNK", 97)
        mp.setattr(M._Loader, "_drop", staticmethod(spy))  # noqa: SLF001
        env2 = open_env(tmp_path / "copy", map_size=1 << 30)
        again = StateStore(env2)
        assert _seen(again) == want
    assert True in cuts and False in cuts
    for step in range(6):
        cmds = [c.Dequeue(qn, 50, seed=step) for qn in ("mixed", "stamps", "plain")]
        index += 1
        now = NOW + step * 4000
        assert _apply(again, index, *cmds, now=now) == _apply(st, index, *cmds, now=now)
        assert _seen(again) == _seen(st)
    env2.close()
    env.close()
