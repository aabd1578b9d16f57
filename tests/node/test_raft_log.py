"""LmdbLogStorage on real LMDB files: restart recovery, truncation, compaction (bounded per
txn), snapshot metas without stored data (the data offered in memory), the older layout's
snapshot data, and the same behaviour as the in-memory storage of doq/raft on random
operation sequences."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doq.node.cluster import MemberAddrs
from doq.node.raft_log import FIRST_KEY, SNAP_DATA_KEY, SNAP_KEY, LmdbLogStorage
from doq.raft import (
    CompactedError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Snapshot,
    SnapshotMeta,
    SnapshotTemporarilyUnavailable,
    UnavailableError,
    codec,
)
from doq.storage.env import open_env

BOOT = Snapshot(SnapshotMeta(1, 1, ConfState(("a",))), b"boot")


def _env(path: Path) -> lmdb.Environment:
    return open_env(path, map_size=1 << 28)


def _write(env: lmdb.Environment, fn: object, *args: object) -> None:
    with env.begin(write=True) as txn:
        fn(txn, *args)  # type: ignore[operator]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[lmdb.Environment]:
    e = _env(tmp_path / "db")
    yield e
    e.close()


def ents(lo: int, *terms: int) -> list[Entry]:
    return [Entry(t, lo + i, EntryType.NORMAL, b"d%d" % (lo + i)) for i, t in enumerate(terms)]


def view(s: LmdbLogStorage | MemoryStorage) -> tuple[object, ...]:
    """Everything the core can read (of a snapshot: its meta; the LMDB storage keeps no data)."""
    first, last = s.first_index(), s.last_index()
    terms = [s.term(i) for i in range(first - 1, last + 1)]
    es = s.entries(first, last + 1, 1 << 30) if last >= first else []
    meta = s.snapshot_meta() if isinstance(s, LmdbLogStorage) else s.snapshot().meta
    return s.initial_state(), first, last, terms, es, meta


def test_restart_recovers_term_vote_log_snapshot_and_members(tmp_path: Path) -> None:
    env = _env(tmp_path / "db")
    st1 = LmdbLogStorage(env)
    assert st1.is_empty()
    members = {"a": MemberAddrs("h:1", "h:2", "h:3")}
    with env.begin(write=True) as txn:
        st1.apply_snapshot(txn, BOOT)
        st1.set_hard_state(txn, HardState(1, "", 1))
        st1.set_members(txn, members)
    _write(env, st1.append, ents(2, 1, 1, 2, 2))
    _write(env, st1.set_hard_state, HardState(2, "a", 4))
    before = view(st1)
    env.close()
    env = _env(tmp_path / "db")
    st2 = LmdbLogStorage(env)
    assert not st2.is_empty()
    assert view(st2) == before
    assert st2.initial_state() == (HardState(2, "a", 4), ConfState(("a",)))
    assert st2.members == members
    env.close()


def test_conflicting_suffix_is_truncated_durably(tmp_path: Path) -> None:
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, ents(2, 1, 1, 1, 1))  # 2..5
    _write(env, s.append, ents(4, 3))  # conflicts at 4: drops 4 and 5
    assert s.last_index() == 4 and s.term(4) == 3
    with pytest.raises(UnavailableError):
        s.term(5)
    with pytest.raises(UnavailableError):
        s.entries(2, 6, 1 << 20)
    env.close()
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env)
    assert s.last_index() == 4 and [e.term for e in s.entries(2, 5, 1 << 20)] == [1, 1, 3]
    with pytest.raises(UnavailableError):
        _write(env, s.append, ents(6, 3))  # a gap
    env.close()


def test_compaction_keeps_the_term_of_the_compaction_point(tmp_path: Path) -> None:
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env, cache_entries=2)  # reads go to LMDB, not only the cache
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, ents(2, 1, 2, 2, 3, 3))  # 2..6
    with pytest.raises(ValueError):
        _write(env, s.compact, 3)  # beyond the snapshot
    snap = Snapshot(SnapshotMeta(4, 2, ConfState(("a",))), b"state@4")
    with env.begin(write=True) as txn:
        s.create_snapshot(txn, snap)
        s.compact(txn, 4)
    assert (s.first_index(), s.last_index(), s.term(4)) == (5, 6, 2)
    with pytest.raises(CompactedError):
        s.entries(4, 6, 1 << 20)
    with pytest.raises(CompactedError):
        s.term(3)
    env.close()
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env)
    assert (s.first_index(), s.last_index(), s.term(4), s.term(6)) == (5, 6, 2, 3)
    assert s.snapshot_meta() == snap.meta
    with env.begin() as txn:  # the compacted entries are gone from the file
        assert txn.stat(s._log)["entries"] == 2
    env.close()


def test_applied_snapshot_replaces_the_log(env: lmdb.Environment) -> None:
    s = LmdbLogStorage(env)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, ents(2, 1, 1, 1))
    leader_snap = Snapshot(SnapshotMeta(10, 4, ConfState(("a", "b"), ("c",))), b"x" * 5000)
    _write(env, s.apply_snapshot, leader_snap)
    assert (s.first_index(), s.last_index(), s.term(10)) == (11, 10, 4)
    assert s.snapshot_meta() == leader_snap.meta
    assert s.initial_state()[1] == ConfState(("a", "b"), ("c",))
    _write(env, s.apply_snapshot, BOOT)  # older: ignored
    assert s.snapshot_meta() == leader_snap.meta


def test_compaction_discards_at_most_max_entries_per_txn_and_survives_a_reopen(
        tmp_path: Path) -> None:
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env, cache_entries=4)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, ents(2, *([1] * 5 + [2] * 15)))  # 2..21
    with env.begin(write=True) as txn:
        s.create_snapshot(txn, Snapshot(SnapshotMeta(18, 2, ConfState(("a",)))))
    counted = []
    for _ in range(2):
        with env.begin(write=True) as txn:
            counted.append(s.compact(txn, 15, max_entries=4))
    assert counted == [4, 4] and (s.first_index(), s.term(9)) == (10, 2)
    with pytest.raises(CompactedError):
        s.term(8)
    env.close()  # a crash between two compaction txns: each one is whole
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env, cache_entries=4)
    assert (s.first_index(), s.last_index(), s.term(9), s.snapshot_meta().index) == (10, 21, 2, 18)
    with env.begin(write=True) as txn:
        assert s.compact(txn, 15, max_entries=4) == 4
    with env.begin(write=True) as txn:
        assert s.compact(txn, 15, max_entries=4) == 2  # up to the target, not beyond
    with env.begin(write=True) as txn:
        assert s.compact(txn, 15, max_entries=4) == 0
        assert s.compact(txn, 15, max_entries=0) == 0
    assert (s.first_index(), s.term(15)) == (16, 2)
    with env.begin() as txn:
        assert txn.stat(s._log)["entries"] == 6
    assert [e.index for e in s.entries(16, 22, 1 << 20)] == list(range(16, 22))
    env.close()


def test_snapshot_data_is_never_stored_only_offered_in_memory(env: lmdb.Environment) -> None:
    s = LmdbLogStorage(env)
    _write(env, s.apply_snapshot, Snapshot(BOOT.meta, b"data of the bootstrap"))
    _write(env, s.append, ents(2, 1, 1, 1, 1, 1))  # 2..6
    _write(env, s.create_snapshot, Snapshot(SnapshotMeta(4, 1, ConfState(("a",))), b"state@4"))
    with env.begin() as txn:
        assert txn.get(SNAP_DATA_KEY, db=s._meta) is None
    assert not s.snapshot_wanted
    with pytest.raises(SnapshotTemporarilyUnavailable):
        s.snapshot()
    assert s.snapshot_wanted  # the driver produces the data
    offered = Snapshot(SnapshotMeta(5, 1, ConfState(("a",))), b"state@5")
    s.offer_snapshot(offered)
    assert not s.snapshot_wanted and s.snapshot() == offered
    _write(env, s.compact, 4)
    assert s.snapshot() == offered  # the log still holds what follows it
    _write(env, s.create_snapshot, Snapshot(SnapshotMeta(6, 1, ConfState(("a",)))))
    _write(env, s.compact, 6)
    assert s.first_index() == 6 and s.snapshot() == offered  # held at the offered data
    s.release_snapshot()  # no follower needs it any more
    assert s.compaction_hold is None
    _write(env, s.compact, 6)
    assert s.first_index() == 7
    with pytest.raises(SnapshotTemporarilyUnavailable):
        s.snapshot()  # dropped: a follower would need another one


def test_compaction_is_held_while_snapshot_data_is_produced(env: lmdb.Environment) -> None:
    s = LmdbLogStorage(env)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, ents(2, 1, 1, 1, 1, 1))  # 2..6
    _write(env, s.create_snapshot, Snapshot(SnapshotMeta(6, 1, ConfState(("a",)))))
    s.hold_compaction(3)  # data at 3 being produced
    _write(env, s.compact, 6, 2)
    _write(env, s.compact, 6, 2)
    assert s.first_index() == 4  # up to the hold, not past it
    s.offer_snapshot(Snapshot(SnapshotMeta(3, 1, ConfState(("a",))), b"state@3"))
    assert s.compaction_hold == 3 and s.snapshot().meta.index == 3
    _write(env, s.apply_snapshot, Snapshot(SnapshotMeta(9, 2, ConfState(("a",)))))
    assert s.compaction_hold is None  # a snapshot installed: the data is of no use
    s.offer_snapshot(Snapshot(SnapshotMeta(3, 1, ConfState(("a",))), b"late"))
    assert s.compaction_hold is None  # data below the installed snapshot: ignored
    with pytest.raises(SnapshotTemporarilyUnavailable):
        s.snapshot()


def test_the_older_layout_with_snapshot_data_loads_and_its_data_is_dropped(tmp_path: Path) -> None:
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env)
    meta = SnapshotMeta(7, 2, ConfState(("a", "b")))
    with env.begin(write=True) as txn:  # what an older version wrote: meta, data, compaction point
        txn.put(SNAP_KEY, codec.encode_snapshot(Snapshot(meta, b"")), db=s._meta)
        txn.put(SNAP_DATA_KEY, b"old snapshot data" * 1000, db=s._meta)
        txn.put(FIRST_KEY, (5).to_bytes(8, "big") + (2).to_bytes(8, "big"), db=s._meta)
        s.set_hard_state(txn, HardState(2, "a", 9))
    env.close()
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env)
    _write(env, s.append, ents(6, 2, 2, 2, 3))  # 6..9
    assert s.snapshot_meta() == meta and s.initial_state() == (HardState(2, "a", 9), meta.conf_state)
    assert (s.first_index(), s.term(5), s.last_index()) == (6, 2, 9)
    _write(env, s.create_snapshot, Snapshot(SnapshotMeta(9, 3, ConfState(("a", "b")))))
    with env.begin() as txn:
        assert txn.get(SNAP_DATA_KEY, db=s._meta) is None
    env.close()


def test_entries_respect_max_bytes_in_cache_and_on_disk(env: lmdb.Environment) -> None:
    s = LmdbLogStorage(env, cache_entries=3)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, [Entry(1, i, data=b"x" * 100) for i in range(2, 12)])
    assert len(s.entries(2, 12, 1)) == 1  # from disk
    assert len(s.entries(2, 12, 3 * 124)) == 3
    assert len(s.entries(9, 12, 2 * 124)) == 2  # from the cache
    assert [e.index for e in s.entries(2, 12, 1 << 20)] == list(range(2, 12))


def test_a_reopen_reads_only_the_newest_entries_its_cache_holds(env: lmdb.Environment,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A log of large entries (a fill's) is read from its end back, as far as the cache's
    byte bound: not every entry the count bound would allow, to trim them after."""
    import doq.node.raft_log as RL
    s = LmdbLogStorage(env, cache_entries=100, cache_bytes=10_000)
    _write(env, s.apply_snapshot, BOOT)
    _write(env, s.append, [Entry(1, i, data=bytes([i]) * 3000) for i in range(2, 52)])
    decoded = []
    entry = RL._entry
    monkeypatch.setattr(RL, "_entry", lambda i, v: decoded.append(i) or entry(i, v))
    again = LmdbLogStorage(env, cache_entries=100, cache_bytes=10_000)
    assert [e.index for e in again._cache] == [49, 50, 51] and again._cache_first == 49
    assert again._cache_size == 9000
    assert decoded == [51, 50, 49, 48]  # the fourth would not fit: no further
    assert [e.data[:1] for e in again.entries(47, 52, 1 << 20)] == [bytes([i]) for i in range(47, 52)]


