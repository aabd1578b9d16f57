"""`WalLogStorage`: the Raft log in segment files beside raft_meta in LMDB, on real files:
the same behaviour as the in-memory storage on random operation sequences (with reopens),
a snapshot's install cut short by a crash, compaction behind a durable commit only, the
move of an older doq's entries out of LMDB, and segment files without their store."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doq.node.wal_log import WalLogStorage, wal_dir
from doq.raft import (
    CompactedError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Snapshot,
    SnapshotMeta,
)
from doq.storage.env import open_env, sync_meta
from tests.node.old_layout import old_entry_count, write_old_layout

BOOT = Snapshot(SnapshotMeta(1, 1, ConfState(("a",))), b"")
SMALL = 8192


def _env(path: Path) -> lmdb.Environment:
    return open_env(path, map_size=1 << 28)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[lmdb.Environment]:
    e = _env(tmp_path / "db")
    yield e
    e.close()


def ents(lo: int, *terms: int, size: int = 40) -> list[Entry]:
    return [Entry(t, lo + i, EntryType.NORMAL, (b"d%d-" % (lo + i)) * (size // 4)) for i, t in enumerate(terms)]


def commit(env: lmdb.Environment, s: WalLogStorage, fn: object, *args: object, durable: bool = True) -> None:
    """`fn(txn, *args)` in one write transaction, then `after_commit` (as the driver)."""
    with env.begin(write=True) as txn:
        fn(txn, *args)  # type: ignore[operator]
    if durable:
        sync_meta(env)
    s.after_commit(durable)


def boot(env: lmdb.Environment, **kw: int) -> WalLogStorage:
    s = WalLogStorage(env, segment_bytes=SMALL, **kw)
    assert s.is_empty()
    commit(env, s, s.apply_snapshot, BOOT)
    commit(env, s, s.set_hard_state, HardState(1, "", 1))
    return s


def view(s: WalLogStorage | MemoryStorage) -> tuple[object, ...]:
    first, last = s.first_index(), s.last_index()
    terms = [s.term(i) for i in range(first - 1, last + 1)]
    es = s.entries(first, last + 1, 1 << 30) if last >= first else []
    meta = s.snapshot_meta() if isinstance(s, WalLogStorage) else s.snapshot().meta
    return s.initial_state(), first, last, terms, es, meta


op = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 4), st.lists(st.integers(0, 2), min_size=1, max_size=40)),
    st.tuples(st.just("snapshot"), st.integers(0, 30), st.just([])),
    st.tuples(st.just("compact"), st.integers(0, 30), st.just([])),
    st.tuples(st.just("hs"), st.integers(0, 5), st.just([])),
    st.tuples(st.just("reopen"), st.integers(0, 0), st.just([])),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(op, max_size=25), st.integers(1, 6), st.sampled_from([0, 100, 1 << 20]))
def test_same_behaviour_as_memory_storage(ops: list[tuple[str, int, list[int]]], cache: int,
                                          cache_bytes: int) -> None:
    """Appends (with conflicts), snapshots, compactions, hard states and reopens: every
    read agrees with `MemoryStorage`, with a small cache (reads go to the segments) and
    small segments (appends cross them, compaction deletes them)."""
    with tempfile.TemporaryDirectory() as d:
        env = _env(Path(d))
        try:
            mem = MemoryStorage(voters=("a",))
            dur = boot(env, cache_entries=cache, cache_bytes=cache_bytes)
            for name, n, terms in ops:
                last, first = mem.last_index(), mem.first_index()
                if name == "append":
                    lo = max(first, mem.snapshot().meta.index + 1, last + 1 - n)
                    base = mem.term(lo - 1)
                    es = [Entry(base + t + k, lo + k, data=b"%d" % t * 30) for k, t in enumerate(terms)]
                    mem.append(es)
                    dur.append(es)
                    dur.sync()
                elif name == "snapshot":
                    i = min(last, first - 1 + n)
                    snap = Snapshot(SnapshotMeta(i, mem.term(i), ConfState(("a",))), b"")
                    mem.create_snapshot(snap)
                    commit(env, dur, dur.create_snapshot, snap)
                elif name == "compact":
                    i = min(mem.snapshot().meta.index, first - 1 + n)
                    mem.compact(i)
                    commit(env, dur, dur.compact, i, durable=bool(n % 2))
                elif name == "hs":
                    hs = HardState(n, "a" if n % 2 else "", min(n, last))
                    mem.set_hard_state(hs)
                    commit(env, dur, dur.set_hard_state, hs)
                else:
                    dur.close()
                    dur = WalLogStorage(env, cache_entries=cache, cache_bytes=cache_bytes, segment_bytes=SMALL)
                assert view(dur) == view(mem)
            dur.close()
            reopened = WalLogStorage(env, cache_entries=cache, cache_bytes=cache_bytes, segment_bytes=SMALL)
            assert view(reopened) == view(mem)
            reopened.close()
        finally:
            env.close()


def test_entries_are_in_segment_files_not_in_lmdb(env: lmdb.Environment) -> None:
    s = boot(env)
    s.append(ents(2, 1, 1, 2))
    s.sync()
    with env.begin() as txn:
        assert txn.cursor(db=s._log).first() is False
    assert any(p.name.endswith(".seg") for p in wal_dir(env).iterdir())
    s.close()
    again = WalLogStorage(env, cache_entries=1)
    assert again.entries(2, 5, 1 << 20) == ents(2, 1, 1, 2)
    assert again.term(2) == 1 and again.term(4) == 2


def test_a_snapshot_install_cut_short_before_the_log_reset_is_repaired_at_open(env: lmdb.Environment) -> None:
    """A follower installs a snapshot at 20 (term 3) over a log 2..11 of term 1: its LMDB
    commit lands, the crash comes before the segment log is emptied. Reopened, the log
    starts after the snapshot: none of the old entries is taken for one after it."""
    s = boot(env)
    s.append(ents(2, *[1] * 10))
    s.sync()
    snap = Snapshot(SnapshotMeta(20, 3, ConfState(("a",))), b"")
    with env.begin(write=True) as txn:
        s.apply_snapshot(txn, snap)
    sync_meta(env)
    # no after_commit: the process died here
    s.close()
    again = WalLogStorage(env)
    assert (again.first_index(), again.last_index(), again.term(20)) == (21, 20, 3)
    again.append(ents(21, 3))
    again.sync()
    assert again.entries(21, 22, 1 << 20) == ents(21, 3)


def test_an_old_log_holding_the_snapshot_entry_of_another_term_is_dropped(env: lmdb.Environment) -> None:
    s = boot(env)
    s.append(ents(2, *[1] * 10))  # 2..11, term 1
    s.sync()
    snap = Snapshot(SnapshotMeta(6, 2, ConfState(("a",))), b"")  # entry 6 of term 2: not ours
    with env.begin(write=True) as txn:
        s.apply_snapshot(txn, snap)
    sync_meta(env)
    s.close()
    again = WalLogStorage(env)
    assert (again.first_index(), again.last_index()) == (7, 6)


def test_segments_are_deleted_only_after_a_durable_commit_of_the_compaction(env: lmdb.Environment) -> None:
    s = boot(env)
    for lo in range(2, 402, 50):
        s.append(ents(lo, *[1] * 50))
        s.sync()
    segs = s.seg.segment_count()
    assert segs > 3
    commit(env, s, s.create_snapshot, Snapshot(SnapshotMeta(300, 1, ConfState(("a",))), b""))
    commit(env, s, s.compact, 300, durable=False)  # may be undone by an OS crash
    assert s.first_index() == 301
    assert s.seg.segment_count() == segs and s.droppable()
    commit(env, s, s.set_hard_state, HardState(1, "", 300))  # a durable commit
    assert s.seg.segment_count() < segs
    assert s.seg.first_index() <= 301
    s.close()
    again = WalLogStorage(env, segment_bytes=SMALL)
    assert (again.first_index(), again.last_index()) == (301, 401)
    assert again.entries(301, 402, 1 << 30) == ents(301, *[1] * 101)
    with pytest.raises(CompactedError):
        again.entries(300, 302, 1 << 30)


def test_an_older_doqs_entries_move_from_lmdb_to_segments(env: lmdb.Environment) -> None:
    """A data dir of the previous layout (entries in LMDB's raft_log, in that layout's bytes:
    `tests.node.old_layout`) opens with the same log; the LMDB table is emptied, once; the
    entries at or below the compaction point are not moved."""
    log = ents(2, *[1] * 20, *[4] * 30, size=300)
    snap = SnapshotMeta(12, 1, ConfState(("a",)))
    write_old_layout(env, log, hard_state=HardState(4, "a", 30), snapshot=snap, first=(10, 1))
    before = ((HardState(4, "a", 30), snap.conf_state), 11, 51, [e.term for e in log[8:]], log[9:], snap)
    new = WalLogStorage(env, segment_bytes=SMALL)
    assert new.migrated_entries == 41  # 11..51 (2..10 were compacted)
    assert view(new) == before
    assert old_entry_count(env) == 0
    new.close()
    again = WalLogStorage(env, segment_bytes=SMALL)
    assert again.migrated_entries == 0
    assert view(again) == before


def test_segment_files_without_their_store_are_discarded(tmp_path: Path) -> None:
    """The LMDB store replaced by an empty one (its files deleted) next to old segment
    files: the log starts empty, as the store does."""
    env = _env(tmp_path / "db")
    s = boot(env)
    s.append(ents(2, 1, 1))
    s.sync()
    s.close()
    env.close()
    for name in ("data.mdb", "lock.mdb"):
        (tmp_path / "db" / name).unlink()
    env = _env(tmp_path / "db")
    fresh = WalLogStorage(env)
    assert fresh.is_empty()
    assert (fresh.first_index(), fresh.last_index()) == (1, 0)
    env.close()


def test_a_log_missing_entries_after_the_compaction_point_is_refused(env: lmdb.Environment) -> None:
    s = boot(env)
    s.append(ents(2, 1, 1, 1))
    s.sync()
    s.seg.reset(10)  # as if entries 2..9 were lost
    s.close()
    with pytest.raises(RuntimeError, match="entries are missing"):
        WalLogStorage(env)


def test_append_waits_for_a_snapshot_install_to_commit(env: lmdb.Environment) -> None:
    s = boot(env)
    with env.begin(write=True) as txn:
        s.apply_snapshot(txn, Snapshot(SnapshotMeta(5, 2, ConfState(("a",))), b""))
        with pytest.raises(RuntimeError):
            s.append(ents(6, 2))
    sync_meta(env)
    s.after_commit(True)
    s.append(ents(6, 2))
    s.sync()
    assert s.entries(6, 7, 100) == ents(6, 2)
    assert s.has_conf_change(6, 7) is False
    s.append([Entry(2, 7, EntryType.CONF_CHANGE, b"")])
    assert s.has_conf_change(6, 8) is True


def test_a_closed_log_still_tells_its_last_index(env: lmdb.Environment) -> None:
    """A stopped node's status page may still ask."""
    s = boot(env)
    s.append(ents(2, 1, 1))
    s.sync()
    s.close()
    assert s.last_index() == 3


def test_has_conf_change_reads_the_segments_past_the_cache(env: lmdb.Environment) -> None:
    """With a cache of one entry, the check reads each entry's kind from the files."""
    s = boot(env, cache_entries=1)
    s.append(ents(2, *[2] * 40, size=400))
    s.append([Entry(2, 42, EntryType.CONF_CHANGE, b"")])
    s.append(ents(43, *[2] * 40, size=400))
    s.sync()
    assert s.seg.segment_count() > 1
    for lo, hi, want in [(2, 42, False), (2, 43, True), (42, 43, True), (43, 83, False), (30, 60, True)]:
        assert s.has_conf_change(lo, hi) is want, (lo, hi)
