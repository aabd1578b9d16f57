"""Data dirs written by earlier layouts load and carry on.

`fixtures/state-v1.mdb.gz` is the state database of a node written by the code before
that change (`fixtures/state-v1.json` says how: the seeded workload of
`tests.storage.workload`, then dequeues that leave messages in flight). Opened by this
code, it must give the same records, versions, digests and snapshot bytes as the old
code recorded, and applying more entries must reach the state a fresh store reaches by
applying the whole log.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.storage.workload import entries, scattered_tail

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "state-v1.json").read_text())
LAST_NOW_MS = 1700000016909


def _old_log() -> list[tuple[int, bytes]]:
    """The log the fixture applied."""
    return [*entries(seed=7, n=300, group_policies=False),
            (301, encode_batch(c.CommandBatch(LAST_NOW_MS, [c.Dequeue("d", 4), c.Dequeue("f", 5), c.Tick()])))]


def _more() -> list[tuple[int, bytes]]:
    return entries(seed=8, n=250, start_index=302, start_ms=LAST_NOW_MS)


def _open_fixture(tmp: Path) -> StateStore:
    d = tmp / "old"
    d.mkdir(mode=0o700)
    (d / "data.mdb").write_bytes(gzip.decompress((FIXTURES / "state-v1.mdb.gz").read_bytes()))
    (d / "data.mdb").chmod(0o600)
    return StateStore(open_env(d, map_size=1 << 26))


def _changes_sha(st: StateStore) -> str:
    h = hashlib.sha256()
    for k, v, ver in st.iter_changes(0):
        h.update(repr((k, v, ver)).encode())
    return h.hexdigest()


def _apply(st: StateStore, ents: list[tuple[int, bytes]], chunk: int = 5) -> None:
    for i in range(0, len(ents), chunk):
        with st.write() as txn:
            st.apply_entries(txn, ents[i : i + chunk])


def test_an_old_data_dir_loads_with_the_same_records_and_digests(tmp_path: Path) -> None:
    st = _open_fixture(tmp_path)
    assert st.applied_index == EXPECTED["applied"]
    assert sum(q.stats.in_flight for q in st.list_queues()) == 9  # leases of the old layout
    assert st.snapshot_digest() == EXPECTED["snapshot_digest"]
    assert _changes_sha(st) == EXPECTED["changes_sha256"]
    assert st.state_digest() == (EXPECTED["applied"], EXPECTED["state_digest"])


def test_an_old_data_dir_carries_on_like_a_fresh_store(tmp_path: Path) -> None:
    old = _open_fixture(tmp_path)
    fresh = StateStore(open_env(tmp_path / "fresh", map_size=1 << 26))
    _apply(fresh, _old_log(), chunk=7)
    assert fresh.snapshot_digest() == EXPECTED["snapshot_digest"]  # the log is the fixture's
    _apply(old, _more())
    _apply(fresh, _more(), chunk=3)
    assert old.dump_state_bytes() == fresh.dump_state_bytes()
    assert list(old.iter_changes(0)) == list(fresh.iter_changes(0))
    assert list(old.iter_changes(EXPECTED["applied"])) == list(fresh.iter_changes(EXPECTED["applied"]))
    assert old.list_queues() == fresh.list_queues()
    old.rebuild()
    assert old.list_queues() == fresh.list_queues() and old.next_due_ms() == fresh.next_due_ms()


# -- a data dir of the layout before issue 20's drain change (`fixtures/state-v2.*`) ------------
# Written by the code in which a delivery of scattered ids noted the body's versions entry
# stale (state_stale): leased messages' bodies have no versions entry there, and stale
# notes wait for entries this code never notes. Loaded by this code, nothing may differ,
# and nothing may be left behind in the versions index once everything is swept.
EXPECTED_V2 = json.loads((FIXTURES / "state-v2.json").read_text())


def _v2_log() -> list[tuple[int, bytes]]:
    return [*entries(seed=7, n=300), *scattered_tail(301, 1700000100000, 421)]


def _open_v2(tmp: Path) -> StateStore:
    d = tmp / "v2"
    d.mkdir(mode=0o700)
    (d / "data.mdb").write_bytes(gzip.decompress((FIXTURES / "state-v2.mdb.gz").read_bytes()))
    (d / "data.mdb").chmod(0o600)
    return StateStore(open_env(d, map_size=1 << 26))


def _table(st: StateStore, name: bytes) -> dict[bytes, bytes]:
    with st.env.begin() as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor(db=st._db[name]).iternext()}


def test_a_v2_data_dir_loads_with_the_same_records_and_digests(tmp_path: Path) -> None:
    st = _open_v2(tmp_path)
    assert st.applied_index == EXPECTED_V2["applied"]
    assert sum(q.stats.in_flight for q in st.list_queues()) == EXPECTED_V2["in_flight"]
    assert _table(st, b"state_leases") and _table(st, b"state_gone") and _table(st, b"state_stale")
    assert st.snapshot_digest() == EXPECTED_V2["snapshot_digest"]
    assert _changes_sha(st) == EXPECTED_V2["changes_sha256"]
    assert st.state_digest() == (EXPECTED_V2["applied"], EXPECTED_V2["state_digest"])


def test_a_v2_data_dir_carries_on_like_a_fresh_store_and_sweeps_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doq.storage.state as S

    old = _open_v2(tmp_path)
    fresh = StateStore(open_env(tmp_path / "fresh", map_size=1 << 26))
    _apply(fresh, _v2_log(), chunk=7)
    assert fresh.snapshot_digest() == EXPECTED_V2["snapshot_digest"]  # the log is the fixture's
    # more of the same: the old leases acked, touched and delivered again, the bodies compacted
    more = [*entries(seed=8, n=250, start_index=307, start_ms=1700000200000),
            (557, encode_batch(c.CommandBatch(1700001000000, [c.Dequeue("big", 100)]))),
            (558, encode_batch(c.CommandBatch(1700001000001, [c.Ack("big", list(range(421, 721)), [])])))]
    for name in ("MIN_COMPACT", "MIN_COLLECT"):
        monkeypatch.setattr(S, name, 1)
    for name in ("COMPACT_FRACTION", "COLLECT_FRACTION"):
        monkeypatch.setattr(S, name, 1 << 40)
    _apply(old, more)
    _apply(fresh, more, chunk=3)
    assert old.dump_state_bytes() == fresh.dump_state_bytes()
    assert list(old.iter_changes(0)) == list(fresh.iter_changes(0))
    assert list(old.iter_changes(EXPECTED_V2["applied"])) == list(fresh.iter_changes(EXPECTED_V2["applied"]))
    assert old.state_digest() == fresh.state_digest()
    for i in range(559, 600):  # ticks until every sweep is done
        _apply(old, [(i, encode_batch(c.CommandBatch(1700001000002 + i, [c.Tick()])))])
    assert old._compacting is None and old._collecting is None and not old._sink.gone and not old._sink.n_stale
    live = {ver.to_bytes(8, "big") + k for k, _, ver in old.iter_changes(0) if _ is not None}
    leases = _table(old, b"state_leases")
    bodies = {v[:8] + k for k, v in _table(old, b"state_messages").items()}
    index = set(_table(old, b"state_versions"))
    assert leases  # some in flight: their versions are the lease entries'
    # nothing left behind: every entry live or a stored body's; a lease's is not indexed
    assert {e for e in live if e[8:] not in leases} <= index <= live | bodies
    assert not {v[:8] + k for k, v in leases.items()} & index - bodies
    assert not _table(old, b"state_gone") and not _table(old, b"state_stale")
