"""The batched commit's failure paths (`RaftNodeConfig.hold_commit_ms`; the review of lat11,
docs/benchmarks.md "lat12"): a held write whose commit fails, planted in
`StateStore._commit` as LMDB fails it (the transaction aborted, memory rebuilt from LMDB,
its applies lost), and a node that failed and stops. Real LMDB, real threads, the
in-memory network (tests/node/raftnet.py); the hold is a minute, so only what a test does
commits a held write."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import lmdb
import pytest

from doq.errors import Unavailable
from doq.node.alarms import StorageGauge
from doq.node.raft_meta import RaftMeta
from doq.node.raft_node import RaftNode
from doq.node.wal_log import WalLogStorage
from doq.queues import commands as c
from doq.queues.model import MessageState, QueueSettings
from doq.service.api import QueueService
from doq.storage.state import StateStore
from tests.node.heldnet import HOLD, enq, held, one_node
from tests.node.raftnet import Cluster, retry

pytestmark = pytest.mark.timeout(240)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()





class _Fault:
    """`StateStore._commit` of one store fails while `left` > 0 (each failure counts one
    down), as LMDB fails a commit on a full disk; `before` runs first (on the committing
    thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: StateStore) -> None:
        self.left = 0
        self.failed = 0
        self.before: Callable[[], None] | None = None
        real = StateStore._commit

        def commit(s: StateStore, txn: lmdb.Transaction) -> None:
            if s is not store or self.left <= 0:
                return real(s, txn)
            self.left -= 1
            self.failed += 1
            if self.before is not None:
                self.before()
            raise lmdb.DiskError("planted: mdb_txn_commit: No space left on device")

        monkeypatch.setattr(StateStore, "_commit", commit)


async def _until_readable(api: QueueService, mid: int) -> bytes:
    """`get_message` once the lost applies are applied again (Unavailable meanwhile)."""
    return (await retry(lambda: api.get_message("q", mid))).content


