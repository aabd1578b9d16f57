"""Storage alarms in the Raft node driver, with real LMDB environments (tiny maps, so LMDB
itself raises MapFullError) on the in-memory peer network of tests/node/raftnet.py; the
gauge's thresholds and the classification of failures with real LMDB errors."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from doq.errors import StorageFull
from doq.node import alarms
from doq.node.alarms import StorageGauge, grows_state
from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.node.raftnet import FAST, Cluster, Net, addrs, eventually

CONTENT = b"x" * 16_000


def _committed(node: RaftNode) -> bool:
    """On the apply thread, before a gauge opens its tables there (LMDB's write lock): the
    held write of the batched commit committed. True."""
    node.state.commit_held()
    return True


class _Disk:
    """A statvfs answer with a settable free space (the real disk path is exercised by
    tests/integration/test_storage_alarms.py)."""

    def __init__(self, free_bytes: int) -> None:
        self.free_bytes = free_bytes

    def __call__(self, path: str) -> os.statvfs_result:
        st = os.statvfs(path)
        return os.statvfs_result((st.f_bsize, 1, st.f_blocks, self.free_bytes, self.free_bytes,
                                  st.f_files, st.f_ffree, st.f_favail, st.f_flag, st.f_namemax))


def _gauge(env: lmdb.Environment, path: Path, *, max_data_bytes: int, disk: _Disk | None = None,
           limit: int = 0) -> StorageGauge:
    return StorageGauge(env, path, node_id="n1", max_data_bytes=max_data_bytes, disk_free_limit_bytes=limit,
                        disk_check_s=0.0, statvfs=disk or _Disk(1 << 40))


def test_commands_that_shrink_the_state_are_taken_under_an_alarm_and_the_others_refused() -> None:
    taken = [c.Ack("q", [1]), c.Nack("q", 1), c.DeleteMessage("q", 1), c.DeleteQueue("q"), c.PurgeQueue("q"),
             c.Dequeue("q"), c.Touch("q", 1), c.UpdatePriority("q", 1, 2), c.Tick()]
    refused = [c.CreateQueue("q", "delayed", QueueSettings()), c.UpdateQueue("q", QueueSettings()),
               c.Enqueue("q", [c.EnqueueItem(b"m")]), c.EnqueueColumns("q", [b"m"]),
               c.RestoreChunk(b"r" * 16, 0, b"")]
    assert [grows_state(x) for x in taken] == [False] * len(taken)
    assert [grows_state(x) for x in refused] == [True] * len(refused)


def test_the_data_size_alarm_goes_on_at_the_limit_and_off_a_margin_below_it(tmp_path: Path) -> None:
    env = open_env(tmp_path / "db", map_size=alarms.map_size(4 << 20))
    gauge = _gauge(env, tmp_path, max_data_bytes=4 << 20)
    db = env.open_db(b"state_messages")

    def write(first: int, end: int, delete: bool = False) -> None:
        with env.begin(write=True) as txn:
            for i in range(first, end):
                key = i.to_bytes(8, "big")
                txn.delete(key, db=db) if delete else txn.put(key, CONTENT, db=db)
            gauge.measure(txn)
        gauge.committed()

    write(0, 100)
    assert gauge.alarms == () and 1 << 20 < gauge.used_bytes < 4 << 20
    write(100, 270)  # 270 x 16 kB: past 4 MiB
    assert [a.reason for a in gauge.alarms] == ["DATA_SIZE_LIMIT"]
    assert "--max-data-size" in gauge.alarms[0].message
    write(0, 2, delete=True)  # within the margin: still on (no flapping)
    assert [a.reason for a in gauge.alarms] == ["DATA_SIZE_LIMIT"]
    write(0, 270, delete=True)
    assert gauge.alarms == ()
    env.close()


def test_a_measure_of_a_raft_only_write_rereads_the_raft_tables_and_keeps_the_states(tmp_path: Path) -> None:
    """`measure(state_changed=False)` (a write that only appended or set the hard state)
    reads the raft_* tables again and takes the state tables' pages from the last
    measure: the result equals a full measure as long as the caller is right that no
    state table changed; a failed write makes the next measure a full one."""
    env = open_env(tmp_path / "db", map_size=alarms.map_size(64 << 20))
    gauge = _gauge(env, tmp_path, max_data_bytes=64 << 20)
    state_db, raft_db = env.open_db(b"state_messages"), env.open_db(b"raft_meta")

    def write(db: object, n: int, *, state_changed: bool) -> int:
        with env.begin(write=True) as txn:
            for i in range(n):
                txn.put(i.to_bytes(8, "big"), CONTENT, db=db)
            gauge.measure(txn, state_changed=state_changed)
            measured = gauge.used_bytes
            gauge.measure(txn)  # every table read
            assert measured == gauge.used_bytes
        gauge.committed()
        return measured

    first = write(state_db, 50, state_changed=True)
    grown = write(raft_db, 60, state_changed=False)  # the raft table's growth is seen
    assert grown > first
    with env.begin(write=True) as txn:
        for i in range(50, 200):
            txn.put(i.to_bytes(8, "big"), CONTENT, db=state_db)
        gauge.measure(txn)  # a write that fails after its measure: its txn is aborted
        txn.abort()
    assert gauge.write_failed(OSError("not for want of space")) is False
    with env.begin(write=True) as txn:
        gauge.measure(txn, state_changed=False)  # full, not the aborted txn's state pages
        assert gauge.used_bytes == grown
    env.close()


def test_a_log_only_measure_adds_the_segment_log_to_the_tables_last_measured(tmp_path: Path) -> None:
    """`measure_log` (a write that only appended to the segment log: no LMDB transaction)
    counts the segment log's bytes on top of the tables' pages last measured, as `measure`
    with the same `log_bytes` would; with no whole measure standing (none yet, or a failed
    write dropped it) it does nothing and says so, so the caller measures in a txn."""
    env = open_env(tmp_path / "db", map_size=alarms.map_size(64 << 20))
    gauge = _gauge(env, tmp_path, max_data_bytes=64 << 20)
    state_db = env.open_db(b"state_messages")
    assert gauge.measure_log(1000) is False  # nothing measured yet
    assert gauge.used_bytes == 0
    with env.begin(write=True) as txn:
        for i in range(50):
            txn.put(i.to_bytes(8, "big"), CONTENT, db=state_db)
        gauge.measure(txn, log_bytes=1000)
    gauge.committed()
    tables, table_log = gauge.used_bytes - 1000, gauge.log_bytes - 1000
    assert gauge.measure_log(250_000) is True
    assert (gauge.used_bytes, gauge.log_bytes) == (tables + 250_000, table_log + 250_000)
    with env.begin() as txn:  # what a whole measure with that log says
        fresh = _gauge(env, tmp_path, max_data_bytes=64 << 20)
        fresh.measure(txn, log_bytes=250_000)
    assert (fresh.used_bytes, fresh.log_bytes) == (gauge.used_bytes, gauge.log_bytes)
    assert gauge.write_failed(OSError("not for want of space")) is False
    assert gauge.measure_log(300_000) is False  # the next measure must read every table
    assert gauge.used_bytes == tables + 250_000
    env.close()


async def test_the_gauges_partial_measures_equal_a_whole_one_on_every_node_of_a_cluster_with_the_apply_thread(
        tmp_path: Path) -> None:
    """With the apply thread on, three nodes (followers append without applying under the
    lazy commit: Raft-only writes, measured with `state_changed=False`), enqueues and
    acking dequeues (state tables grow and shrink): on every node, once all is applied,
    the state tables' pages the gauge last measured are a whole measure's (read on the
    apply thread: no write runs meanwhile). Fails if a write that changed a state table
    were measured as Raft-only."""
    cfg = dataclasses.replace(FAST, snapshot_every=0, apply_thread=True)
    cluster = Cluster(tmp_path, cfg)
    try:
        leader = await cluster.start("n1")
        await cluster.grow("n2", "n3")
        loop = asyncio.get_running_loop()
        for nid, node in cluster.nodes.items():  # built on the apply thread (see the test below)
            node.gauge = await loop.run_in_executor(node._applier, lambda n=node, i=nid: _committed(n) and StorageGauge(
                n.env, tmp_path, node_id=i, max_data_bytes=1 << 40, disk_free_limit_bytes=0))
        await leader.propose(c.CreateQueue("q", "delayed", QueueSettings()))
        for _round in range(6):
            await asyncio.gather(*[leader.propose(c.Enqueue("q", [c.EnqueueItem(CONTENT)])) for _ in range(5)])
            await leader.propose(c.Dequeue("q", max_messages=3, ack=True))
        target = leader.state.applied_index

        def state_bytes(gauge: StorageGauge) -> int:
            return gauge.used_bytes - gauge.log_bytes  # the tables but the Raft log's

        for nid, node in cluster.nodes.items():
            async def caught_up(n: RaftNode = node) -> bool | None:
                return True if n.state.applied_index >= target else None

            await eventually(caught_up, 30, f"{nid} applied the leader's last entry")

            def whole(_: object, n: RaftNode = node, i: str = nid) -> tuple[int, int]:
                fresh = StorageGauge(n.env, tmp_path, node_id=i, max_data_bytes=1 << 40,
                                     disk_free_limit_bytes=0)
                with n.env.begin() as txn:
                    fresh.measure(txn)
                assert n.gauge is not None
                return state_bytes(n.gauge), state_bytes(fresh)

            measured, expected = await node.inspect(whole)
            assert measured == expected, nid
    finally:
        await cluster.close()


def test_the_disk_alarm_follows_the_free_space(tmp_path: Path) -> None:
    env = open_env(tmp_path / "db")
    disk = _Disk(100 << 20)
    gauge = _gauge(env, tmp_path, max_data_bytes=1 << 30, disk=disk, limit=64 << 20)
    assert gauge.check_disk() is False and gauge.alarms == ()
    assert gauge.headroom_bytes == 36 << 20  # the disk's limit is nearer than the data size's
    gauge.refused_near_limit()  # a write that would pass it: the disk alarm
    assert [a.reason for a in gauge.alarms] == ["DISK_FREE_LIMIT"]
    assert gauge.check_disk() is True and gauge.alarms == ()  # enough free at the next check
    disk.free_bytes = 10 << 20
    assert gauge.check_disk() is True
    assert [a.reason for a in gauge.alarms] == ["DISK_FREE_LIMIT"]
    assert "--disk-free-limit" in gauge.alarms[0].message
    disk.free_bytes = 65 << 20
    assert gauge.check_disk() is True and gauge.alarms == ()
    env.close()


def test_only_failures_for_want_of_space_raise_the_nospace_alarm(tmp_path: Path) -> None:
    env = open_env(tmp_path / "db")
    disk = _Disk(1 << 40)
    gauge = _gauge(env, tmp_path, max_data_bytes=1 << 30, disk=disk)
    assert gauge.write_failed(lmdb.Error("mdb_txn_commit: Invalid argument")) is False
    assert gauge.write_failed(lmdb.Error(f"mdb_txn_commit: {os.strerror(errno.EIO)}")) is False  # disk not full
    assert gauge.alarms == ()
    disk.free_bytes = 0  # a short write on a full disk: LMDB says EIO
    assert gauge.write_failed(lmdb.Error(f"mdb_txn_commit: {os.strerror(errno.EIO)}")) is True
    assert [a.reason for a in gauge.alarms] == ["NOSPACE"]
    disk.free_bytes = 1 << 40
    gauge.committed()
    assert gauge.alarms == ()
    assert gauge.write_failed(OSError(errno.ENOSPC, "No space left on device")) is True
    gauge.committed()
    tiny = open_env(tmp_path / "tiny", map_size=64 << 10)
    try:
        with tiny.begin(write=True) as txn:
            for i in range(1000):
                txn.put(i.to_bytes(4, "big"), b"y" * 1000)
    except lmdb.MapFullError as e:
        assert gauge.write_failed(e) is True
    else:
        raise AssertionError("the tiny map did not fill")
    finally:
        tiny.close()
    env.close()


async def test_a_write_that_fails_for_want_of_space_is_retried_whole_and_nothing_is_half_applied(tmp_path: Path) -> None:
    """No limit (the gauge's is far above the map): LMDB's own MapFullError fails a write
    whose entry holds an enqueue. The node neither fails nor applies part of it: it raises
    NOSPACE, refuses further growth, keeps the proposal waiting, and once the map has room
    (grown here between two tries, on the writer thread) the same write goes through."""
    path = tmp_path / "n1"
    env = open_env(path, map_size=2 << 20)
    gauge = StorageGauge(env, path, node_id="n1", max_data_bytes=1 << 40, disk_free_limit_bytes=0)
    node = RaftNode(StateStore(env), node_id="n1", addrs=addrs("n1"), transport=Net().factory("n1"),
                    config=FAST, gauge=gauge)
    await node.start()
    try:
        await node.propose(c.CreateQueue("q", "delayed", QueueSettings()))
        acked = 0
        while True:
            fut = node.propose_nowait(c.Enqueue("q", [c.EnqueueItem(CONTENT)]))

            # the node's alarms (what admission refuses by), not the gauge's: the gauge
            # raises NOSPACE first, the node takes it up after reloading its log's view
            async def settled(f: asyncio.Future[object] = fut) -> bool | None:
                return True if f.done() or node.alarms() else None

            await eventually(settled, 30, "the enqueue settles or the write fails")
            if not fut.done():
                break
            fut.result()
            acked += 1
        assert [a.reason for a in node.alarms()] == ["NOSPACE"]
        before = node.state.get_queue("q").stats.total
        assert before == acked  # nothing of the failed write is visible
        with pytest.raises(StorageFull) as refused:
            node.propose_nowait(c.Enqueue("q", [c.EnqueueItem(b"more")]))
        assert refused.value.reason == "NOSPACE" and refused.value.retryable
        await node._applier.call(lambda _: env.set_mapsize(16 << 20), None)  # no txn runs between tries
        await asyncio.wait_for(fut, 30)  # answered once applied, maybe before its commit
        assert node.state.get_queue("q").stats.total == acked + 1

        async def cleared() -> bool | None:  # once the write committed
            return True if node.alarms() == [] else None

        await eventually(cleared, 30, "the NOSPACE alarm cleared by the write's commit")
        await node.propose(c.Enqueue("q", [c.EnqueueItem(b"after")]))
    finally:
        await node.stop()
    # what is on disk is whole: the log and the state agree, every acknowledged message there
    state = StateStore(env)
    assert state.get_queue("q").stats.total == acked + 2
    env.close()


class _FillsUp(StorageGauge):
    """A gauge whose measure, inside a write txn after its apply (and its early answers),
    fails as a full map does while `full` is set."""

    full = False

    def measure(self, txn: lmdb.Transaction, **kw: Any) -> None:
        if self.full:
            raise lmdb.MapFullError("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached")
        super().measure(txn, **kw)


class _HoldsApplies(RaftNode):
    """While `hold` is set, its apply thread waits for `release` before a deferred apply;
    records the indexes each LMDB write that committed applied, in commit order."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.committed_order: list[int] = []
        self.hold = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def _apply_deferred(self, job: Any, t0: float) -> None:
        if self.hold:
            self.holding.set()
            self.release.wait(60)
        super()._apply_deferred(job, t0)

    def _commit_state(self, job: Any, *a: Any, **kw: Any) -> None:
        super()._commit_state(job, *a, **kw)
        self.committed_order.extend(e.index for e in job.committed)


async def test_deferred_applies_on_a_full_map_wait_in_order_for_space_and_none_is_lost_or_applied_twice(
        tmp_path: Path) -> None:
    """The apply thread on: 20 entries appended and committed while it is held, each a
    deferred apply; then the map is full. The first apply fails (after its early answer):
    the loop raises NOSPACE and refuses growth, the applies behind it wait, none applied,
    and the apply thread stays free for other jobs (`inspect`; a map grown there). Once
    there is room they commit in log order, each once, every proposal gets its own result
    (ids in proposal order), the alarm lifts, and a restart finds all 20. Fails if the
    apply thread retried on its own (`inspect` would wait behind it) or if an apply behind
    the failed one committed before it, was lost or applied twice."""
    path = tmp_path / "n1"
    env = open_env(path)
    gauge = _FillsUp(env, path, node_id="n1", max_data_bytes=1 << 40, disk_free_limit_bytes=0)
    cfg = dataclasses.replace(FAST, snapshot_every=0, apply_thread=True, nospace_retry_max_ms=100)
    node = _HoldsApplies(StateStore(env), node_id="n1", addrs=addrs("n1"), transport=Net().factory("n1"),
                         config=cfg, gauge=gauge)
    await node.start()
    try:
        await node.propose(c.CreateQueue("q", "delayed", QueueSettings()))
        core = node.core
        assert core is not None
        node.hold = True
        futs = [node.propose_nowait(c.Enqueue("q", [c.EnqueueItem(b"m0")]))]
        await asyncio.to_thread(node.holding.wait, 60)
        held_at = node.state.applied_index
        for i in range(1, 20):  # one entry each: one deferred apply each
            futs.append(node.propose_nowait(c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)])))
            before = core.log.committed

            async def committed(b: int = before) -> bool | None:
                return True if core.log.committed > b else None

            await eventually(committed, 30, "the next entry committed")
        gauge.full = True
        node.hold = False
        node.release.set()

        async def stalled() -> bool | None:
            return True if len(node._stalled) == 20 and node.alarms() else None

        await eventually(stalled, 30, "every deferred apply stalled behind the failed one, NOSPACE raised")
        assert [a.reason for a in node.alarms()] == ["NOSPACE"]
        with pytest.raises(StorageFull):
            node.propose_nowait(c.Enqueue("q", [c.EnqueueItem(b"more")]))
        # the apply thread takes other jobs meanwhile, and nothing was applied
        assert await asyncio.wait_for(node.inspect(lambda st: st.applied_index), 60) == held_at
        assert not any(f.done() for f in futs[1:])
        assert all(i <= held_at for i in node.committed_order)  # nothing past the held one committed
        gauge.full = False
        results = await asyncio.gather(*futs)
        ids = [r[0].id for r in results]  # type: ignore[index]
        assert ids == list(range(ids[0], ids[0] + 20))
        await node.inspect(lambda st: None)  # after the last commit (answered before it)
        order = [i for i in node.committed_order if i > held_at]
        assert order == list(range(held_at + 1, held_at + 21))  # each once, in log order

        async def cleared() -> bool | None:
            return True if node.alarms() == [] else None

        await eventually(cleared, 30, "the NOSPACE alarm lifted by the replayed commits")
        await node.propose(c.Enqueue("q", [c.EnqueueItem(b"after")]))
    finally:
        await node.stop()
    state = StateStore(env)
    assert state.get_queue("q").stats.total == 21
    assert [state.get_message("q", id_).content for id_ in ids] == [b"m%d" % i for i in range(20)]
    env.close()


