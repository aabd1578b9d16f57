"""StateStore on real LMDB: determinism, rebuild, idempotent replay, exact incremental changes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import lmdb
import pytest

from doq.errors import FailedPrecondition, InvalidArgument, MessageNotFound, QueueNotFound
from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import MessageState, QueueSettings
from doq.storage.env import open_env
from doq.storage.state import PRUNE_EVERY, StateStore
from tests.storage.workload import T0, entries


def _open(path: Path, **kw: int) -> tuple[lmdb.Environment, StateStore]:
    env = open_env(path, map_size=1 << 30)
    return env, StateStore(env, **kw)


def apply(env: lmdb.Environment, st: StateStore, ents: Sequence[tuple[int, bytes]], chunk: int = 1) -> list[list[object]]:
    out: list[list[object]] = []
    for i in range(0, len(ents), chunk):
        with st.write() as txn:
            out += st.apply_entries(txn, ents[i : i + chunk])
    return out


def shape(results: list[list[object]]) -> list[str]:
    """The results as text, without the queues' `counters`: those count what this process
    did since it started (the dashboard's rates), not replicated state, so a rebuilt or
    snapshot-installed replica differs there by design (QueueInfo compares without them)."""
    return [re.sub(r", counters=QueueCounters\([^)]*\)", "", repr(r)) for r in results]


WORK = entries(seed=7, n=600)


def test_two_replicas_are_byte_identical(tmp_path: Path) -> None:
    e1, s1 = _open(tmp_path / "a")
    e2, s2 = _open(tmp_path / "b")
    r1 = apply(e1, s1, WORK, chunk=1)
    r2 = apply(e2, s2, WORK, chunk=37)  # group commit: other txn boundaries
    assert shape(r1) == shape(r2)
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    assert s1.snapshot_digest() == s2.snapshot_digest()
    assert s1.applied_index == s2.applied_index == len(WORK)
    infos = s1.list_queues()
    assert infos == s2.list_queues() and infos
    assert sum(i.stats.total for i in infos) > 0  # the workload leaves messages behind


def test_reopen_rebuilds_the_same_state_and_behaviour(tmp_path: Path) -> None:
    first, rest = WORK[:300], WORK[300:]
    e1, s1 = _open(tmp_path / "a")
    e2, s2 = _open(tmp_path / "b")
    apply(e1, s1, first)
    apply(e2, s2, first)
    dump = s2.dump_state_bytes()
    infos = s2.list_queues()
    due = s2.next_due_ms()
    e2.close()
    e2, s2 = _open(tmp_path / "b")
    assert s2.applied_index == 300
    assert s2.dump_state_bytes() == dump
    assert s2.list_queues() == infos
    assert s2.next_due_ms() == due
    assert shape(apply(e1, s1, rest)) == shape(apply(e2, s2, rest))
    assert s1.dump_state_bytes() == s2.dump_state_bytes()


def test_replaying_applied_entries_is_a_no_op(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    apply(env, st, WORK[:100])
    dump = st.dump_state_bytes()
    assert apply(env, st, WORK[:100], chunk=100) == [[]] * 100
    assert st.dump_state_bytes() == dump
    with st.write() as txn:  # overlap: only the new entries apply
        res = st.apply_entries(txn, WORK[90:101])
    assert res[:10] == [[]] * 10 and st.applied_index == 101


def test_empty_entries_only_advance_the_applied_index(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    assert apply(env, st, [(1, b""), (2, b"")], chunk=2) == [[], []]
    assert st.applied_index == 2
    env.close()
    env, st = _open(tmp_path / "a")
    assert st.applied_index == 2


def _batch(index: int, now: int, *cmds: c.Command) -> tuple[int, bytes]:
    return index, encode_batch(c.CommandBatch(now, list(cmds)))


def test_reads_and_dequeue_content(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    res = apply(env, st, [
        _batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()),
               c.Enqueue("q", [c.EnqueueItem(b"hello", metadata={"m": "1"}), c.EnqueueItem(b"later", delay_ms=99)])),
        _batch(2, T0 + 1, c.Dequeue("q", 5)),
    ])
    views = res[1][0]
    assert isinstance(views, list) and len(views) == 1
    msg = views[0]
    assert (msg.content, msg.metadata, msg.state) == (b"hello", {"m": "1"}, MessageState.IN_FLIGHT)
    got = st.get_message("q", 2)
    assert (got.content, got.state, got.deliver_at_ms) == (b"later", MessageState.DELAYED, T0 + 99)
    assert st.get_message("q", 1).state is MessageState.IN_FLIGHT
    with pytest.raises(MessageNotFound):
        st.get_message("q", 3)
    with pytest.raises(QueueNotFound):
        st.get_message("nope", 1)
    with pytest.raises(QueueNotFound):
        st.get_queue("nope")
    info = st.get_queue("q")
    assert (info.stats.in_flight, info.stats.delayed, info.stats.total) == (1, 1, 2)
    assert st.next_due_ms() == T0 + 99
    assert not st.has_deliverable("q")


def _live(st: StateStore) -> list[tuple[bytes, bytes | None, int]]:
    return [ch for ch in st.iter_changes(0) if ch[1] is not None]


def _restore(path: Path, applied: int, *parts: list[tuple[bytes, bytes | None, int]]) -> tuple[lmdb.Environment, StateStore]:
    env, st = _open(path)
    st.restore([r for part in parts for r in part], applied)
    return env, st


def test_full_plus_incrementals_restore_the_exact_live_state(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK[:200])
    last0, it = st.changes(0)
    full = list(it)
    apply(env, st, WORK[200:400])
    last1, it = st.changes(last0 + 1)
    inc1 = list(it)
    apply(env, st, WORK[400:] + [_batch(len(WORK) + 1, T0 + 10**7, c.DeleteQueue("d"))])
    last2, it = st.changes(last1 + 1)
    inc2 = list(it)
    assert (last0, last1, last2) == (200, 400, len(WORK) + 1)
    assert any(v is None for _, v, _ in inc1) and any(v is None for _, v, _ in inc2)  # deletions
    assert all(ver > last1 for _, _, ver in inc2)
    assert [ver for _, _, ver in inc2] == sorted(ver for _, _, ver in inc2)
    renv, rst = _restore(tmp_path / "restored", last2, full, inc1, inc2)
    assert _live(rst) == _live(st)
    assert rst.list_queues() == st.list_queues()
    assert rst.next_due_ms() == st.next_due_ms()
    # skipping an incremental is detectable (the check can fail): the restore is refused
    # (records of a deleted queue's messages remain) or gives another state
    try:
        senv, sst = _restore(tmp_path / "skipped", last2, full, inc2)
    except InvalidArgument as e:
        assert e.reason == "BACKUP_INCONSISTENT"
    else:
        assert _live(sst) != _live(st)


def test_overwritten_records_keep_one_version_entry(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    apply(env, st, [
        _batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()), c.Enqueue("q", [c.EnqueueItem(b"x")])),
        _batch(2, T0, c.Dequeue("q")),
        _batch(3, T0, c.UpdatePriority("q", 1, 4)),
    ])
    changes = list(st.iter_changes(0))
    mkey = K.message_key("q", 1)
    assert [(k, ver) for k, _, ver in changes if k == mkey] == [(mkey, 3)]
    assert list(st.iter_changes(4)) == []


def test_since_older_than_the_tombstone_horizon_is_refused(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a", tombstone_retention=PRUNE_EVERY)
    apply(env, st, [
        _batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()), c.Enqueue("q", [c.EnqueueItem(b"x")] * 3)),
        _batch(2, T0, c.DeleteMessage("q", 1)),
    ])
    assert [k for k, v, _ in st.iter_changes(2) if v is None] == [K.message_key("q", 1)]
    apply(env, st, [(i, b"") for i in range(3, 2 * PRUNE_EVERY + 1)], chunk=500)
    assert st.horizon() == PRUNE_EVERY
    with pytest.raises(InvalidArgument) as exc:
        st.iter_changes(2)
    assert exc.value.reason == "SINCE_TOO_OLD"
    assert list(st.iter_changes(PRUNE_EVERY)) == []
    assert len(_live(st)) == len(list(st.iter_changes(0)))  # full backups stay possible
    e2, s2 = _open(tmp_path / "b", tombstone_retention=PRUNE_EVERY)
    apply(e2, s2, [
        _batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()), c.Enqueue("q", [c.EnqueueItem(b"x")] * 3)),
        _batch(2, T0, c.DeleteMessage("q", 1)),
    ] + [(i, b"") for i in range(3, 2 * PRUNE_EVERY + 1)], chunk=700)
    assert s2.dump_state_bytes() == st.dump_state_bytes()  # pruning is deterministic


def test_install_snapshot_replaces_the_state(tmp_path: Path) -> None:
    e1, s1 = _open(tmp_path / "a")
    apply(e1, s1, WORK[:250])
    e2, s2 = _open(tmp_path / "b")
    apply(e2, s2, entries(seed=99, n=30))  # some other history, to be replaced
    with s2.write() as txn:
        s2.install_snapshot(txn, s1.dump_state_bytes())
    assert s2.applied_index == 250
    assert s2.dump_state_bytes() == s1.dump_state_bytes()
    assert shape(apply(e1, s1, WORK[250:])) == shape(apply(e2, s2, WORK[250:]))
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    assert list(s1.iter_changes(0)) == list(s2.iter_changes(0))


def test_an_aborted_apply_requires_rebuild(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    apply(env, st, WORK[:50])
    dump = st.dump_state_bytes()
    txn = env.begin(write=True)
    st.apply_entries(txn, WORK[50:60])
    txn.abort()  # the caller's commit failed
    st.rebuild()
    assert st.applied_index == 50 and st.dump_state_bytes() == dump
    e2, s2 = _open(tmp_path / "b")
    apply(e2, s2, WORK[:50])
    assert shape(apply(env, st, WORK[50:])) == shape(apply(e2, s2, WORK[50:]))
    txn = env.begin(write=True)
    with pytest.raises(ValueError):
        st.apply_entries(txn, [(len(WORK) + 1, b"\x07garbage")])
    with pytest.raises(RuntimeError):  # memory is stale until rebuild
        st.apply_entries(txn, [])
    txn.abort()


def test_a_failed_write_rolls_back_and_the_next_one_works(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    apply(env, st, WORK[:50])
    dump, infos = st.dump_state_bytes(), st.list_queues()
    with pytest.raises(ValueError), st.write() as txn:
        st.apply_entries(txn, WORK[50:60])
        st.apply_entries(txn, [(61, b"\x07garbage")])
    assert st.applied_index == 50 and st.dump_state_bytes() == dump and st.list_queues() == infos
    e2, s2 = _open(tmp_path / "b")
    apply(e2, s2, WORK[:50])
    assert shape(apply(env, st, WORK[50:])) == shape(apply(e2, s2, WORK[50:]))
    assert st.dump_state_bytes() == s2.dump_state_bytes()


def test_restore_keeps_every_tombstone_and_sets_the_applied_index(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK[:300])
    _, it = st.changes(0)
    everything = list(it)  # live records and the tombstones still kept
    assert any(v is None for _, v, _ in everything)
    renv, rst = _open(tmp_path / "restored")
    assert rst.restore(everything, st.applied_index) == len(everything)
    assert rst.applied_index == 300
    assert rst.dump_state_bytes() == st.dump_state_bytes()
    assert rst.list_queues() == st.list_queues()
    assert shape(apply(env, st, WORK[300:])) == shape(apply(renv, rst, WORK[300:]))


def test_a_failed_restore_changes_nothing_and_can_be_retried(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK[:300])
    _, it = st.changes(0)
    everything = list(it)
    renv, rst = _open(tmp_path / "restored")
    empty = rst.dump_state_bytes()

    def broken_after(n: int):  # the records of a file that turns out truncated midway
        yield from everything[:n]
        raise InvalidArgument("truncated", reason="BACKUP_TRUNCATED")

    with pytest.raises(InvalidArgument):
        rst.restore(broken_after(len(everything) // 2), st.applied_index)
    assert rst.dump_state_bytes() == empty and rst.is_empty() and rst.list_queues() == []
    # records that are each valid but do not form a state (messages of an unknown queue)
    orphans = [r for r in everything if r[0][:1] != b"Q"]
    with pytest.raises(InvalidArgument) as e:
        rst.restore(orphans, st.applied_index)
    assert e.value.reason == "BACKUP_INCONSISTENT"
    assert rst.dump_state_bytes() == empty and rst.applied_index == 0 and rst.list_queues() == []
    rst.restore(everything, st.applied_index)
    assert rst.dump_state_bytes() == st.dump_state_bytes()
    with pytest.raises(FailedPrecondition):  # not empty any more
        rst.restore(everything, st.applied_index)


def test_columns_insert_records_and_versions_like_enqueue(tmp_path: Path) -> None:
    """The insert path (fresh ids, no read of an old value) writes the same records and
    version entries as the put path, and a later overwrite keeps one version entry."""
    create = c.CreateQueue("q", "delayed", QueueSettings())
    contents = [b"m%d" % i for i in range(20)]
    e1, s1 = _open(tmp_path / "a")
    e2, s2 = _open(tmp_path / "b")
    apply(e1, s1, [_batch(1, T0, create, c.EnqueueColumns("q", list(contents)), c.Tick())])
    apply(e2, s2, [_batch(1, T0, create, c.Enqueue("q", [c.EnqueueItem(x) for x in contents]), c.Tick())])
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    assert list(s1.iter_changes(0)) == list(s2.iter_changes(0))
    apply(e1, s1, [_batch(2, T0, c.Dequeue("q", 3))])
    mkeys = {K.message_key("q", i) for i in (1, 2, 3)}
    assert sorted((k, ver) for k, _, ver in s1.iter_changes(0) if k in mkeys) == sorted((k, 2) for k in mkeys)


def _raw(env: lmdb.Environment) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Every record of the state's databases, the versions index included."""
    names = (b"state_meta", b"state_queues", b"state_messages", b"state_dedup", b"state_versions",
             b"state_tombstones")
    with env.begin() as txn:
        return {n: list(txn.cursor(db=env.open_db(n, txn=txn)).iternext()) for n in names}


def test_bulk_store_calls_write_like_one_key_at_a_time(tmp_path: Path) -> None:
    """`rewrite_many` and `pop_many` (a dequeue's and an ack's store calls) leave the same
    records, changes and tombstones as `put` and `delete` of each key in turn:
    keys written at older versions and in the same version, a missing and a repeated key."""
    create = c.CreateQueue("q", "delayed", QueueSettings())
    ents = [_batch(1, T0, create, c.EnqueueColumns("q", [b"a%d" % i for i in range(6)])),
            _batch(2, T0, c.EnqueueColumns("q", [b"b%d" % i for i in range(4)]))]
    keys = [K.message_key("q", i) for i in range(1, 11)]
    stores = [_open(tmp_path / "bulk"), _open(tmp_path / "single")]
    for env, st in stores:
        apply(env, st, ents)

    def edit(recs: list[bytes]) -> list[bytes]:
        return [r[::-1] + b"!" for r in recs]

    for n, (_, st) in enumerate(stores):
        with st.write() as txn:
            sink = st._sink
            sink.txn, sink.ver = txn, (3).to_bytes(8, "big")
            sink.put(keys[9], b"same version")  # then rewritten / deleted in its own version
            if n == 0:
                sink.rewrite_many([keys[1], keys[9], keys[6], keys[2]], edit)
                assert sink.pop_many([keys[6], keys[0], K.message_key("q", 99), keys[0], keys[9]])[2:4] == [None, None]
            else:
                for k in (keys[1], keys[9], keys[6], keys[2]):
                    old = sink.get(k)
                    assert old is not None
                    sink.put(k, edit([old])[0])
                for k in (keys[6], keys[0], K.message_key("q", 99), keys[0], keys[9]):
                    sink.delete(k)
            sink.txn = None
    (e1, s1), (e2, s2) = stores
    # the layouts may differ (a bulk call over scattered ids notes its deletes and stale
    # version entries; one key at a time writes in place): the records may not
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    assert _raw(e1)[b"state_tombstones"] == _raw(e2)[b"state_tombstones"]
    assert list(s1.iter_changes(0)) == list(s2.iter_changes(0))
    assert s1.snapshot_digest() == s2.snapshot_digest()


def test_dedup_runs_on_lmdb_like_the_per_message_path(tmp_path: Path) -> None:
    """A producer's canonical dedup ids: one record per run, written, extended, expired and
    restored the same on LMDB whether they came in columns or one message per command."""
    producer = "00000000000000a1-"

    def dids(first: int, n: int) -> list[str]:
        return [f"{producer}{s:012x}" for s in range(first, first + n)]

    def cols(ds: list[str]) -> c.Command:
        return c.EnqueueColumns("q", [d.encode() for d in ds], dedup_ids=ds)

    def singles(ds: list[str]) -> list[c.Command]:
        return [c.Enqueue("q", [c.EnqueueItem(d.encode(), dedup_id=d)]) for d in ds]

    create = c.CreateQueue("q", "delayed", QueueSettings(dedup_window_ms=1000))
    e1, s1 = _open(tmp_path / "a")
    e2, s2 = _open(tmp_path / "b")
    r1 = apply(e1, s1, [_batch(1, T0, create, cols(dids(1, 100))),
                        _batch(2, T0 + 1, cols(dids(50, 101))),  # 50..100 resent, 101..150 new
                        _batch(3, T0 + 1, cols(dids(151, 10)))])  # extends the run of entry 2
    r2 = apply(e2, s2, [_batch(1, T0, create, *singles(dids(1, 100))),
                        _batch(2, T0 + 1, c.Enqueue("q", [c.EnqueueItem(d.encode(), dedup_id=d)
                                                          for d in dids(50, 101)])),
                        _batch(3, T0 + 1, *singles(dids(151, 10)))])
    resend = r1[1][0]
    assert resend.duplicates == list(range(51)) and list(resend.ids)[:51] == list(range(50, 101))  # type: ignore[attr-defined]
    assert [r.id for r in r2[1][0][51:]] == list(range(101, 151))  # type: ignore[union-attr]
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    assert list(s1.iter_changes(0)) == list(s2.iter_changes(0))
    dkeys = [(k, ver) for k, v, ver in s1.iter_changes(0) if k[0] == K.DEDUP]
    assert dkeys == [(K.dedup_key("q", dids(1, 1)[0]), 1), (K.dedup_key("q", dids(101, 1)[0]), 3)]
    last, it = s1.changes(0)
    full = list(it)
    # the first run expires (one record, one tombstone); the second stays
    for env, st in ((e1, s1), (e2, s2)):
        apply(env, st, [_batch(4, T0 + 1000, c.Tick())])
    assert s1.dump_state_bytes() == s2.dump_state_bytes()
    _, it = s1.changes(last + 1)
    inc = list(it)
    assert inc[-2:] == [(K.dedup_key("q", dids(1, 1)[0]), None, 4), (K.META_KEY, inc[-1][1], 4)]
    renv, rst = _restore(tmp_path / "restored", 4, full, inc)
    assert rst.dump_state_bytes() == s1.dump_state_bytes()
    res = apply(renv, rst, [_batch(5, T0 + 1000, cols(dids(1, 1) + dids(160, 2)))])[0][0]
    assert list(res.ids)[:2] == [161, 160] and res.duplicates == [1]  # type: ignore[attr-defined]


def _versions_index(env: lmdb.Environment) -> tuple[set[bytes], int]:
    """(the versions index's entries, entries noted stale)."""
    with env.begin() as txn:
        vs = {bytes(k) for k in txn.cursor(db=env.open_db(b"state_versions", txn=txn)).iternext(values=False)}
        return vs, txn.stat(env.open_db(b"state_stale", txn=txn))["entries"]


def _live_versions(st: StateStore) -> set[bytes]:
    return {ver.to_bytes(8, "big") + k for k, _, ver in _live(st)}


def _message_notes(env: lmdb.Environment) -> set[bytes]:
    """The stale notes (note version + entry version + key) of message entries."""
    return {k for k in _db_items(env, b"state_stale") if k[16] == K.MESSAGE}


def _kept_versions(env: lmdb.Environment, st: StateStore) -> set[bytes]:
    """The entries a fully collected index holds: the live records' entries but a leased
    message's (its version is its lease entry's, read from the lease table), and the
    versions entry of every stored message body (kept while the body is, even when its
    record is leased or gone)."""
    leases = _db_items(env, b"state_leases")
    return ({e for e in _live_versions(st) if e[8:] not in leases}
            | {v[:8] + k for k, v in _db_items(env, b"state_messages").items()})


def test_stale_version_entries_are_skipped_then_collected_in_bulk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewritten or deleted record's old versions entry is left in the index (noted
    stale) until a collection deletes the noted entries at once: readers never see a
    stale entry, and collecting or not changes no record, change, digest or dump."""
    import doq.storage.state as S

    lazy_env, lazy = _open(tmp_path / "lazy")
    apply(lazy_env, lazy, WORK)
    index, noted = _versions_index(lazy_env)
    assert noted > 0 and index > _kept_versions(lazy_env, lazy)  # stale entries wait in the index
    monkeypatch.setattr(S, "MIN_COLLECT", 1)
    monkeypatch.setattr(S, "COLLECT_FRACTION", 1 << 40)
    eager_env, eager = _open(tmp_path / "eager")
    apply(eager_env, eager, WORK, chunk=5)  # a collection after every txn
    index, noted = _versions_index(eager_env)
    assert noted == 0 and index == _kept_versions(eager_env, eager)
    assert list(lazy.iter_changes(0)) == list(eager.iter_changes(0))
    assert list(lazy.iter_changes(300)) == list(eager.iter_changes(300))
    assert lazy.dump_state_bytes() == eager.dump_state_bytes()
    assert lazy.state_digest() == eager.state_digest()
    lazy_env.close()
    lazy_env, lazy = _open(tmp_path / "lazy")  # the count of noted entries survives a restart
    assert lazy._sink.n_stale == _versions_index(lazy_env)[1] > 0
    apply(lazy_env, lazy, [_batch(len(WORK) + 1, T0 + 10**7, c.Tick())])
    index, noted = _versions_index(lazy_env)
    assert noted == 0 and index == _kept_versions(lazy_env, lazy)


def test_pruning_tombstones_collects_the_stale_entries_first(tmp_path: Path) -> None:
    """No stale versions entry outlives the tombstone of its record: once tombstones are
    pruned, the index holds the live records' entries only (`is_empty` relies on it)."""
    env, st = _open(tmp_path / "a", tombstone_retention=10)
    prios = [0] + [5] * 18 + [0]  # ids 1 and 20 go first: scattered
    apply(env, st, [
        _batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()),
               c.EnqueueColumns("q", [b"x"] * 20, priorities=prios)),
        _batch(2, T0, c.Dequeue("q", 2)),
        _batch(3, T0, c.Ack("q", [1, 20])),
        _batch(4, T0, c.DeleteQueue("q")),
    ])
    assert _versions_index(env)[1] > 0
    assert _db_items(env, b"state_gone")
    apply(env, st, [(i, b"") for i in range(5, 2 * PRUNE_EVERY + 1)])
    index, noted = _versions_index(env)
    assert noted == 0 and index == _live_versions(st)
    assert _db_items(env, b"state_gone") == {} and _db_items(env, b"state_messages") == {}


