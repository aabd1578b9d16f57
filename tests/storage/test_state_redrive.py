"""Redrive tasks in the StateStore on real LMDB: the task record is a replicated record like
the queues' — in the digest and in backups' changes (a restore brings it back, an
incremental carries its changes and, when the dead-letter queue goes, its tombstone),
carried by Raft snapshots, rebuilt on reopen, published to readers in the view."""

from __future__ import annotations

from pathlib import Path

from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.queues.redrive import CancelRedrive, StartRedrive
from doq.storage.env import open_env
from doq.storage.state import StateStore


def _apply(st: StateStore, index: int, now_ms: int, *cmds: c.Command) -> list[object]:
    with st.write() as txn:
        return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(now_ms, list(cmds))))])[0]


def _store(path: Path) -> StateStore:
    return StateStore(open_env(path, map_size=1 << 28))


def _running(st: StateStore) -> None:
    _apply(st, 1, 1000, c.CreateQueue("dlq", "delayed", QueueSettings()),
           c.CreateQueue("src", "fair", QueueSettings(max_attempts=1, dead_letter_queue="dlq")))
    _apply(st, 2, 1000, c.Enqueue("dlq", [c.EnqueueItem(b"m%d" % i, group="g") for i in range(10)]))
    _apply(st, 3, 1000, StartRedrive("dlq", "", 2))  # one at once, then 2/s
    _apply(st, 4, 2000, c.Tick())


def test_the_task_is_a_record_of_backups_digest_snapshots_and_reopen(tmp_path: Path) -> None:
    st = _store(tmp_path / "a")
    _running(st)
    task = st.view.redrives["dlq"]
    assert (task.state, task.moved, task.to) == ("running", 3, "src")
    assert st.get_queue("src").stats.ready == 3
    changes = list(st.iter_changes(0))
    assert any(k == K.redrive_key("dlq") for k, _, _ in changes)

    restored = _store(tmp_path / "b")  # a restore of the backup's records
    restored.restore(changes, 4)
    assert restored.view.redrives == st.view.redrives
    assert restored.state_digest()[1] == st.state_digest()[1]

    snap = _store(tmp_path / "c")  # a Raft snapshot
    with snap.write() as txn:
        snap.install_snapshot(txn, st.dump_state_bytes())
    assert snap.view.redrives == st.view.redrives and snap.dump_state_bytes() == st.dump_state_bytes()

    # every copy goes on identically from the same entries
    for s in (st, restored, snap):
        _apply(s, 5, 3500, c.Tick())
        _apply(s, 6, 3600, CancelRedrive("dlq"))
    assert {s.dump_state_bytes() for s in (st, restored, snap)} == {st.dump_state_bytes()}
    assert st.view.redrives["dlq"].state == "cancelled" and st.view.redrives["dlq"].moved == 6

    st.env.close()
    reopened = _store(tmp_path / "a")
    assert reopened.view.redrives["dlq"].moved == 6 and reopened.view.redrives["dlq"].state == "cancelled"
    before = reopened.state_digest()[0]
    _apply(reopened, 7, 4000, c.DeleteQueue("dlq"))
    inc = list(reopened.iter_changes(before + 1))
    assert (K.redrive_key("dlq"), None) in [(k, v) for k, v, _ in inc]  # an incremental carries its tombstone
    assert "dlq" not in reopened.view.redrives
    for s in (reopened, restored, snap):
        s.env.close()


def test_a_store_without_redrive_records_is_unchanged(tmp_path: Path) -> None:
    """A state that never had a redrive (an older version's data dir or backup) holds no
    `R` record and loads as before."""
    st = _store(tmp_path / "a")
    _apply(st, 1, 1000, c.CreateQueue("q", "delayed", QueueSettings()))
    assert dict(st.view.redrives) == {}
    assert not any(k[0] == K.REDRIVE for k, _, _ in st.iter_changes(0))
    st.env.close()
