"""Fair-queue group policies (weights, rates, token buckets) in backups: full and
incremental backups of a real LMDB state restore it byte for byte, the restored replica
rotates and throttles as the live one, and `doq verify` (the same driver and executors,
on local Spark too) rebuilds them with the digest proven."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doq.backup.ops import write_backup
from doq.backup.verify import verify
from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.backup.test_verify_unit import run_without_spark

T0 = 1_700_000_000_000


def _store(path: Path) -> StateStore:
    return StateStore(open_env(path, map_size=1 << 28))


def _apply(st: StateStore, index: int, now: int, *cmds: c.Command) -> list[object]:
    with st.write() as txn:
        return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(now, list(cmds))))])[0]


def _groups(st: StateStore, n: int, index: int, now: int) -> list[str]:
    got = _apply(st, index, now, c.Dequeue("fq", n, ack=True))[0]
    assert isinstance(got, list)
    return [v.group for v in got]


@pytest.fixture
def backups(tmp_path: Path) -> tuple[StateStore, list[Path]]:
    st = _store(tmp_path / "live")
    _apply(st, 1, T0, c.CreateQueue("fq", "fair", QueueSettings(default_group_weight=2,
                                                                default_group_max_per_second=50)),
           c.CreateQueue("dq", "delayed", QueueSettings()),
           c.SetGroupPolicy("fq", "paying", weight=5, max_per_second=0),
           c.SetGroupPolicy("fq", "noisy", max_per_second=1),
           c.Enqueue("fq", [c.EnqueueItem(b"m", g) for g in ["paying", "noisy", "free"] * 20]))
    assert _groups(st, 12, 2, T0 + 1) == ["free", "free", "noisy", "paying", "paying", "paying", "paying",
                                          "paying", "free", "free", "paying", "paying"]
    full = tmp_path / "full.bak"
    with open(full, "wb") as f:
        last = write_backup(st, 0, f)
    # the noisy bucket fills again (forgotten: a tombstone), an override changes, the turn moves
    _apply(st, 3, T0 + 5_000, c.SetGroupPolicy("fq", "free", weight=3))
    _groups(st, 4, 4, T0 + 5_000)
    inc = tmp_path / "inc.bak"
    with open(inc, "wb") as f:
        write_backup(st, last + 1, f)
    return st, [full, inc]


def test_group_records_round_trip_and_the_restored_replica_behaves_the_same(
        backups: tuple[StateStore, list[Path]], tmp_path: Path) -> None:
    st, _ = backups
    keys = sorted(k for k, v, _ in st.iter_changes(0) if v is not None and k[0] == K.GROUP)
    assert keys  # the overrides and buckets are records of the state
    rst = _store(tmp_path / "restored")
    rst.restore([*st.iter_changes(0)], st.applied_index)
    assert rst.dump_state_bytes() == st.dump_state_bytes()
    assert rst.state_digest() == st.state_digest()
    assert rst.group_stats("fq") == st.group_stats("fq")
    for i, now in enumerate([T0 + 5_000, T0 + 5_050, T0 + 5_120, T0 + 9_000], start=5):
        assert _groups(rst, 9, i, now) == _groups(st, 9, i, now)
    assert rst.dump_state_bytes() == st.dump_state_bytes()


def test_verify_rebuilds_group_records_with_the_digest_proven(backups: tuple[StateStore, list[Path]]) -> None:
    st, paths = backups
    r = run_without_spark(paths)
    assert r.ok, [f.line() for f in r.failures]
    assert r.digest == st.state_digest()[1]
    want = len([k for k, v, _ in st.iter_changes(0) if v is not None and k[0] == K.GROUP])
    assert r.queues["fq"].groups == want > 0
    assert r.to_dict()["state"]["queues"]["fq"]["groups"] == want


def test_a_group_record_of_a_delayed_queue_or_undecodable_is_reported(tmp_path: Path) -> None:
    from doq.backup.format import write_records

    st = _store(tmp_path / "live")
    _apply(st, 1, T0, c.CreateQueue("dq", "delayed", QueueSettings()), c.CreateQueue("fq", "fair", QueueSettings()),
           c.SetGroupPolicy("fq", "g", weight=2))
    recs = [(k, v, ver) for k, v, ver in st.iter_changes(0) if v is not None]
    good = next(v for k, v, _ in recs if k[0] == K.GROUP)
    bad = recs + [(K.group_key("dq", "g"), good, 1), (K.group_key("fq", "h"), b"\x07" * 5, 1)]
    path = tmp_path / "bad.bak"
    with open(path, "wb") as f:
        write_records(f, sorted(bad, key=lambda x: (x[2], x[0])), from_version=0,
                      to_version=st.state_digest()[0])
    r = run_without_spark([path])
    lines = [f.line() for f in r.failures]
    assert any("group records of queue b'dq'" in x for x in lines), lines
    assert any("undecodable W record" in x for x in lines), lines


@pytest.mark.spark
def test_verify_on_spark_rebuilds_group_records(spark: Any, backups: tuple[StateStore, list[Path]]) -> None:
    st, paths = backups
    r = verify(paths, spark=spark, frames_per_task=2)
    assert r.ok, [f.line() for f in r.failures]
    assert r.digest == st.state_digest()[1]
    assert r.queues["fq"].groups > 0