def _db_items(env: lmdb.Environment, name: bytes) -> dict[bytes, bytes]:
    with env.begin() as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor(db=env.open_db(name, txn=txn)).iternext()}


def test_the_records_are_the_machines_records_with_leases_kept_apart(tmp_path: Path) -> None:
    """Whatever the store keeps in its lease table, the records it yields (changes,
    rebuild) are exactly those the machine wrote (a `MemoryStore` applying the same log)."""
    from doq.queues.codec import decode_batch
    from doq.queues.machine import QueueMachine
    from doq.queues.store import MemoryStore

    env, st = _open(tmp_path / "a")
    mem = MemoryStore()
    machine = QueueMachine(mem)
    seen_leases = 0
    for i in range(0, len(WORK), 10):
        apply(env, st, WORK[i : i + 10], chunk=10)
        for index, data in WORK[i : i + 10]:
            if data:
                machine.apply(index, decode_batch(data))
        assert {k: v for k, v, _ in _live(st)} == mem.data
        seen_leases += len(_db_items(env, b"state_leases"))
    assert seen_leases > 0  # deliveries went to the lease table


def test_a_delivery_writes_a_lease_entry_not_the_message_body(tmp_path: Path) -> None:
    """Deliveries and acks of scattered ids leave the bodies as they are (lease entries,
    gone notes); the records read are those of writes in place."""
    env, st = _open(tmp_path / "a")
    prios = [5] * 20
    prios[1], prios[9], prios[18] = 1, 2, 2  # ids 2, 10 and 19 go first
    apply(env, st, [_batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()),
                           c.EnqueueColumns("q", [b"m%d" % i for i in range(20)], priorities=prios))])
    bodies = _db_items(env, b"state_messages")
    apply(env, st, [_batch(2, T0 + 1, c.Dequeue("q", 3))])
    mk = [K.message_key("q", i) for i in (2, 10, 19)]
    assert _db_items(env, b"state_messages") == bodies
    assert set(_db_items(env, b"state_leases")) == set(mk)
    m = st.get_message("q", 10)
    assert (m.state, m.attempts, m.lease_id) == (MessageState.IN_FLIGHT, 1, 2)
    assert [(k, ver) for k, _, ver in st.iter_changes(2)] == [(K.META_KEY, 2), *((k, 2) for k in mk)]
    apply(env, st, [_batch(3, T0 + 2, c.Touch("q", 10, 2, 5000), c.Ack("q", [2, 19], [1, 3]))])
    assert set(_db_items(env, b"state_leases")) == {mk[1]}
    assert st.get_message("q", 10).lease_expires_at_ms == T0 + 2 + 5000
    # the acked messages' bodies stay until a compaction; nothing reads them
    assert _db_items(env, b"state_messages") == bodies
    assert set(_db_items(env, b"state_gone")) == {(3).to_bytes(8, "big") + k for k in (mk[0], mk[2])}
    with pytest.raises(MessageNotFound):
        st.get_message("q", 2)
    assert not {mk[0], mk[2]} & {k for k, _, _ in _live(st)}
    apply(env, st, [_batch(4, T0 + 3, c.UpdatePriority("q", 10, 9))])  # not a lease field: the body
    assert _db_items(env, b"state_leases") == {}
    m = st.get_message("q", 10)
    assert (m.priority, m.state, m.lease_id, m.attempts) == (9, MessageState.IN_FLIGHT, 2, 1)