async def test_a_members_alarm_reaches_the_leader_which_refuses_growth_until_it_clears(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        leader = await cluster.start("n1")
        await cluster.grow("n2", "n3")
        await leader.propose(c.CreateQueue("q", "delayed", QueueSettings()))
        follower = cluster.nodes["n3"]
        disk = _Disk(1 << 20)
        loop = asyncio.get_running_loop()
        # built on the node's writer thread: opening the gauge's databases takes LMDB's write
        # lock, which py-lmdb waits for holding the GIL (beside a running writer: a deadlock)
        follower.gauge = await loop.run_in_executor(follower._applier, lambda: _committed(follower) and StorageGauge(
            follower.env, tmp_path, node_id="n3", max_data_bytes=1 << 40, disk_free_limit_bytes=64 << 20,
            statvfs=disk))
        follower.gauge.check_disk()
        follower._refresh_alarms()

        async def refused() -> bool | None:
            leader._refresh_alarms()
            return True if leader.alarms() else None

        leader.gauge = await loop.run_in_executor(leader._applier, lambda: _committed(leader) and StorageGauge(
            leader.env, tmp_path, node_id="n1", max_data_bytes=1 << 40, disk_free_limit_bytes=0))
        await eventually(refused, 60, "the leader hears of n3's alarm")
        assert [(a.node_id, a.reason) for a in leader.alarms()] == [("n3", "DISK_FREE_LIMIT")]
        with pytest.raises(StorageFull, match="node n3"):
            leader.propose_nowait(c.Enqueue("q", [c.EnqueueItem(b"m")]))
        await leader.propose(c.PurgeQueue("q"))  # shrinking: taken
        disk.free_bytes = 1 << 40
        follower.gauge.check_disk()
        follower._refresh_alarms()

        async def cleared() -> bool | None:
            leader._refresh_alarms()
            return True if not leader.alarms() else None

        await eventually(cleared, 60, "the alarm clears on the leader")
        await leader.propose(c.Enqueue("q", [c.EnqueueItem(b"m")]))
    finally:
        await cluster.close()


def test_a_write_that_failed_on_a_full_disk_is_tried_again_only_once_space_came_back(tmp_path: Path) -> None:
    """Each failed try costs a rebuild of the store's memory: none while the disk stays full."""
    env = open_env(tmp_path / "db")
    disk = _Disk(4096)
    gauge = _gauge(env, tmp_path, max_data_bytes=1 << 30, disk=disk)
    assert gauge.write_failed(OSError(errno.ENOSPC, "No space left on device")) is True
    assert gauge.worth_retrying() is False
    disk.free_bytes = 8192  # a few pages freed: not yet
    assert gauge.worth_retrying() is False
    disk.free_bytes = alarms.RETRY_FREE_BYTES
    assert gauge.worth_retrying() is True
    env.close()
