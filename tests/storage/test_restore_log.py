"""StateStore: an online restore through the log (RestoreChunk / RestoreCommit / RestoreAbort
entries) on real LMDB: staging, the all-or-nothing commit, identical outcomes on replicas,
the staging carried by `open_read` / `replace_records` (a Raft snapshot), and versions that
keep growing after the restore."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lmdb
import pytest

from doq.errors import DoqError, InvalidArgument
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.chunks import iter_chunks
from doq.storage.env import open_env
from doq.storage.state import STAGE_CHUNK, STAGE_KEY, Record, RestoreOutcome, StateStore
from tests.storage.workload import T0, entries

RID, OTHER = b"r" * 16, b"o" * 16


def _open(path: Path) -> tuple[lmdb.Environment, StateStore]:
    env = open_env(path, map_size=1 << 30)
    return env, StateStore(env)


def _apply(st: StateStore, ents: Sequence[tuple[int, bytes]]) -> list[list[object]]:
    with st.write() as txn:
        return st.apply_entries(txn, ents)


def _entry(index: int, *cmds: c.Command, now: int = T0) -> tuple[int, bytes]:
    return index, encode_batch(c.CommandBatch(now, list(cmds)))


def _source(path: Path, n: int = 400) -> tuple[StateStore, list[Record]]:
    """A live store after `n` workload entries, and its full backup's records."""
    _, st = _open(path)
    for i in range(0, n, 50):
        _apply(st, entries(seed=3, n=n)[i : i + 50])
    _, it = st.changes(0)
    return st, list(it)


def _restore_entries(records: list[Record], start: int, to_version: int, *, rid: bytes = RID,
                     chunk_bytes: int = 2000) -> list[tuple[int, bytes]]:
    """The entries a leader proposes: chunks from index `start`, then the commit."""
    chunks = list(iter_chunks(records, chunk_bytes))
    out = [_entry(start + i, c.RestoreChunk(rid, i, p)) for i, (p, _) in enumerate(chunks)]
    out.append(_entry(start + len(chunks), c.RestoreCommit(rid, len(chunks), len(records), to_version)))
    return out


def _staged(st: StateStore) -> list[bytes]:
    with st.env.begin() as txn:
        return [bytes(k) for k, _ in txn.cursor(db=st._meta).iternext()
                if k == STAGE_KEY or k[: len(STAGE_CHUNK)] == STAGE_CHUNK]


def _digest(st: StateStore) -> int:
    return st.state_digest()[1]


def test_chunks_then_commit_restore_what_a_direct_restore_does_on_every_replica(tmp_path: Path) -> None:
    src, records = _source(tmp_path / "src")
    ents = _restore_entries(records, 3, src.applied_index)
    assert len(ents) > 5  # several chunks
    _, direct = _open(tmp_path / "direct")
    direct.restore(records, src.applied_index)
    _, a = _open(tmp_path / "a")
    _, b = _open(tmp_path / "b")
    _apply(a, [(1, b""), (2, b"")])  # a cluster's first entries: Raft no-ops
    _apply(b, [(1, b""), (2, b"")])
    results_a = [r for i in range(0, len(ents), 3) for r in _apply(a, ents[i : i + 3])]
    results_b = _apply(b, ents)  # other txn boundaries (group commit)
    assert results_a == results_b
    assert results_a[:-1] == [[None]] * (len(ents) - 1)
    outcome = results_a[-1][0]
    assert isinstance(outcome, RestoreOutcome)
    assert outcome.records == len(records) and outcome.tombstones == sum(r[1] is None for r in records)
    assert outcome.to_version == src.applied_index  # the chain is ahead of this log
    assert _digest(a) == _digest(b) == _digest(direct) == _digest(src)
    assert list(a.iter_changes(0)) == list(direct.iter_changes(0))
    assert a.list_queues() == src.list_queues() and a.next_due_ms() == src.next_due_ms()
    assert a.dump_state_bytes() == b.dump_state_bytes()
    assert _staged(a) == [] and a.applied_index == ents[-1][0]


