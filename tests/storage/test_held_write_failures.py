"""The store's side of the batched commit's failures (`StateStore.write(hold=...)`), on a real
LMDB: a direct reader waiting for a held write is woken when the write that continues it
fails, and memory readers refuse while memory is behind an answer given before a commit
(`publish_applied`) that then failed. The node's side: tests/node/test_batched_commit_faults.py."""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from doq.errors import Unavailable
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore

T0 = 1_700_000_000_000


def _entry(index: int, *cmds: c.Command) -> tuple[int, bytes]:
    return index, encode_batch(c.CommandBatch(T0 + index, list(cmds)))


def _enq(index: int) -> tuple[int, bytes]:
    return _entry(index, c.Enqueue("q", [c.EnqueueItem(b"m%d" % index)]))


def _store(path: Path) -> StateStore:
    store = StateStore(open_env(path, map_size=1 << 26))
    with store.write() as txn:
        store.apply_entries(txn, [_entry(1, c.CreateQueue("q", "delayed", QueueSettings()))])
    return store


class _FailingCommit(StateStore):
    """A store whose next `fail` commits fail as LMDB fails one on a full disk."""

    fail = 0

    def _commit(self, txn: lmdb.Transaction) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise lmdb.DiskError("planted: mdb_txn_commit: No space left on device")
        super()._commit(txn)


def test_a_reader_waiting_for_a_held_write_is_woken_when_the_write_continuing_it_fails(
        tmp_path: Path) -> None:
    """A write held open (its applies answered), a direct reader waiting for its commit
    from another thread (its owner asked, `commit_wanted`, but the next write comes
    first): that next write continues the held transaction and its commit fails, losing
    the held applies. The reader answers `Unavailable` at once instead of waiting out its
    timeout (ten minutes here) for a retry only the writer can make. Fails if only a
    failure inside `commit_held` wakes the readers."""
    store = _FailingCommit(open_env(tmp_path / "s", map_size=1 << 26))
    with store.write() as txn:
        store.apply_entries(txn, [_entry(1, c.CreateQueue("q", "delayed", QueueSettings()))])
    with store.write(durable=False, hold=lambda: True) as txn:
        store.apply_entries(txn, [_enq(2)])
    assert store.held and store.committed_index == 1 and store.applied_index == 2
    asked = threading.Event()
    store.commit_wanted = asked.set  # the owner would post a commit; the next write is first
    outcome: list[BaseException | None] = []

    def reader() -> None:
        try:
            store.wait_committed(timeout_s=600.0)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome.append(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert asked.wait(60)
    store.fail = 1
    with pytest.raises(lmdb.DiskError), store.write(durable=False, hold=lambda: True) as txn:
        store.apply_entries(txn, [_enq(3)])  # continues the held write; a reader waits: commits
    t.join(120)
    assert not t.is_alive(), "the reader still waits for a commit that failed"
    assert len(outcome) == 1 and isinstance(outcome[0], Unavailable)
    assert outcome[0].reason == "APPLY_NOT_COMMITTED"
    assert store.applied_index == 1 and not store.held  # rolled back: the caller applies again
    with store.write(durable=False) as txn:
        store.apply_entries(txn, [_enq(2), _enq(3)])
    store.wait_committed(timeout_s=600.0)
    assert store.sort_known("q", [1, 2]) == ([0, 1], [], [])


def test_memory_readers_refuse_while_behind_an_answer_whose_commit_failed(tmp_path: Path) -> None:
    """A write (not held) that answered its applies before its commit (`publish_applied`,
    as a Raft leader does) and whose commit then fails: memory is back at LMDB's state
    while the published view has not moved (it moves at the commit). `sort_known` (acks,
    nacks, touches) answers `Unavailable` (retryable) rather than calling the answered id
    unborn, until the same entry is applied again. Fails if `behind` compares only with the
    published view."""
    store = _FailingCommit(open_env(tmp_path / "s", map_size=1 << 26))
    with store.write() as txn:
        store.apply_entries(txn, [_entry(1, c.CreateQueue("q", "delayed", QueueSettings()))])
    store.fail = 1
    with pytest.raises(lmdb.DiskError), store.write(durable=False) as txn:
        out = store.apply_entries(txn, [_enq(2)])
        store.publish_applied()  # the answer (message id 1) leaves before the commit
    answered_id = out[0][0][0].id  # type: ignore[index]
    assert store.applied_index == 1 and store.behind
    with pytest.raises(Unavailable) as err:
        store.sort_known("q", [answered_id])
    assert err.value.reason == "APPLY_NOT_COMMITTED"
    assert store.oldest_enqueued_ms(["q"]) == {}
    with store.write(durable=False) as txn:  # the retry applies the same entry again
        store.apply_entries(txn, [_enq(2)])
    assert not store.behind
    assert store.sort_known("q", [answered_id]) == ([0], [], [])
