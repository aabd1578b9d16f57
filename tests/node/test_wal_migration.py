"""A data dir of the previous layout (the Raft log's entries in LMDB's raft_log table)
starts with this version: its entries move to the segment log at open, the queue state is
the same, and the cluster keeps working (it grows to three voters, which catch up by
snapshot and log, and serves more calls)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from doq.node.wal_log import WalLogStorage, wal_dir
from doq.queues import commands as c
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.node.old_layout import old_entry_count, write_old_layout
from tests.node.raftnet import retry
from tests.node.test_raft_node import create_queue, enq, new_cluster

pytestmark = pytest.mark.timeout(180)


def _to_old_layout(node_path: Path) -> int:
    """Rewrite a stopped node's log in the previous layout (in that layout's bytes:
    `tests.node.old_layout`): its entries in LMDB's raft_log, no segment files. Returns
    how many entries."""
    env = open_env(node_path, map_size=1 << 30)
    try:
        new = WalLogStorage(env)
        entries = new.entries(new.first_index(), new.last_index() + 1, 1 << 40)
        new.close()
        write_old_layout(env, entries)
        shutil.rmtree(wal_dir(env))
        assert old_entry_count(env) == len(entries)
        return len(entries)
    finally:
        env.close()


async def test_an_old_layout_data_dir_starts_and_the_cluster_keeps_working(tmp_path: Path) -> None:
    cl = new_cluster(tmp_path)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await create_queue(n1)
    for i in range(30):
        await n1.propose(enq(i))
    got = await n1.propose(c.Dequeue("q", max_messages=5, visibility_timeout_ms=600_000))
    assert isinstance(got, list) and len(got) == 5
    await cl.stop("n1")
    moved = _to_old_layout(tmp_path / "n1")
    assert moved >= 32

    n1 = await cl.start("n1")
    assert n1.storage.migrated_entries == moved
    ld = await cl.wait_leader()
    stats = ld.state.get_queue("q").stats
    assert (stats.total, stats.in_flight) == (30, 5)
    ld = await cl.grow("n2", "n3")
    for i in range(30, 40):
        await retry(lambda i=i: ld.propose(enq(i)))  # type: ignore[misc]
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    for n in cl.nodes.values():
        assert n.state.get_queue("q").stats.total == 40
    # and the migrated node restarts from its segment files alone
    await cl.stop("n1")
    env = open_env(tmp_path / "n1", map_size=1 << 30)
    try:
        assert StateStore(env).get_queue("q").stats.total == 40
        assert old_entry_count(env) == 0  # the old table: empty
    finally:
        env.close()
    n1 = await cl.start("n1")
    assert n1.storage.migrated_entries == 0
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