def test_versions_after_the_restore_exceed_the_restored_ones(tmp_path: Path) -> None:
    src, records = _source(tmp_path / "src")
    to_version = src.applied_index
    env, st = _open(tmp_path / "a")
    ents = _restore_entries(records, 1, to_version)
    _apply(st, ents)
    assert st.version_offset == to_version - ents[-1][0] > 0
    assert st.state_digest()[0] == to_version  # the version the digest belongs to
    nxt = ents[-1][0] + 1
    _apply(st, [_entry(nxt, c.Enqueue("d", [c.EnqueueItem(b"after")]), now=T0 + 10**6)])
    changes = list(st.iter_changes(to_version + 1))
    assert changes and {v for _, _, v in changes} == {to_version + 1}
    assert st.changes(0)[0] == to_version + 1  # a backup's to_version
    # reopening keeps the offset: the next entry's version follows
    env.close()
    env, st = _open(tmp_path / "a")
    _apply(st, [_entry(nxt + 1, c.Tick(), now=T0 + 2 * 10**6)])
    assert {v for _, _, v in st.iter_changes(to_version + 2)} == {to_version + 2}


def test_a_chain_behind_the_log_keeps_versions_as_they_are(tmp_path: Path) -> None:
    src, records = _source(tmp_path / "src", n=60)
    _, st = _open(tmp_path / "a")
    _apply(st, [(i, b"") for i in range(1, 201)])  # the log is ahead of the chain
    outcome = _apply(st, _restore_entries(records, 201, src.applied_index))[-1][0]
    assert isinstance(outcome, RestoreOutcome)
    assert st.version_offset == 0 and outcome.to_version == st.applied_index > src.applied_index
    assert _digest(st) == _digest(src)


def _failed(result: list[object], reason: str) -> None:
    assert isinstance(result[0], DoqError) and result[0].reason == reason, result


def test_a_commit_into_a_non_empty_state_fails_identically_and_changes_nothing(tmp_path: Path) -> None:
    _, records = _source(tmp_path / "src")
    ents = _restore_entries(records, 2, 400)
    write = _entry(1 + len(ents), c.CreateQueue("mine", "delayed", QueueSettings()))
    ents = [*ents[:-1], write, (ents[-1][0] + 1, ents[-1][1])]  # a write before the commit
    dumps = []
    for name in ("a", "b"):
        _, st = _open(tmp_path / name)
        res = _apply(st, [(1, b""), *ents])
        _failed(res[-1], "RESTORE_TARGET_NOT_EMPTY")
        assert [q.name for q in st.list_queues()] == ["mine"] and _staged(st) == []
        dumps.append(st.dump_state_bytes())
    assert dumps[0] == dumps[1]


@pytest.mark.parametrize("case", ["missing", "out_of_order", "other_id", "count", "aborted"])
def test_an_incomplete_staging_fails_the_commit_and_is_discarded(tmp_path: Path, case: str) -> None:
    _, records = _source(tmp_path / "src")
    ents = _restore_entries(records, 1, 400)
    chunks, commit = ents[:-1], ents[-1]
    n = len(chunks)
    if case == "missing":  # a chunk lost (e.g. the leader changed): the commit sees too few
        ents = [*chunks[:-1], commit]
    elif case == "out_of_order":
        ents = [chunks[1], chunks[0], *chunks[2:], commit]
    elif case == "other_id":  # the commit of a restore whose chunks were discarded
        ents = [*chunks, _entry(commit[0], c.RestoreCommit(OTHER, n, len(records), 400))]
    elif case == "count":
        ents = [*chunks, _entry(commit[0], c.RestoreCommit(RID, n, len(records) + 1, 400))]
    else:
        ents = [*chunks, _entry(commit[0], c.RestoreAbort(RID)), (commit[0] + 1, commit[1])]
    ents = [(i + 1, data) for i, (_, data) in enumerate(ents)]  # consecutive indexes
    _, st = _open(tmp_path / "a")
    res = _apply(st, ents)
    if case == "out_of_order":
        _failed(res[0], "RESTORE_INCOMPLETE")  # the proposer learns it at once
    _failed(res[-1], "RESTORE_INCOMPLETE")
    assert st.is_empty() and st.list_queues() == [] and _staged(st) == [] and st.version_offset == 0