def test_deliveries_and_acks_of_adjacent_ids_write_in_place(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "a")
    apply(env, st, [_batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()),
                           c.EnqueueColumns("q", [b"m%d" % i for i in range(20)])),
                    _batch(2, T0, c.Dequeue("q", 16)), _batch(3, T0, c.Ack("q", list(range(1, 9))))])
    assert _db_items(env, b"state_leases") == {} and _db_items(env, b"state_gone") == {}
    assert set(_db_items(env, b"state_messages")) == {K.message_key("q", i) for i in range(9, 21)}
    index, _ = _versions_index(env)  # the messages' old entries went at once (one version each)
    assert {e for e in index if e[8] == K.MESSAGE} == {e for e in _live_versions(st) if e[8] == K.MESSAGE}


def test_deleted_messages_bodies_wait_then_go_in_one_compaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deleted message's body stays (noted gone) until a compaction removes the noted
    bodies at once: compacting or not changes no record, change, digest, dump or result,
    and the notes survive a restart."""
    import doq.storage.state as S

    lazy_env, lazy = _open(tmp_path / "lazy")
    lazy_results = apply(lazy_env, lazy, WORK)
    live_msgs = {k for k, _, _ in _live(lazy) if k[0] == K.MESSAGE}
    assert _db_items(lazy_env, b"state_gone") and set(_db_items(lazy_env, b"state_messages")) > live_msgs
    monkeypatch.setattr(S, "MIN_COMPACT", 1)
    monkeypatch.setattr(S, "COMPACT_FRACTION", 1 << 40)
    eager_env, eager = _open(tmp_path / "eager")
    assert shape(apply(eager_env, eager, WORK, chunk=3)) == shape(lazy_results)
    assert _db_items(eager_env, b"state_gone") == {}
    assert set(_db_items(eager_env, b"state_messages")) == live_msgs
    assert list(lazy.iter_changes(0)) == list(eager.iter_changes(0))
    assert lazy.dump_state_bytes() == eager.dump_state_bytes()
    assert lazy.state_digest() == eager.state_digest()
    lazy_env.close()
    lazy_env, lazy = _open(tmp_path / "lazy")  # restart: the notes are read back
    assert lazy.list_queues() == eager.list_queues() and lazy.next_due_ms() == eager.next_due_ms()
    assert len(lazy._sink.gone) == len(_db_items(lazy_env, b"state_gone")) > 0
    more = entries(seed=9, n=150, start_index=len(WORK) + 1, start_ms=T0 + 10**6)
    assert shape(apply(lazy_env, lazy, more)) == shape(apply(eager_env, eager, more))
    assert lazy.dump_state_bytes() == eager.dump_state_bytes()
    assert _db_items(lazy_env, b"state_gone") == {}  # compacted (MIN_COMPACT is 1 now)


def test_a_message_written_again_after_its_delete_is_live(tmp_path: Path) -> None:
    """Only a restore of crafted records can write a deleted message's key again: the
    record is then live (its gone note dropped), as it would be with the body removed."""
    env, st = _open(tmp_path / "a")
    apply(env, st, [_batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()), c.EnqueueColumns("q", [b"a"] * 20))])
    key = K.message_key("q", 1)
    with st.write() as txn:
        sink = st._sink
        sink.txn = txn
        sink.ver = (2).to_bytes(8, "big")
        old = sink.get(key)
        assert old is not None
        sink.pop_many([key, K.message_key("q", 20)])  # scattered: noted gone
        assert sink.get(key) is None and key in sink.gone
        sink.ver = (3).to_bytes(8, "big")
        sink.put(key, old)
        assert sink.get(key) == old and key not in sink.gone
        sink.txn = None
    assert list(_db_items(env, b"state_gone")) == [(2).to_bytes(8, "big") + K.message_key("q", 20)]
    assert (key, old, 3) in _live(st)


def test_removals_spread_over_commits_chunk_by_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction or collection takes `SWEEP_CHUNK` keys per commit (no commit does
    them all at once); spread so, and cut by a restart midway, it changes nothing a
    reader sees, and it ends with every note dropped and only live entries kept."""
    import doq.storage.state as S

    lazy_env, lazy = _open(tmp_path / "lazy")
    apply(lazy_env, lazy, WORK)
    for name, value in (("MIN_COMPACT", 1), ("MIN_COLLECT", 1), ("COMPACT_FRACTION", 1 << 40),
                        ("COLLECT_FRACTION", 1 << 40), ("SWEEP_CHUNK", 3), ("SWEEP_GATHER", 4),
                        ("SWEEP_VISIT", 5)):
        monkeypatch.setattr(S, name, value)
    env, st = _open(tmp_path / "chunked")
    spread = 0
    for i in range(0, len(WORK), 2):
        apply(env, st, WORK[i : i + 2], chunk=2)
        spread += st._compacting is not None or st._collecting is not None
        if i == 300:
            env.close()
            env, st = _open(tmp_path / "chunked")  # midway: the notes are read back, the sweeps start again
    assert spread > 0
    assert list(st.iter_changes(0)) == list(lazy.iter_changes(0))
    assert st.dump_state_bytes() == lazy.dump_state_bytes() and st.state_digest() == lazy.state_digest()
    for i in range(1, 5000):  # ticks until the sweeps end with nothing noted (a few hundred commits)
        apply(env, st, [_batch(len(WORK) + i, T0 + 10**7, c.Tick())])
        if st._compacting is None and st._collecting is None and not st._sink.n_stale and not st._sink.gone:
            break
    assert st._compacting is None and st._collecting is None
    assert not st._sink.gone and not st._sink.n_stale  # also the keys the cut compaction had removed
    assert _db_items(env, b"state_gone") == {} and _versions_index(env) == (_kept_versions(env, st), 0)
    assert set(_db_items(env, b"state_messages")) == {k for k, _, _ in _live(st) if k[0] == K.MESSAGE}


