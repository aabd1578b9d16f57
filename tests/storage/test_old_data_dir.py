"""A data dir written before the storage layout of issue 20 loads and carries on.

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

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.storage.workload import entries

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
