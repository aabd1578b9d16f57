"""`doq restore --data-dir` (`restore_offline`) and a node killed with a write held (the
batched commit, docs/raft.md): its state in LMDB lags its Raft log, so the state looks
empty while the log holds applied (answered) entries. The restore refuses it; the node's
next start applies them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from doq.backup.ops import restore_offline, write_backup
from doq.errors import FailedPrecondition
from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore
from tests.node.raftnet import FAST, Cluster, retry

pytestmark = pytest.mark.timeout(120)
HOLD = dataclasses.replace(FAST, hold_commit_ms=60_000, apply_thread=False)


def _empty_full_backup(path: Path, where: Path) -> Path:
    env = open_env(where)
    try:
        with open(path, "wb") as f:
            write_backup(StateStore(env), 0, f)
    finally:
        env.close()
    return path


async def test_an_offline_restore_refuses_a_killed_nodes_dir_whose_state_lags_its_log(tmp_path: Path) -> None:
    """A lone node answers a queue's creation and three enqueues, all in its held write,
    and is killed: LMDB's state is empty, its log holds them. `restore_offline` into that
    directory refuses (RESTORE_TARGET_NOT_EMPTY, naming the log) and changes nothing: the
    node restarted has the queue and its three messages. Fails if the restore judged the
    directory by LMDB alone (it would restore into it)."""
    cl = Cluster(tmp_path / "run", HOLD, RaftNode)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await retry(lambda: n1.propose(c.CreateQueue("q", "delayed", QueueSettings())))
    for i in range(3):
        await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)]))
    assert await n1.inspect(lambda s: s.held)
    await cl.crash("n1")
    target = node_dir(tmp_path / "data", "n1") / "doq.lmdb"
    target.parent.mkdir(parents=True)
    shutil.move(tmp_path / "run" / "n1", target)
    env = open_env(target)
    try:
        assert StateStore(env).is_empty()  # LMDB alone: nothing there
    finally:
        env.close()
    bak = _empty_full_backup(tmp_path / "empty.bak", tmp_path / "source")
    with pytest.raises(FailedPrecondition) as err:
        restore_offline(tmp_path / "data", "n1", bak)
    assert err.value.reason == "RESTORE_TARGET_NOT_EMPTY"
    assert "Raft log" in err.value.message

    shutil.move(target, tmp_path / "run" / "n1")
    n1 = await cl.start("n1")
    try:
        await cl.wait_leader()
        assert await retry(lambda: n1.inspect(lambda s: s.get_queue("q").stats.total)) == 3
    finally:
        await cl.close()


async def test_an_offline_restore_takes_a_cleanly_stopped_node_whose_log_is_applied(tmp_path: Path) -> None:
    """The refusal above is for a log past the state: a node stopped cleanly with no
    state (its log's entries, a bootstrap's, all applied) still takes a restore."""
    cl = Cluster(tmp_path / "run", HOLD, RaftNode)
    await cl.start("n1")
    await cl.wait_leader()
    await cl.close()
    target = node_dir(tmp_path / "data", "n1") / "doq.lmdb"
    target.parent.mkdir(parents=True)
    shutil.move(tmp_path / "run" / "n1", target)
    bak = _empty_full_backup(tmp_path / "empty.bak", tmp_path / "source")
    res = restore_offline(tmp_path / "data", "n1", bak)
    assert res.records == 0