async def test_get_message_reads_off_the_loop_and_answers_at_once_when_the_commit_it_waits_for_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`QueueService.get_message` right after an answer waits for the held write's commit
    off the event loop: while the (planted) failing commit runs on the apply thread the
    loop answers (a callback it is handed runs), and the read answers `Unavailable`
    (APPLY_NOT_COMMITTED) as soon as the commit failed, not after its timeout (made two
    minutes here); then the lost applies are applied again and the message is read.
    Fails if the read runs on the loop (the loop is blocked until the commit gives up
    waiting for it: `loop_ran` False) or if a reader waits out its timeout after a failed
    commit (the read then succeeds after the refill instead of raising)."""
    _, n1 = await one_node(tmp_path, _open)
    api = QueueService(n1)
    out = await n1.propose(enq(0))
    mid = out[0].id  # type: ignore[index]
    assert await held(n1)
    monkeypatch.setattr(StateStore.wait_committed, "__defaults__", (120.0,))
    loop = asyncio.get_running_loop()
    loop_ran = threading.Event()
    seen: list[bool] = []

    def the_loop_answers() -> None:
        loop.call_soon_threadsafe(loop_ran.set)
        seen.append(loop_ran.wait(60))

    fault = _Fault(monkeypatch, n1.state)
    fault.before, fault.left = the_loop_answers, 1
    with pytest.raises(Unavailable) as err:
        await api.get_message("q", mid)
    assert err.value.reason == "APPLY_NOT_COMMITTED"
    assert "could not be committed" in str(err.value)
    assert fault.failed == 1 and seen == [True]
    assert await _until_readable(api, mid) == b"m0"
    assert n1.state.committed_index == n1.state.applied_index or await held(n1)


async def test_a_failed_commit_on_the_apply_thread_reloads_the_logs_view_before_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(From the review's throwaway, made deterministic.) A snapshot every 10 entries and
    compaction one entry per write, so held writes carry compaction points and hard
    states; a reader on the apply thread (`peek` through `inspect`) commits such a held
    write, and that commit fails. The log's in-memory view (compaction point, hard
    state) is then ahead of LMDB's: it is marked for a reload that the next write does
    first thing, on the apply thread (not at once: the loop may be reading the log), so
    no write (a durable one already queued) drops segment files by the lost compaction
    point. Then the node goes on, restarts (its log reconciled with LMDB), and every
    confirmed message is there. Fails if the failure leaves the reload to a job posted
    behind the queued writes (`_reload_due` not set)."""
    monkeypatch.setitem(WalLogStorage.__init__.__kwdefaults__, "segment_bytes", 4128)
    cfg = dataclasses.replace(HOLD, snapshot_every=10, keep_entries=2, compact_entries_per_write=1)
    cl, n1 = await one_node(tmp_path, _open, cfg)
    rng = random.Random(1)
    fault = _Fault(monkeypatch, n1.state)
    confirmed: list[int] = []

    def in_lmdb(node: RaftNode) -> RaftMeta:
        with node.env.begin() as txn:
            return RaftMeta.read(txn, node.storage._meta_db)

    def probe(s: StateStore) -> tuple[tuple[int, object], tuple[int, object], bool] | None:
        st = n1.storage
        if not (s.held and st.first_index() - 1 > in_lmdb(n1).first[0]):
            return None  # no held compaction point yet
        fault.left = 1
        with pytest.raises(Unavailable):
            s.peek("q", MessageState.READY, 0, 5)
        disk = in_lmdb(n1)
        return (st.first_index() - 1, st.hard_state), (disk.first[0], disk.hard_state), n1._reload_due

    for _ in range(2000):
        out = await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"x" * rng.randrange(200, 1500))]))
        confirmed.append(out[0].id)  # type: ignore[index]
        views = await n1.inspect(probe)
        if views is not None:
            break
    else:
        pytest.fail("never a held write with a compaction point")
    assert fault.failed == 1
    memory, disk, reload_due = views
    assert memory != disk  # the lost compaction point and hard state: stale until reloaded
    assert reload_due  # ... which the next write does before anything else
    for i in range(30):  # snapshots, compactions, segment files dropped
        out = await retry(lambda i=i: n1.propose(enq(i)))  # type: ignore[misc]
        confirmed.append(out[0].id)  # type: ignore[index]
    await retry(lambda: n1.inspect(lambda s: s.peek("q", MessageState.READY, 0, 1)))
    assert n1.storage.seg.first_index() <= in_lmdb(n1).first[0] + 1
    await cl.stop("n1")
    n1 = await cl.start("n1")  # refused ("entries are missing") if the log lost entries
    await cl.wait_leader()
    known = await retry(lambda: n1.inspect(lambda s: s.sort_known("q", confirmed)))
    assert known == (list(range(len(confirmed))), [], [])  # positions: every one present