def test_a_new_restore_discards_an_abandoned_staging(tmp_path: Path) -> None:
    src, records = _source(tmp_path / "src")
    _, st = _open(tmp_path / "a")
    abandoned = _restore_entries(records, 1, 400, rid=OTHER)[:3]  # its leader died
    _apply(st, abandoned)
    assert len(_staged(st)) == 4  # the header and three chunks
    res = _apply(st, _restore_entries(records, 4, src.applied_index))
    assert isinstance(res[-1][0], RestoreOutcome) and _digest(st) == _digest(src) and _staged(st) == []


def test_records_that_do_not_form_a_state_fail_and_later_entries_apply(tmp_path: Path) -> None:
    """The commit's records go into a nested txn: a refusal rolls back only them, and the
    entries after it in the same txn apply on the state as it was."""
    _, records = _source(tmp_path / "src")
    orphans = [r for r in records if r[0][:1] != b"Q"]  # messages of unknown queues
    ents = _restore_entries(orphans, 1, 400)
    after = _entry(len(ents) + 1, c.CreateQueue("q", "delayed", QueueSettings()))
    _, st = _open(tmp_path / "a")
    _, ref = _open(tmp_path / "ref")
    res = _apply(st, [*ents, after])
    _failed(res[-2], "BACKUP_INCONSISTENT")
    _apply(ref, [(i, b"") for i in range(1, len(ents) + 1)] + [after])
    assert st.dump_state_bytes() == ref.dump_state_bytes()
    assert [q.name for q in st.list_queues()] == ["q"] and st.version_offset == 0


def test_a_store_that_installs_a_snapshot_mid_restore_commits_the_same(tmp_path: Path) -> None:
    """`open_read` carries the staging (and the version offset): a follower that replaces its
    state by it mid-restore stages exactly what the leader does."""
    src, records = _source(tmp_path / "src")
    ents = _restore_entries(records, 1, src.applied_index)
    half = len(ents) // 2
    _, lead = _open(tmp_path / "leader")
    _apply(lead, ents[:half])
    read = lead.open_read()
    snap_records = list(read.records)
    assert any(k.startswith(STAGE_CHUNK) for k in read.store_keys) and STAGE_KEY in read.store_keys
    _, follower = _open(tmp_path / "follower")
    _apply(follower, entries(seed=5, n=20))  # other history, replaced by the snapshot
    with follower.write() as txn:
        follower.replace_records(txn, snap_records, read.applied_index, read.store_keys)
    assert follower.dump_state_bytes() == lead.dump_state_bytes()
    assert _apply(lead, ents[half:]) == _apply(follower, ents[half:])
    assert _digest(follower) == _digest(lead) == _digest(src)
    assert follower.dump_state_bytes() == lead.dump_state_bytes()
    read = lead.open_read()  # after the commit: the offset travels too
    list(read.records)
    assert read.version == src.applied_index and read.applied_index == ents[-1][0]


def test_a_refused_record_key_fails_the_commit(tmp_path: Path) -> None:
    _, st = _open(tmp_path / "a")
    bad: list[Record] = [(b"\x00applied", b"x", 1)]  # a store key: never a record
    res = _apply(st, _restore_entries(bad, 1, 1))
    _failed(res[-1], "INVALID_RECORD")
    assert st.is_empty() and st.applied_index == 2


