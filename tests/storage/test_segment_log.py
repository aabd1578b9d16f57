"""`doq.storage.segment_log`: the append-only segment log, on real files (and a real writer
process killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import doq.storage.segment_log as mod
from doq.storage.segment_log import HEADER_BYTES, SegmentLog, SegmentLogCorrupt, encode_record

SMALL = 8192  # bytes per segment: a few dozen records each


def rec(index: int, term: int = 1, size: int = 100) -> tuple[int, int, int, bytes]:
    """A record whose data tells its index and term (checked on read back)."""
    data = (f"{index}:{term}:".encode() * size)[:size]
    return (index, term, index % 3, data)


def recs(lo: int, hi: int, term: int = 1, size: int = 100) -> list[tuple[int, int, int, bytes]]:
    return [rec(i, term, size) for i in range(lo, hi)]


def segs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".seg"))


def test_append_and_read_back_across_segments_and_a_reopen(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert (log.first_index(), log.last_index()) == (1, 0)
        assert log.read(1, 10) == []
        for lo in range(1, 301, 30):
            log.append(recs(lo, lo + 30))
            log.sync()
        assert (log.first_index(), log.last_index()) == (1, 300)
        assert log.segment_count() > 3
        assert log.read(1, 301) == recs(1, 301)
        assert log.read(57, 123) == recs(57, 123)
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert (log.first_index(), log.last_index()) == (1, 300)
        assert log.read(1, 301) == recs(1, 301)
        assert log.cut_records == 0
        log.append(recs(301, 305))
        log.sync()
        assert log.read(299, 400) == recs(299, 305)


def test_read_stops_before_max_bytes_but_returns_at_least_one(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "wal", segment_bytes=SMALL) as log:
        log.append(recs(1, 50))
        assert log.read(1, 50, max_bytes=250) == recs(1, 3)
        assert log.read(5, 50, max_bytes=10) == recs(5, 6)


def test_a_new_log_starts_at_its_start_index(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "wal", start_index=42) as log:
        assert (log.first_index(), log.last_index()) == (42, 41)
        with pytest.raises(ValueError):
            log.append(recs(1, 3))
        with pytest.raises(ValueError):
            log.append(recs(44, 46))  # a gap
        log.append(recs(42, 44))
        assert log.read(0, 100) == recs(42, 44)


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        big = rec(3, size=3 * SMALL)
        log.append([*recs(1, 3), big, rec(4)])
        log.sync()
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(1, 5) == [*recs(1, 3), big, rec(4)]


@pytest.mark.parametrize("tail", ["half_record", "garbage", "flipped_byte"])
def test_a_torn_or_corrupt_tail_is_cut_at_open(tmp_path: Path, tail: str) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=1 << 16) as log:
        log.append(recs(1, 11))
        log.sync()
        end = log._segs[-1].end
        last_off = log._segs[-1].offsets[-1]
    path = segs(d)[-1]
    with open(path, "r+b") as f:
        if tail == "half_record":  # the first half of record 11
            whole = encode_record(*rec(11))
            f.seek(end)
            f.write(whole[: len(whole) // 2])
        elif tail == "garbage":
            f.seek(end)
            f.write(os.urandom(300))
        else:  # a bit of record 10's data changed: its CRC fails, it is cut
            f.seek(last_off + 40)
            b = f.read(1)
            f.seek(last_off + 40)
            f.write(bytes([b[0] ^ 0x10]))
    want_last = 9 if tail == "flipped_byte" else 10
    with SegmentLog(d, segment_bytes=1 << 16) as log:
        assert log.cut_records == 1
        assert log.last_index() == want_last
        assert log.read(1, 100) == recs(1, want_last + 1)
        log.append(recs(want_last + 1, want_last + 4, term=2))
        log.sync()
    with SegmentLog(d, segment_bytes=1 << 16) as log:  # the cut bytes were zeroed: a clean open
        assert log.cut_records == 0
        assert log.read(1, 100) == recs(1, want_last + 1) + recs(want_last + 1, want_last + 4, term=2)


def test_damage_in_an_older_segment_is_refused_at_its_read_or_at_open_without_its_index(tmp_path: Path) -> None:
    """An older segment is not read at open when its index checks: damage inside it is
    found by the read of the damaged record (every read checks CRCs); without the index
    the open scans the segment and refuses it."""
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 200))
        log.sync()
        assert log.segment_count() >= 3
    first = segs(d)[0]
    with open(first, "r+b") as f:
        f.seek(HEADER_BYTES + 30)
        f.write(b"\xff\xff")
    with SegmentLog(d, segment_bytes=SMALL) as log:
        with pytest.raises(SegmentLogCorrupt):
            log.read(1, 2)
        assert log.read(150, 200) == recs(150, 200)  # the undamaged segments still serve
    first.with_suffix(".idx").unlink()
    with pytest.raises(SegmentLogCorrupt):
        SegmentLog(d, segment_bytes=SMALL)


def _reads(path: Path) -> list[str]:
    """The segment files an open of `path` reads past their header (their records)."""
    got: list[str] = []
    orig_open = open

    def spy_open(p, mode="r", *a, **k):  # type: ignore[no-untyped-def]
        if str(p).endswith(".seg") and "b" in mode:
            got.append(Path(p).name)
        return orig_open(p, mode, *a, **k)

    mod.open = spy_open  # type: ignore[attr-defined]
    try:
        SegmentLog(path, segment_bytes=SMALL).close()
    finally:
        del mod.open  # type: ignore[attr-defined]
    return got


def test_an_open_scans_only_the_newest_segment_when_the_older_ones_have_their_index(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 600))
        log.sync()
        n = log.segment_count()
    assert n > 5
    idx = sorted(p.name for p in d.iterdir() if p.name.endswith(".idx"))
    assert idx == [p.with_suffix(".idx").name for p in segs(d)[:-1]]  # every sealed segment's
    assert _reads(d) == [segs(d)[-1].name]
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert (log.first_index(), log.last_index()) == (1, 599)
        assert log.read(1, 600) == recs(1, 600)
        assert log.kinds(1, 600) == bytes(i % 3 for i in range(1, 600))
    # an index lost, damaged or stale: that segment is scanned (and its index written again)
    lost, damaged, stale = (p.with_suffix(".idx") for p in segs(d)[:3])
    lost.unlink()
    raw = bytearray(damaged.read_bytes())
    raw[40] ^= 1
    damaged.write_bytes(bytes(raw))
    stale.write_bytes(segs(d)[3].with_suffix(".idx").read_bytes())  # another segment's
    assert sorted(_reads(d)) == sorted([*(p.name for p in segs(d)[:3]), segs(d)[-1].name])
    assert _reads(d) == [segs(d)[-1].name]
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(1, 600) == recs(1, 600)


def test_a_truncated_segment_loses_its_index_and_never_serves_the_cut_records(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 300))
        log.sync()
        mid = log._segs[1]
        cut = mid.first + 3
        assert mid.idx_path.exists()
        log.truncate_from(cut)
        assert not mid.idx_path.exists()
        assert log.last_index() == cut - 1
        log.append(recs(cut, cut + 200, term=2))  # seals it again, with its new records
        log.sync()
        want = recs(1, cut) + recs(cut, cut + 200, term=2)
        assert log.read(1, cut + 200) == want
    assert _reads(d) == [segs(d)[-1].name]
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(1, cut + 200) == want


def test_a_damaged_segment_header_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d) as log:
        log.append(recs(1, 3))
        log.sync()
    with open(segs(d)[0], "r+b") as f:
        f.seek(9)
        f.write(b"\x07")
    with pytest.raises(SegmentLogCorrupt):
        SegmentLog(d)


@pytest.mark.parametrize("new_size", [100, 60, 140])
def test_truncate_and_append_on_conflict_never_resurrects_the_cut_records(tmp_path: Path, new_size: int) -> None:
    """Records 6.. of term 1 are replaced by 6..7 of term 2 (the same size as the old ones,
    smaller, larger): after a reopen the log ends at 7, with the new records."""
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=1 << 16) as log:
        log.append(recs(1, 11))
        log.sync()
        log.append(recs(6, 8, term=2, size=new_size))
        log.sync()
        assert log.last_index() == 7
        assert log.read(1, 20) == recs(1, 6) + recs(6, 8, term=2, size=new_size)
    with SegmentLog(d, segment_bytes=1 << 16) as log:
        assert log.cut_records == 0
        assert log.last_index() == 7
        assert log.read(1, 20) == recs(1, 6) + recs(6, 8, term=2, size=new_size)


def test_truncation_across_segments_deletes_the_newer_ones(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 300))
        log.sync()
        n = log.segment_count()
        log.append(recs(40, 42, term=3))
        log.sync()
        assert log.segment_count() < n
        assert len(segs(d)) == log.segment_count()
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(1, 400) == recs(1, 40) + recs(40, 42, term=3)


def test_truncating_at_the_first_index_empties_the_log(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 100))
        log.sync()
        log.truncate_from(1)
        assert (log.first_index(), log.last_index()) == (1, 0)
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert (log.first_index(), log.last_index()) == (1, 0)
        assert log.read(1, 100) == []


def test_compaction_drops_whole_segments_only(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 300))
        log.sync()
        firsts = [s.first for s in log._segs]
        assert log.drop_before(firsts[1]) == 1  # exactly the first segment is below
        assert log.first_index() == firsts[1]
        assert log.drop_before(firsts[2] + 1) == 1  # the third one holds firsts[2]: kept
        assert log.first_index() == firsts[2]
        assert log.drop_before(10_000) == len(firsts) - 3  # never the newest
        assert log.segment_count() == 1
        kept_first = log.first_index()
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.first_index() == kept_first
        assert log.read(0, 400) == recs(kept_first, 300)
        log.append(recs(300, 303))


def test_reset_starts_afresh_and_a_crash_during_it_keeps_one_log(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 100))
        log.sync()
        log.reset(51)  # a snapshot at 50 installed over a log that went further
        assert (log.first_index(), log.last_index()) == (51, 50)
        log.append(recs(51, 53, term=4))
        log.sync()
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(0, 200) == recs(51, 53, term=4)
        # a crash after the new base segment was created, before the old ones were deleted
        log._new_segment(1000, base=True)
    assert len(segs(d)) == 2
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert (log.first_index(), log.last_index()) == (1000, 999)
        assert len(segs(d)) == 1


def test_a_segment_being_created_at_a_crash_is_discarded(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d) as log:
        log.append(recs(1, 5))
        log.sync()
    (d / "0000000000000002.seg.tmp").write_bytes(b"half made")
    with SegmentLog(d) as log:
        assert log.read(1, 10) == recs(1, 5)
    assert not list(d.glob("*.tmp"))


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        d = tmp_path / "wal"
        with SegmentLog(d, segment_bytes=SMALL) as log:
            log.append(recs(1, 100))
            log.sync()
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    files = list(d.iterdir())
    assert len(files) > 1
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}


_WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    from doq.storage.segment_log import SegmentLog
    from tests.storage.test_segment_log import recs
    log = SegmentLog({dir!r}, segment_bytes={size})
    nxt = log.last_index() + 1
    while True:
        batch = recs(nxt, nxt + 7, size=300)
        log.append(batch)
        log.sync()
        nxt += 7
        print(nxt - 1, flush=True)  # acknowledged: durable up to here
""")