def test_no_commit_sorts_or_walks_every_noted_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's work per commit is bounded, whatever waits: a delayed queue with random
    priorities drained with acks (bodies noted gone) and priority changes of scattered
    messages (old versions entries noted stale), hundreds of each when a sweep starts, no commit's sweep visits, reads, takes or drops
    more than 2 SWEEP_VISIT + SWEEP_GATHER + 2 SWEEP_CHUNK keys, and no sort in the store sorts
    more than a gathered run or a batch's own keys (the sweep used to sort every noted
    key in the commit that started it: a multi-second writer stall at 5M). The sweeps
    end, the bodies and entries go, and the state is the unswept store's."""
    import random

    import doq.storage.state as S

    for name, value in (("MIN_COMPACT", 256), ("MIN_COLLECT", 256), ("SWEEP_VISIT", 64),
                        ("SWEEP_GATHER", 64), ("SWEEP_CHUNK", 32)):
        monkeypatch.setattr(S, name, value)
    sorts: list[int] = []

    def counting_sorted(items, **kw):  # type: ignore[no-untyped-def]
        out = sorted(items, **kw)
        sorts.append(len(out))
        return out

    rng = random.Random(20)
    n, batch = 3000, 20
    fill = [_batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()))]
    for i in range(0, n, 500):
        fill.append(_batch(2 + i // 500, T0, c.EnqueueColumns("q", [b"m"] * 500, priorities=[rng.randrange(10**6) for _ in range(500)])))
    index = len(fill)
    drain: list[tuple[int, bytes]] = []
    envs = [_open(tmp_path / "swept"), _open(tmp_path / "unswept")]
    (env, st), (env0, st0) = envs
    for e, s in envs:
        apply(e, s, fill)
    monkeypatch.setattr(S, "sorted", counting_sorted, raising=False)
    work, waiting_gone, waiting_stale, sweeping = [], [], [], 0
    prev: tuple[list[int], list[int]] = ([], [])
    for _ in range(n * 2 // 3 // batch):
        index += 1
        cmds: list[c.Command] = [c.Dequeue("q", batch, visibility_timeout_ms=60_000)]
        if prev[0]:
            cmds.insert(0, c.Ack("q", prev[0], prev[1]))
        # priority changes of scattered messages: bodies rewritten, their old entries noted stale
        cmds[-1:-1] = [c.UpdatePriority("q", rng.randrange(1, n + 1), rng.randrange(10**6)) for _ in range(10)]
        drain.append(_batch(index, T0 + index, *cmds))
        waiting_gone.append(len(st._sink.gone))
        waiting_stale.append(st._sink.n_stale)
        views = apply(env, st, drain[-1:])[0][-1]
        prev = ([v.id for v in views], [v.lease_id for v in views])  # type: ignore[attr-defined]
        work.append(st.sweep_keys)
        sweeping += st._compacting is not None or st._collecting is not None
    bound = 2 * S.SWEEP_VISIT + S.SWEEP_GATHER + 2 * S.SWEEP_CHUNK
    assert max(waiting_gone) > 2 * bound and max(waiting_stale) > 2 * bound  # old: one commit sorted all of them
    assert sweeping > 0 and 0 < max(work) <= bound
    assert max(sorts) <= max(S.SWEEP_GATHER, 2 * batch)
    monkeypatch.setattr(S, "MIN_COMPACT", 1 << 40)
    monkeypatch.setattr(S, "MIN_COLLECT", 1 << 40)
    apply(env0, st0, drain)  # the same log, never swept
    assert len(_db_items(env, b"state_messages")) < len(_db_items(env0, b"state_messages"))
    assert _versions_index(env)[0] < _versions_index(env0)[0]
    assert list(st.iter_changes(0)) == list(st0.iter_changes(0))
    assert st.dump_state_bytes() == st0.dump_state_bytes() and st.state_digest() == st0.state_digest()


def test_scattered_deliveries_keep_the_bodies_entries_until_the_compaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fair queue's groups filled as blocks, delivered round-robin (scattered ids): a
    delivery writes lease entries only, no versions entry, and leaves the bodies'
    versions entries where they are, noting nothing stale (readers skip them: the
    record's version is the lease's, which changes read from the lease table); an ack
    drops the lease entries and notes the bodies gone; the compaction removes each body
    with its versions entry. Nothing is noted stale at any step."""
    import doq.storage.state as S

    env, st = _open(tmp_path / "a")
    fill = [_batch(1, T0, c.CreateQueue("q", "fair", QueueSettings()))]
    for v in (2, 3):  # two versions of ten groups of ten messages each (ids 1..200)
        groups = [f"g{v}{g}" for g in range(10) for _ in range(10)]
        fill.append(_batch(v, T0, c.EnqueueColumns("q", [b"m"] * 100, groups=groups)))
    apply(env, st, fill)
    out = apply(env, st, [_batch(4, T0, c.Dequeue("q", 20))])[0][0]
    ids = [m.id for m in out]  # type: ignore[attr-defined]
    assert sorted(ids) == list(range(1, 200, 10))  # one per group
    old = {(2 if i <= 100 else 3).to_bytes(8, "big") + K.message_key("q", i) for i in ids}
    assert not _message_notes(env)
    assert old <= _versions_index(env)[0]  # left in the index, skipped by readers
    assert {k for k, _, ver in _live(st) if k[0] == K.MESSAGE and ver == 4} == {K.message_key("q", i) for i in ids}
    assert not {e for e in _versions_index(env)[0] if e[:8] == (4).to_bytes(8, "big") and e[8] == K.MESSAGE}
    assert {e for e in _versions_index(env)[0] if e[8] == K.MESSAGE} == {
        e for e in _kept_versions(env, st) if e[8] == K.MESSAGE}
    apply(env, st, [_batch(5, T0, c.Ack("q", ids, [m.lease_id for m in out]))])  # type: ignore[attr-defined]
    index, _ = _versions_index(env)
    assert not {e for e in index if e[:8] == (4).to_bytes(8, "big") and e[8] == K.MESSAGE}
    assert not _message_notes(env) and old <= index
    assert {e for e in index if e[8] == K.MESSAGE} == {e for e in _kept_versions(env, st) if e[8] == K.MESSAGE}
    monkeypatch.setattr(S, "MIN_COMPACT", 1)
    monkeypatch.setattr(S, "COMPACT_FRACTION", 1 << 40)
    apply(env, st, [_batch(6, T0, c.Tick())])  # the compaction
    index, _ = _versions_index(env)
    assert not _message_notes(env) and not old & index
    assert {e for e in index if e[8] == K.MESSAGE} == {e for e in _live_versions(st) if e[8] == K.MESSAGE}
    assert _db_items(env, b"state_gone") == {} and not {K.message_key("q", i) for i in ids} & set(_db_items(env, b"state_messages"))


class _SpyTxn:
    """A write txn that records the databases read through it."""

    def __init__(self, txn: lmdb.Transaction) -> None:
        self.txn = txn
        self.read: list[object] = []

    def cursor(self, db: object) -> lmdb.Cursor:
        self.read.append(db)
        return self.txn.cursor(db=db)

    def get(self, key: bytes, db: object) -> object:
        self.read.append(db)
        return self.txn.get(key, db=db)

    def __getattr__(self, name: str) -> object:
        return getattr(self.txn, name)


def test_an_ack_of_scattered_deliveries_reads_no_body(tmp_path: Path) -> None:
    """An ack of delivered messages of scattered ids reads and writes their lease
    entries, gone notes and tombstones only: not one message body (nor the versions index)."""
    env, st = _open(tmp_path / "a")
    prios = [(i * 7919) % 200 for i in range(200)]
    apply(env, st, [_batch(1, T0, c.CreateQueue("q", "delayed", QueueSettings()),
                           c.EnqueueColumns("q", [b"m%d" % i for i in range(200)], priorities=prios))])
    out = apply(env, st, [_batch(2, T0, c.Dequeue("q", 30))])[0][0]
    ids = [m.id for m in out]  # type: ignore[attr-defined]
    assert max(ids) - min(ids) > 4 * len(ids)  # scattered
    with st.write() as txn:
        spy = _SpyTxn(txn)
        res = st.apply_entries(spy, [_batch(3, T0, c.Ack("q", ids, [m.lease_id for m in out]))])  # type: ignore[arg-type, attr-defined]
    assert res == [[[None] * len(ids)]]
    assert st._kind_db[K.MESSAGE] not in spy.read and st._versions not in spy.read
    assert st._leases in spy.read  # the lease entries were dropped
    assert {K.message_key("q", i) for i in ids} <= st._sink.gone
    assert not {K.message_key("q", i) for i in ids} & {k for k, _, _ in _live(st)}
