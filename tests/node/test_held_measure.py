"""The storage gauge under the batched commit (`RaftNode._measure`): a write that continues
a held one re-reads no table while the store has room for `MEASURE_ROOM_BATCHES` held
batches; the batch's first write, and every write when room is short, measure whole. Real
LMDB, real threads, the in-memory network (tests/node/raftnet.py); the hold is a minute so
that only what a test does commits a held write."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import lmdb
import pytest

from doq.node.alarms import StorageGauge
from doq.node.raft_node import MEASURE_ROOM_BATCHES, RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import FAST, Cluster, retry

pytestmark = pytest.mark.timeout(180)
HOLD = dataclasses.replace(FAST, hold_commit_ms=60_000, apply_thread=False)
CONTENT = b"x" * 16_000
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


class _CountingGauge(StorageGauge):
    """A gauge that counts its whole measures (the ones that `stat` the tables)."""

    whole = 0

    def measure(self, txn: lmdb.Transaction, *, log_bytes: int | None = None,
                state_changed: bool = True) -> None:
        self.whole += 1
        super().measure(txn, log_bytes=log_bytes, state_changed=state_changed)


async def _node_with_gauge(root: Path, max_data_bytes: int) -> tuple[RaftNode, _CountingGauge]:
    cl = Cluster(root, HOLD, RaftNode)
    _open.append(cl)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await retry(lambda: n1.propose(c.CreateQueue("q", "delayed", QueueSettings())))

    def attach() -> _CountingGauge:  # on the apply thread, the held write committed first
        n1.state.commit_held()       # (a gauge opens its tables: LMDB's write lock)
        return _CountingGauge(n1.env, root, node_id="n1", max_data_bytes=max_data_bytes,
                              disk_free_limit_bytes=0)

    gauge = await asyncio.get_running_loop().run_in_executor(n1._applier, attach)
    n1.gauge = gauge
    return n1, gauge


async def _enqueue(node: RaftNode, count: int) -> None:
    for _ in range(count):
        await node.propose(c.Enqueue("q", [c.EnqueueItem(CONTENT)]))


async def test_a_held_batch_reads_the_tables_once_and_the_next_batch_measures_its_growth(
        tmp_path: Path) -> None:
    """Ten calls one at a time in one held batch: one whole measure (the batch's first
    write); the log's size still follows every write. Once the batch commits, the next
    batch's first write measures whole again and sees what the last one added. Fails if
    every held write re-read the tables, or if a measure stayed behind past one batch."""
    node, gauge = await _node_with_gauge(tmp_path, max_data_bytes=1 << 40)
    await _enqueue(node, 1)
    assert await node.inspect(lambda s: s.held)
    assert gauge.whole == 1
    log_before, used_first = gauge.log_bytes, gauge.used_bytes
    await _enqueue(node, 9)
    assert await node.inspect(lambda s: s.held)  # still the same held batch
    assert gauge.whole == 1
    assert gauge.log_bytes > log_before  # the segment log's growth is followed
    tables_first = used_first - log_before
    assert gauge.used_bytes - gauge.log_bytes == tables_first  # the tables' pages as first read

    await node.inspect(lambda s: s.commit_held())  # the batch commits (as its timer would)
    await _enqueue(node, 1)  # begins the next batch: a whole measure
    assert await node.inspect(lambda s: s.held)  # its write ended (answers come before it)
    assert gauge.whole == 2
    # ten 16 kB messages later the tables take more than the batch's first write saw
    assert gauge.used_bytes - gauge.log_bytes >= tables_first + 9 * len(CONTENT)


async def test_every_held_write_measures_whole_when_the_store_has_little_room(tmp_path: Path) -> None:
    """With less room than `MEASURE_ROOM_BATCHES` held batches, every write reads the tables
    (the measure never lags near a limit). Fails if a held write skipped its measure there."""
    limit = MEASURE_ROOM_BATCHES * HOLD.hold_commit_bytes // 2
    node, gauge = await _node_with_gauge(tmp_path, max_data_bytes=limit)
    await _enqueue(node, 10)
    assert await node.inspect(lambda s: s.held)
    assert gauge.headroom_bytes < MEASURE_ROOM_BATCHES * HOLD.hold_commit_bytes
    assert gauge.whole == 10