def test_nothing_acknowledged_is_lost_when_the_writer_is_killed_mid_append(tmp_path: Path) -> None:
    """A real writer process appends and syncs batches without pause, printing the last
    index of each synced batch; SIGKILL lands at an arbitrary point of an append (three
    rounds on the same directory). Reopened, the log holds at least every acknowledged
    record, each one intact and in order."""
    d = tmp_path / "wal"
    root = str(Path(__file__).resolve().parents[2])
    code = _WRITER.format(paths=[root, *sys.path], dir=str(d), size=1 << 15)
    acked = 0
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        seen = 0
        for line in p.stdout:
            acked = int(line)
            seen += 1
            if seen == 60:  # the writer keeps going while the signal is sent
                break
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert p.returncode == -signal.SIGKILL
        with SegmentLog(d, segment_bytes=1 << 15) as log:
            assert log.last_index() >= acked
            got = log.read(1, log.last_index() + 1)
            assert got == recs(1, log.last_index() + 1, size=300)


def test_a_new_log_starts_with_a_small_segment_and_doubles_up_to_the_limit(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "wal", segment_bytes=4 << 20) as log:
        assert log._segs[0].size == 1 << 20
        nxt = 1
        while log.segment_count() < 4:
            log.append(recs(nxt, nxt + 100, size=4000))
            nxt += 100
        assert [s.size for s in log._segs] == [1 << 20, 2 << 20, 4 << 20, 4 << 20]
        log.reset(nxt)  # a base segment starts small again
        assert [s.size for s in log._segs] == [1 << 20]


