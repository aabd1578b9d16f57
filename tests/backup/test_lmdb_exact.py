"""Exactness with the real LMDB StateStore: full + incrementals restore the live state
byte for byte (`dump_state_bytes`), deletions included."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from doq.backup.format import BackupReader
from doq.backup.ops import restore_offline, write_backup
from doq.errors import FailedPrecondition, InvalidArgument
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore


class Live:
    """A real StateStore fed with command batches, one log entry per `apply`."""

    def __init__(self, path: Path, **kw: object) -> None:
        self.env = open_env(path, map_size=256 * 1024**2)
        self.state = StateStore(self.env, **kw)  # type: ignore[arg-type]
        self.state.ensure_cluster_id()  # as a node bootstrapping its cluster: restores adopt it
        self.now = 1_700_000_000_000

    def apply(self, *cmds: c.Command) -> list[object]:
        self.now += 1000
        index = self.state.applied_index + 1
        with self.state.write() as txn:
            return self.state.apply_entries(txn, [(index, encode_batch(c.CommandBatch(self.now, list(cmds))))])[0]

    def backup(self, since: int, path: Path) -> int:
        with open(path, "wb") as f:
            return write_backup(self.state, since, f, node_id="live", frame_bytes=4096)


def _populate(live: Live, n: int = 300) -> None:
    live.apply(c.CreateQueue("jobs", "delayed", QueueSettings(max_attempts=3)),
               c.CreateQueue("fair", "fair", QueueSettings()))
    for i in range(0, n, 50):
        live.apply(c.Enqueue("jobs", [c.EnqueueItem(b"job-%d" % j, priority=j % 7, dedup_id=f"d{j}")
                                      for j in range(i, i + 50)]))
        live.apply(c.Enqueue("fair", [c.EnqueueItem(b"f-%d" % j, group=f"g{j % 3}") for j in range(i, i + 50)]))


def _ids(results: list[object]) -> list[int]:
    return [m.id for m in results[0]]  # type: ignore[attr-defined]


def _open_restored(data_dir: Path, node_id: str) -> tuple[object, StateStore]:
    env = open_env(node_dir(data_dir, node_id) / "doq.lmdb", map_size=256 * 1024**2)
    return env, StateStore(env)


def test_full_and_incrementals_restore_byte_identical_state(tmp_path: Path):
    live = Live(tmp_path / "live")
    _populate(live)
    leased = _ids(live.apply(c.Dequeue("jobs", max_messages=20)))
    live.apply(c.Ack("jobs", leased[:10]))
    live.apply(c.Dequeue("fair", max_messages=5, ack=True))
    last0 = live.backup(0, tmp_path / "b0.bak")
    assert last0 == live.state.applied_index

    # deletions of every kind after the full backup
    live.apply(c.DeleteMessage("jobs", leased[10]), c.Ack("jobs", leased[11:15]))
    live.apply(c.Nack("jobs", leased[15], delay_ms=5000), c.UpdatePriority("jobs", leased[16], -5))
    live.apply(c.DeleteQueue("fair"))
    last1 = live.backup(last0 + 1, tmp_path / "b1.bak")
    assert last1 > last0

    live.apply(c.CreateQueue("fair", "fair", QueueSettings()))
    live.apply(c.Enqueue("fair", [c.EnqueueItem(b"again")]), c.PurgeQueue("jobs"))
    last2 = live.backup(last1 + 1, tmp_path / "b2.bak")
    last3 = live.backup(last2 + 1, tmp_path / "b3.bak")  # nothing changed: empty incremental
    assert last3 == last2
    with open(tmp_path / "b3.bak", "rb") as f:
        assert BackupReader(f).verify().record_count == 0

    res = restore_offline(tmp_path / "data", "node-7", tmp_path / "b0.bak",
                          [tmp_path / "b1.bak", tmp_path / "b2.bak", tmp_path / "b3.bak"])
    assert res.tombstones > 0 and res.to_version == live.state.applied_index

    env, restored = _open_restored(tmp_path / "data", "node-7")
    try:
        assert restored.applied_index == live.state.applied_index
        assert restored.dump_state_bytes() == live.state.dump_state_bytes()
        assert restored.list_queues() == live.state.list_queues()
        # and a backup of the restored node is the same set of records
        a, b = io.BytesIO(), io.BytesIO()
        write_backup(live.state, 0, a)
        write_backup(restored, 0, b)
        a.seek(0)
        b.seek(0)
        assert list(BackupReader(a).records()) == list(BackupReader(b).records())
    finally:
        env.close()  # type: ignore[attr-defined]


def test_restored_node_keeps_versioning_forward(tmp_path: Path):
    live = Live(tmp_path / "live")
    _populate(live, 100)
    last = live.backup(0, tmp_path / "b0.bak")
    restore_offline(tmp_path / "data", "n1", tmp_path / "b0.bak")
    env, restored = _open_restored(tmp_path / "data", "n1")
    try:
        assert restored.applied_index == last
        # the node's next entry gets index applied+1: an incremental from since=last+1 holds it
        with restored.write() as txn:
            restored.apply_entries(txn, [(last + 1, encode_batch(c.CommandBatch(live.now + 1, [c.Enqueue("jobs", [c.EnqueueItem(b"new")])])))])
        buf = io.BytesIO()
        assert write_backup(restored, last + 1, buf) == last + 1
    finally:
        env.close()  # type: ignore[attr-defined]


def test_restore_into_a_used_data_dir_is_refused(tmp_path: Path):
    live = Live(tmp_path / "live")
    _populate(live, 50)
    live.backup(0, tmp_path / "b0.bak")
    restore_offline(tmp_path / "data", "n1", tmp_path / "b0.bak")
    with pytest.raises(FailedPrecondition, match="not empty"):
        restore_offline(tmp_path / "data", "n1", tmp_path / "b0.bak")


def test_gap_is_refused_before_the_data_dir_is_touched(tmp_path: Path):
    live = Live(tmp_path / "live")
    _populate(live, 50)
    last = live.backup(0, tmp_path / "b0.bak")
    live.apply(c.Enqueue("jobs", [c.EnqueueItem(b"x")]))
    live.apply(c.Enqueue("jobs", [c.EnqueueItem(b"y")]))
    live.backup(last + 2, tmp_path / "b1.bak")
    with pytest.raises(InvalidArgument, match="gap in the backup chain"):
        restore_offline(tmp_path / "data", "n1", tmp_path / "b0.bak", [tmp_path / "b1.bak"])
    assert not (tmp_path / "data").exists()


def test_since_below_the_tombstone_horizon_is_refused(tmp_path: Path):
    live = Live(tmp_path / "live", tombstone_retention=10)
    _populate(live, 50)
    for _ in range(1100):  # pruning runs at multiples of PRUNE_EVERY (1024)
        live.apply(c.Tick())
    assert live.state.horizon() > 5
    with pytest.raises(InvalidArgument) as e:
        live.backup(5, tmp_path / "old.bak")
    assert e.value.reason == "SINCE_TOO_OLD"