async def test_memory_readers_answer_unavailable_between_a_failed_held_commit_and_the_refill(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed commit of the held write (on the apply thread, as a `peek` commits it)
    rolls memory back to LMDB; until the lost applies are applied again (they cannot be
    while this job holds the apply thread), `sort_known` (acks, nacks, touches) and
    `group_stats` answer `Unavailable` (retryable) and the metrics' ages and throttles
    show nothing, instead of the rolled-back state (messages answered as enqueued called
    unborn). Afterwards they answer from the refilled state. Fails without the guard
    (`sort_known` calls the five ids unborn)."""
    _, n1 = await one_node(tmp_path, _open)
    ids = [(await n1.propose(enq(i)))[0].id for i in range(5)]  # type: ignore[index]
    assert await held(n1)
    fault = _Fault(monkeypatch, n1.state)

    def during(s: StateStore) -> dict[str, object]:
        fault.left = 1
        got: dict[str, object] = {}
        with pytest.raises(Unavailable):
            s.peek("q", MessageState.READY, 0, 5)
        for name, read in (("sort_known", lambda: s.sort_known("q", ids)),
                           ("group_stats", lambda: s.group_stats("q"))):
            try:
                got[name] = read()
            except Unavailable as e:
                got[name] = e.reason
        got["oldest"] = s.oldest_enqueued_ms(["q"])
        got["throttled"] = s.throttled_groups(["q"])
        return got

    got = await n1.inspect(during)
    assert fault.failed == 1
    assert got == {"sort_known": "APPLY_NOT_COMMITTED", "group_stats": "APPLY_NOT_COMMITTED",
                   "oldest": {}, "throttled": {}}
    known = await retry(lambda: n1.inspect(lambda s: s.sort_known("q", ids)))
    assert known == ([0, 1, 2, 3, 4], [], [])  # positions: every one present
    assert "q" in n1.state.oldest_enqueued_ms(["q"])


async def test_a_failed_node_stopping_keeps_the_answered_view(tmp_path: Path) -> None:
    """A node that failed with a write held aborts it at stop (the log has its entries)
    and keeps the readers' view at what was answered. Fails if the abort publishes the
    rolled-back state (the view's applied index behind the answers)."""
    cl, n1 = await one_node(tmp_path, _open)
    for i in range(5):
        await n1.propose(enq(i))
    assert await held(n1)
    answered = n1.applied_index
    assert n1.state.committed_index < answered
    n1._failed = RuntimeError("planted: the node failed")
    await cl.stop("n1")
    assert not n1.state.held
    assert n1.state.committed_index < answered  # aborted, not committed
    assert n1.applied_index == answered
    assert n1.state.get_queue("q").stats.total == 5


async def test_a_reader_commit_starts_the_held_count_again_and_the_gauge_sees_only_real_commits(
        tmp_path: Path) -> None:
    """`gauge.committed()` (which clears the NOSPACE alarm) runs for a real LMDB commit
    only, not for a held write, and a reader's commit on the apply thread (`peek`
    through `inspect`) starts the held write's entry count again: with
    `hold_commit_entries` 8, five calls, a peek, then five calls more are all held.
    Fails if each held write calls `committed()` or if the count went on from five
    (the tenth entry commits)."""
    _, n1 = await one_node(tmp_path, _open, dataclasses.replace(HOLD, hold_commit_entries=8))
    calls: list[int] = []

    class Counting(StorageGauge):
        def committed(self) -> None:
            calls.append(1)
            super().committed()

    def install(s: StateStore) -> None:
        s.commit_held()  # opening the gauge's tables takes LMDB's write lock
        n1.gauge = Counting(n1.env, tmp_path, node_id="n1", max_data_bytes=1 << 40, disk_free_limit_bytes=0)

    await n1.inspect(install)
    calls.clear()
    for i in range(5):
        await n1.propose(enq(i))
    assert await held(n1)
    assert calls == []
    await n1.inspect(lambda s: s.peek("q", MessageState.READY, 0, 1))
    assert not await held(n1) and calls == [1]
    for i in range(5, 10):
        await n1.propose(enq(i))
    assert await held(n1)
    assert calls == [1]


async def test_oldest_enqueued_ms_counts_a_queue_whose_messages_are_only_in_the_held_write(
        tmp_path: Path) -> None:
    """The metrics' oldest message age: a queue whose messages were all applied in the
    held write (not readable from another thread) is counted, at the replicated time of
    the last apply. Fails if the queue is missing."""
    _, n1 = await one_node(tmp_path, _open)
    await n1.inspect(lambda s: s.commit_held())
    await n1.propose(c.CreateQueue("r", "delayed", QueueSettings()))
    await n1.propose(c.Enqueue("r", [c.EnqueueItem(b"only held")]))
    assert await held(n1)
    ages = await asyncio.to_thread(n1.state.oldest_enqueued_ms, ["r"])
    assert ages == {"r": n1.state.machine.now_ms}
    await n1.inspect(lambda s: s.commit_held())
    committed = n1.state.oldest_enqueued_ms(["r"])
    assert set(committed) == {"r"} and committed["r"] <= ages["r"]