def test_kinds_are_the_records_kinds_across_segments_and_a_reopen(tmp_path: Path) -> None:
    d = tmp_path / "wal"
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 200))
        log.sync()
        assert log.segment_count() > 3
        for lo, hi in [(1, 200), (1, 2), (57, 123), (199, 200), (150, 999), (0, 5), (7, 7)]:
            assert log.kinds(lo, hi) == bytes(r[2] for r in log.read(lo, hi)), (lo, hi)
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.kinds(1, 200) == bytes(i % 3 for i in range(1, 200))


def test_an_index_that_cannot_be_written_only_makes_the_next_open_scan(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A sealed segment's index is best effort: a full disk when it is written fails no
    append, leaves no temporary file, and the next open scans that segment."""
    d = tmp_path / "wal"
    real = mod.open_private

    def full_disk_for_indexes(path: Path, flags: int) -> int:
        if str(path).endswith(".idx.tmp"):
            raise OSError(28, "No space left on device")
        return real(path, flags)

    monkeypatch.setattr(mod, "open_private", full_disk_for_indexes)
    with SegmentLog(d, segment_bytes=SMALL) as log:
        log.append(recs(1, 300))
        log.sync()
        assert log.segment_count() > 3
    monkeypatch.undo()
    assert not any(p.name.endswith((".idx", ".tmp")) for p in d.iterdir())
    assert sorted(_reads(d)) == sorted(p.name for p in segs(d))  # every one scanned (indexes written now)
    assert _reads(d) == [segs(d)[-1].name]
    with SegmentLog(d, segment_bytes=SMALL) as log:
        assert log.read(1, 300) == recs(1, 300)
