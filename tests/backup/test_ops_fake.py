"""Backup/restore logic against the in-memory stand-in of the StateStore contract."""

from __future__ import annotations

import io

import pytest

from doq.backup.format import BackupReader
from doq.backup.ops import check_chain, restore_into, write_backup
from doq.errors import FailedPrecondition, InvalidArgument
from tests.backup.fakes import FakeState


def _backup(state: FakeState, since: int) -> tuple[io.BytesIO, int]:
    buf = io.BytesIO()
    last = write_backup(state, since, buf, cluster_id="c", node_id="n", frame_bytes=256)
    buf.seek(0)
    return buf, last


def _live_state() -> FakeState:
    s = FakeState()
    for i in range(1, 50):
        s.apply(i, {b"q/%d" % i: b"m%d" % i, b"meta": b"%d" % i})
    return s


def test_full_plus_incrementals_restore_exactly():
    live = _live_state()
    full, last0 = _backup(live, 0)
    assert last0 == 49
    live.apply(50, {b"q/3": None, b"q/4": b"changed", b"new": b"1"})
    live.apply(51, {b"q/5": None})
    inc1, last1 = _backup(live, last0 + 1)
    assert last1 == 51
    live.apply(52, {b"q/6": None, b"q/3": b"back"})
    inc2, last2 = _backup(live, last1 + 1)

    target = FakeState()
    names = ["full", "inc1", "inc2"]
    res = restore_into(target, [BackupReader(f) for f in (full, inc1, inc2)], names)
    assert target.records == live.records  # tombstones and versions included
    assert target.live() == live.live()
    assert target.applied_index == live.applied_index == res.to_version == 52
    assert res.last_version == last2 == 52


def test_empty_incremental_returns_since_minus_one_and_is_valid():
    live = _live_state()
    _, last = _backup(live, 0)
    buf, last2 = _backup(live, last + 1)
    assert last2 == last
    r = BackupReader(buf)
    assert r.verify().record_count == 0
    assert r.header.from_version == last + 1


def test_last_version_is_the_greatest_record_version_not_the_applied_index():
    live = _live_state()
    live.apply(60, {})  # an entry that wrote nothing
    buf, last = _backup(live, 0)
    assert last == 49
    assert BackupReader(buf).header.to_version == 60


def test_since_too_old_is_refused():
    live = _live_state()
    live.horizon = 10
    with pytest.raises(InvalidArgument) as e:
        _backup(live, 5)
    assert e.value.reason == "SINCE_TOO_OLD"
    with pytest.raises(InvalidArgument):
        _backup(live, -1)


def test_gap_in_the_chain_is_refused_and_nothing_is_written():
    live = _live_state()
    full, last = _backup(live, 0)
    live.apply(50, {b"a": b"1"})
    live.apply(51, {b"b": b"1"})
    inc_gap, _ = _backup(live, last + 2)  # skips version 50
    target = FakeState()
    with pytest.raises(InvalidArgument) as e:
        restore_into(target, [BackupReader(full), BackupReader(inc_gap)], ["full.bak", "inc.bak"])
    assert e.value.reason == "BACKUP_CHAIN_GAP"
    assert "inc.bak" in e.value.message and "51" in e.value.message
    assert target.records == {} and target.applied_index == 0


def test_first_file_must_be_full_and_order_matters():
    live = _live_state()
    full, last = _backup(live, 0)
    live.apply(50, {b"a": b"1"})
    inc, _ = _backup(live, last + 1)
    hf, hi = BackupReader(full).header, BackupReader(inc).header
    with pytest.raises(InvalidArgument, match="not a full one"):
        check_chain([hi])
    with pytest.raises(InvalidArgument, match="in order"):
        check_chain([hf, hi, hf.__class__(hf.cluster_id, hf.node_id, 1, 10, 0)])
    check_chain([hf, hi])


def test_restore_refuses_a_non_empty_target():
    """`restore_into` itself refuses, before handing the state a single record (the fake's
    own refusal would not be reached)."""
    live = _live_state()
    full, _ = _backup(live, 0)

    class Watched(FakeState):
        restores = 0

        def restore(self, records, applied_index, cluster_id=""):  # type: ignore[no-untyped-def]
            Watched.restores += 1
            return super().restore(records, applied_index, cluster_id)

    target = Watched()
    target.apply(1, {b"x": b"y"})
    with pytest.raises(FailedPrecondition) as e:
        restore_into(target, [BackupReader(full)], ["full"])
    assert e.value.reason == "RESTORE_TARGET_NOT_EMPTY" and Watched.restores == 0


def test_corrupt_incremental_aborts_before_any_write():
    live = _live_state()
    full, last = _backup(live, 0)
    live.apply(50, {b"a": b"1" * 500})
    inc, _ = _backup(live, last + 1)
    data = bytearray(inc.getvalue())
    entry = BackupReader(io.BytesIO(bytes(data))).frames[0]
    data[entry.offset + 5] ^= 1
    target = FakeState()
    with pytest.raises(InvalidArgument) as e:
        restore_into(target, [BackupReader(full), BackupReader(io.BytesIO(bytes(data)))], ["f", "i.bak"])
    assert e.value.reason == "BACKUP_CHECKSUM_MISMATCH" and e.value.message.startswith("i.bak:")
    assert target.records == {}