# -- property: the same observable behaviour as MemoryStorage ---------------------------
op: st.SearchStrategy[tuple[str, int, list[int]]] = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 6), st.lists(st.integers(0, 3), min_size=1, max_size=5)),
    st.tuples(st.just("compact"), st.integers(0, 8), st.just([])),
    st.tuples(st.just("snapshot"), st.integers(0, 8), st.just([])),
    st.tuples(st.just("hs"), st.integers(0, 5), st.just([])),
)


def _cache_ok(dur: LmdbLogStorage) -> None:
    """The cache's byte count is right and within its bounds (the newest entry always kept)."""
    cache = dur._cache
    assert dur._cache_size == sum(len(e.data) for e in cache)
    assert len(cache) <= dur.cache_entries
    assert len(cache) <= 1 or dur._cache_size <= dur.cache_bytes


@settings(max_examples=40, deadline=None)
@given(st.lists(op, max_size=25), st.integers(1, 6), st.sampled_from([0, 1, 3, 6, 1 << 20]))
def test_same_behaviour_as_memory_storage(ops: list[tuple[str, int, list[int]]], cache: int,
                                          cache_bytes: int) -> None:
    """Also with a cache bounded by bytes of entry data (reads beyond it go to LMDB)."""
    with tempfile.TemporaryDirectory() as d:
        env = _env(Path(d))
        try:
            mem = MemoryStorage(voters=("a",))
            dur = LmdbLogStorage(env, cache_entries=cache, cache_bytes=cache_bytes)
            with env.begin(write=True) as txn:
                dur.apply_snapshot(txn, mem.snapshot())
                dur.set_hard_state(txn, mem.hard_state)
            for name, n, terms in ops:
                last, first = mem.last_index(), mem.first_index()
                if name == "append":
                    # the driver never truncates below a snapshot (it is committed)
                    lo = max(first, mem.snapshot().meta.index + 1, last + 1 - n)
                    base = mem.term(lo - 1)
                    es = [Entry(base + t + k, lo + k, data=b"%d" % t) for k, t in enumerate(terms)]
                    mem.append(es)
                    _write(env, dur.append, es)
                elif name == "snapshot":
                    i = min(last, first - 1 + n)
                    snap = Snapshot(SnapshotMeta(i, mem.term(i), ConfState(("a",))), b"s%d" % i)
                    mem.create_snapshot(snap)
                    _write(env, dur.create_snapshot, snap)
                elif name == "compact":
                    i = min(mem.snapshot().meta.index, first - 1 + n)
                    mem.compact(i)
                    _write(env, dur.compact, i)
                else:
                    hs = HardState(n, "a" if n % 2 else "", min(n, last))
                    mem.set_hard_state(hs)
                    _write(env, dur.set_hard_state, hs)
                assert view(dur) == view(mem)
                _cache_ok(dur)
            reopened = LmdbLogStorage(env, cache_entries=cache, cache_bytes=cache_bytes)
            _cache_ok(reopened)
            assert view(reopened) == view(mem)
        finally:
            env.close()


def test_has_conf_change_tells_what_the_entries_tell_from_cache_and_disk(tmp_path: Path) -> None:
    """`has_conf_change(lo, hi)` (a campaign's check: at a restart every entry since the
    snapshot) answers as the entries' types do, over every range, whether the entries are
    in the cache, on disk only, or both; and after a reopen (nothing cached from disk but
    the newest). The memory storage agrees."""
    env = _env(tmp_path / "db")
    s = LmdbLogStorage(env, cache_entries=3)
    mem = MemoryStorage(("a",))
    _write(env, s.apply_snapshot, BOOT)
    mem.apply_snapshot(BOOT)
    confs = {4, 9}
    log = [Entry(1, i, EntryType.CONF_CHANGE if i in confs else EntryType.NORMAL, b"x" * 5000) for i in range(2, 12)]
    _write(env, s.append, log)
    mem.append(log)
    for store in (s, LmdbLogStorage(env, cache_entries=2), mem):
        for lo in range(2, 12):
            for hi in range(lo, 13):
                want = any(lo <= i < hi for i in confs)
                assert store.has_conf_change(lo, hi) is want, (lo, hi)
        with pytest.raises(CompactedError):
            store.has_conf_change(1, 5)
    env.close()