def test_restore_commands_inside_a_batch_of_others_are_refused_by_the_machine(tmp_path: Path) -> None:
    _, st = _open(tmp_path / "a")
    res = _apply(st, [_entry(1, c.CreateQueue("q", "delayed", QueueSettings()), c.RestoreAbort(RID))])
    assert isinstance(res[0][1], InvalidArgument) and [q.name for q in st.list_queues()] == ["q"]



def test_a_to_version_out_of_range_is_refused(tmp_path: Path) -> None:
    """Versions after the restore must stay below 2**64: a chain claiming a to_version of
    2**63 or more restores nothing (else every later entry would overflow its version)."""
    _, records = _source(tmp_path / "src", n=60)
    _, st = _open(tmp_path / "a")
    res = _apply(st, _restore_entries(records, 1, 2**63))
    _failed(res[-1], "INVALID_INDEX")
    assert st.is_empty() and st.version_offset == 0


def test_the_commit_adopts_the_chains_cluster_id(tmp_path: Path) -> None:
    src, records = _source(tmp_path / "src", n=60)
    _, st = _open(tmp_path / "a")
    st.ensure_cluster_id(lambda: "young-cluster")
    ents = _restore_entries(records, 1, src.applied_index)
    bad = _entry(ents[-1][0], c.RestoreCommit(RID, len(ents) - 1, len(records), src.applied_index, "x" * 200))
    _failed(_apply(st, [*ents[:-1], bad])[-1], "INVALID_CLUSTER_ID")
    assert st.is_empty() and st.cluster_id == "young-cluster"
    ents = _restore_entries(records, bad[0] + 1, src.applied_index)
    last = ents[-1]
    commit = c.RestoreCommit(RID, len(ents) - 1, len(records), src.applied_index, "old-cluster")
    res = _apply(st, [*ents[:-1], _entry(last[0], commit)])
    assert isinstance(res[-1][0], RestoreOutcome) and st.cluster_id == "old-cluster"
    assert _digest(st) == _digest(src)


@pytest.mark.parametrize("to_version", [2**63, 2**64 - 1])
def test_a_direct_restore_refuses_the_same_to_versions(tmp_path: Path, to_version: int) -> None:
    """One bound for every restore (offline, a lone node's online one, through the log): a
    state restored at 2**63 or more could not write (versions past 2**64) nor be backed up
    incrementally (`since` < 2**63)."""
    _, records = _source(tmp_path / "src", n=60)
    _, st = _open(tmp_path / "a")
    with pytest.raises(InvalidArgument) as e:
        st.restore(iter(records), to_version)
    assert e.value.reason == "INVALID_INDEX" and st.is_empty() and st.applied_index == 0


@pytest.mark.parametrize("tombstone", [False, True])
def test_a_record_key_too_long_for_lmdb_fails_the_commit_not_the_replica(
        tmp_path: Path, tombstone: bool) -> None:
    """A (crafted) chain whose checksums hold but one of whose keys LMDB cannot store: the
    commit is refused like any bad record (INVALID_RECORD), on every replica, and the next
    entries apply. Raised from the apply instead, the error stopped every replica, again
    after each restart (the commit entry stays in the log)."""
    name = b"x" * 600
    bad: list[Record] = [(b"Q" + len(name).to_bytes(2, "big") + name, None if tombstone else b"v", 1)]
    ents = _restore_entries(bad, 1, 1)
    after = _entry(len(ents) + 1, c.CreateQueue("q", "delayed", QueueSettings()))
    _, st = _open(tmp_path / "a")
    res = _apply(st, [*ents, after])
    _failed(res[-2], "INVALID_RECORD")
    assert [q.name for q in st.list_queues()] == ["q"] and _staged(st) == []
    _, direct = _open(tmp_path / "b")
    with pytest.raises(InvalidArgument) as e:
        direct.restore(iter(bad), 1)
    assert e.value.reason == "INVALID_RECORD" and direct.is_empty()
