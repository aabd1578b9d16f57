"""The verification job's pieces without Spark: task planning, the per-key rebuild, and
every damage found by the same driver and executor functions the Spark job runs (the
shuffle emulated in memory), each named with file, frame and byte offset."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from bench.chain import generate
from doq.backup.format import BackupReader, write_records
from doq.backup.rebuild import _FIXED, _LIVE, _history, decode_task, summarize
from doq.backup.verify import (
    VerifyReport,
    _combine,
    check_files_chain,
    find_now_ms,
    open_files,
    plan_tasks,
)
from doq.storage import digest as D


def run_without_spark(paths: list[Path], *, frames_per_task: int = 2, shuffle: int = 3) -> VerifyReport:
    """The job of doq.backup.verify._run, with Spark's shuffle done in memory."""
    names = [str(p) for p in paths]
    files, failures = open_files(names, names)
    failures += check_files_chain(files)
    report = VerifyReport(files, failures)
    tasks = plan_tasks(files, parallelism=2, frames_per_task=frames_per_task)
    now = find_now_ms(files)
    by_partition: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for t in tasks:
        for b, v in decode_task(t, shuffle):
            by_partition[b].append((b, v))
    parts = [p for b in range(shuffle) for p in summarize(by_partition[b], now, len(files))]
    _combine(report, parts, now)
    return report


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("chain")
    return [f.path for f in generate(d, 3000, 3, frame_bytes=4096)]


def _copy(chain: list[Path], tmp: Path) -> list[Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for p in chain:
        q = tmp / p.name
        shutil.copy(p, q)
        out.append(q)
    return out


def test_an_intact_chain_verifies_and_its_digest_is_the_recorded_one(chain: list[Path]) -> None:
    r = run_without_spark(chain)
    assert r.ok, [f.line() for f in r.failures]
    with open(chain[-1], "rb") as f:
        assert r.digest == BackupReader(f).summary.state_digest
    assert all(f.digest_ok for f in r.files)  # every file's digest, not only the last
    assert r.queues["orders"].has_record and r.queues["events"].messages > 0


def test_tasks_are_ranges_of_frames_covering_each_frame_once(chain: list[Path]) -> None:
    names = [str(p) for p in chain]
    files, _ = open_files(names, names)
    tasks = plan_tasks(files, parallelism=2, frames_per_task=3)
    assert files[0].summary is not None and len(files[0].summary.frames) > 6
    for fi, f in enumerate(files):
        assert f.summary is not None
        mine = [t for t in tasks if t[1] == fi]
        assert f.tasks == len(mine) > 1
        frames = [e for t in mine for e in t[4]]
        assert [e[0] for e in frames] == [e.offset for e in f.summary.frames]
        assert [t[3] for t in mine] == list(range(0, len(f.summary.frames), 3))
    # by size: a task holds at most task_bytes of frames (but at least one frame)
    by_size = plan_tasks(files, parallelism=1, task_bytes=1)
    assert len(by_size) == sum(len(f.summary.frames) for f in files if f.summary)


def _rec(f: int, version: int, live: bool, h: int = 0) -> tuple[int, int, int, int, bytes]:
    return (f, version, _LIVE if live else 0, 0, h.to_bytes(32, "big"))


def test_history_takes_the_highest_version_across_files_and_names_conflicts() -> None:
    deltas = [0, 0, 0]
    # created (file 0), deleted and written again by one entry (file 1), deleted (file 2)
    cur, problem = _history([_rec(2, 9, False), _rec(1, 5, True, 7), _rec(0, 3, True, 4), _rec(1, 5, False)], deltas)
    assert problem is None and cur is not None and cur[1] == 9 and not cur[2] & _LIVE
    assert deltas == [4, 7 - 4, -7]  # state up to file i: 4, then 7, then nothing
    # overlap: the same record in two files counts once
    deltas = [0, 0]
    cur, problem = _history([_rec(0, 3, True, 4), _rec(1, 3, True, 4)], deltas)
    assert (problem, deltas) == (None, [4, 0])
    # the same version with another value: files of different histories
    _, problem = _history([_rec(0, 3, True, 4), _rec(1, 3, True, 5)], [0, 0])
    assert problem is not None and "differs between file #1 and file #2" in problem
    # two live records of one key in one file
    _, problem = _history([_rec(0, 3, True, 4), _rec(0, 4, True, 5)], [0])
    assert problem is not None and "2 live records" in problem


def test_fixed_part_round_trips() -> None:
    digest = D.item_digest(b"k", b"v", 7)
    assert _FIXED.unpack(_FIXED.pack(1, 7, _LIVE, -1, digest)) == (1, 7, _LIVE, -1, digest)


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_byte_anywhere_is_named_with_file_frame_and_offset(chain: list[Path], tmp_path: Path) -> None:
    with open(chain[1], "rb") as f:
        s = BackupReader(f).summary
    size = s.file_bytes
    positions = sorted({0, 8, 11, 14, 20, 30, s.frames[0].offset - 1,  # preamble, header, header CRC
                        *(fr.offset + k * fr.length // 3 for fr in s.frames[::2] for k in range(3)),  # frames
                        s.frames[-1].offset + s.frames[-1].length - 1,
                        s.footer_offset, (s.footer_offset + size - 32) // 2,  # footer
                        *range(size - 32, size)})  # every byte of the trailer
    for pos in positions:
        files = _copy(chain, tmp_path / f"at{pos}")
        _flip(files[1], pos)
        r = run_without_spark(files)
        assert not r.ok, pos
        mine = [f for f in r.failures if f.file == str(files[1])]
        assert mine, (pos, [f.line() for f in r.failures])
        first = mine[0]
        assert first.offset is not None and first.offset <= pos < size, (pos, first.line())
        if s.frames[0].offset <= pos < s.footer_offset:  # in a frame: that frame, by index and offset
            k = max(i for i, fr in enumerate(s.frames) if fr.offset <= pos)
            assert (first.frame, first.offset, first.reason) == (k, s.frames[k].offset, "BACKUP_CHECKSUM_MISMATCH")


def test_a_truncated_file_is_named(chain: list[Path], tmp_path: Path) -> None:
    files = _copy(chain, tmp_path)
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])
    r = run_without_spark(files)
    f = r.failures[0]
    assert (f.reason, f.file) == ("BACKUP_TRUNCATED", str(files[0])) and f.offset is not None


def test_chain_problems_are_all_named(chain: list[Path]) -> None:
    missing = run_without_spark([chain[0], chain[2]])
    assert [(f.reason, f.file) for f in missing.failures][:1] == [("BACKUP_CHAIN_GAP", str(chain[2]))]
    swapped = run_without_spark([chain[0], chain[2], chain[1]])
    reasons = {(f.reason, f.file) for f in swapped.failures}
    assert ("BACKUP_CHAIN_GAP", str(chain[2])) in reasons and ("BACKUP_CHAIN", str(chain[1])) in reasons
    no_full = run_without_spark(chain[1:])
    assert ("BACKUP_CHAIN", str(chain[1])) in {(f.reason, f.file) for f in no_full.failures}


def test_a_last_file_without_a_digest_is_not_proven(tmp_path: Path) -> None:
    p = tmp_path / "old.bak"
    with open(p, "wb") as f:
        write_records(f, [(b"G", (1).to_bytes(8, "little") * 3, 1)], from_version=0, to_version=1)
    r = run_without_spark([p])
    assert [f.reason for f in r.failures] == ["DIGEST_NOT_RECORDED"] and r.digest is not None


def test_no_file_is_not_a_verified_chain() -> None:
    r = run_without_spark([])
    assert not r.ok and [f.reason for f in r.failures] == ["BACKUP_CHAIN"]


def test_message_delivery_agrees_with_message_view() -> None:
    """The job classifies messages with records.message_delivery: the rule of message_view."""
    from doq.queues import records as R
    from doq.queues.model import MessageState

    now = 1_700_000_000_000
    for prio in (-5, 0, 7, R.TS_PRIORITY_MIN - 1, 1_700_000_000, 1_700_000_001, 2**62):
        for not_before in (0, now - 1, now, now + 1):
            for flags in (0, R.FLAG_IN_FLIGHT):
                rec = R.encode_message(prio, not_before, now - 10, b"g", b"d", b"", b"x", flags=flags)
                in_flight, at = R.message_delivery(rec)
                view = R.message_view("q", 1, rec, now)
                assert (at, R.message_state(in_flight, at, now)) == (view.deliver_at_ms, view.state)
                assert in_flight == (view.state is MessageState.IN_FLIGHT)
    with pytest.raises(ValueError):
        R.message_delivery(b"short")


def test_dedup_runs_back_up_restore_and_verify_with_ids_counted(tmp_path: Path) -> None:
    """A state holding runs of a producer's ids (and ids stored alone): full + incremental
    backups verify (digest proven, dedup ids counted, not records) and restore it exactly;
    a backup from before runs (one 16-byte record per id) restores and deduplicates."""
    from doq.backup.ops import write_backup
    from doq.queues import commands as c
    from doq.queues import keys as K
    from doq.queues import records as R
    from doq.queues.codec import encode_batch
    from doq.queues.model import EnqueueColumnsResult, QueueSettings
    from doq.storage.env import open_env
    from doq.storage.state import StateStore

    t0 = 1_700_000_000_000
    p = "00000000000000a1-"
    dids = [f"{p}{s:012x}" for s in range(1, 301)]

    def store(name: str) -> StateStore:
        return StateStore(open_env(tmp_path / name, map_size=1 << 28))

    def apply(st: StateStore, index: int, now: int, *cmds: c.Command) -> list[object]:
        with st.write() as txn:
            return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(now, list(cmds))))])[0]

    def cols(ds: list[str]) -> c.Command:
        return c.EnqueueColumns("q", [b"x"] * len(ds), dedup_ids=ds)

    st = store("live")
    apply(st, 1, t0, c.CreateQueue("q", "delayed", QueueSettings(dedup_window_ms=1000)), cols(dids[:100]),
          c.Enqueue("q", [c.EnqueueItem(b"y", dedup_id="mine")]))
    apply(st, 2, t0 + 1, cols(dids[50:200]))
    full = tmp_path / "full.bak"
    with open(full, "wb") as f:
        last = write_backup(st, 0, f)
    apply(st, 3, t0 + 1000, cols(dids[200:]))  # the first run and "mine" expire
    inc = tmp_path / "inc.bak"
    with open(inc, "wb") as f:
        write_backup(st, last + 1, f)
    r = run_without_spark([full, inc])
    assert r.ok, [f.line() for f in r.failures]
    assert r.queues["q"].dedup == st.machine.dedup_n == 200  # 101..200 and 201..300
    assert r.queues["q"].ready == 301
    assert r.digest == st.state_digest()[1]
    dkeys = sorted(k for k, v, _ in st.iter_changes(0) if k[0] == K.DEDUP and v is not None)
    assert dkeys == [K.dedup_key("q", dids[100]), K.dedup_key("q", dids[200])]
    # restore: the same state, and it deduplicates
    rst = store("restored")
    rst.restore([*st.iter_changes(0)], st.applied_index)
    assert rst.dump_state_bytes() == st.dump_state_bytes()
    res = apply(rst, 4, t0 + 1000, cols(dids[150:160]))
    assert isinstance(res[0], EnqueueColumnsResult) and res[0].duplicates == list(range(10))
    # a backup from before runs: one record per id
    old = []
    for k, v, ver in st.iter_changes(0):
        if v is not None and k[0] == K.DEDUP:
            id0, exp, n = R.decode_dedup(v)
            first = int(k[-12:], 16)
            old += [(K.dedup_key("q", f"{p}{s:012x}"), R.DEDUP_REC.pack(id0 + s - first, exp), ver)
                    for s in range(first, first + n)]
        elif v is not None:
            old.append((k, v, ver))
    ost = store("old")
    ost.restore(sorted(old, key=lambda x: (x[2], x[0])), st.applied_index)
    assert ost.machine.dedup_n == 200
    res = apply(ost, 4, t0 + 1000, cols(dids[150:160] + [f"{p}{301:012x}"]))
    assert isinstance(res[0], EnqueueColumnsResult)
    assert res[0].duplicates == list(range(10)) and list(res[0].ids)[:10] == list(range(152, 162))


def test_an_unreadable_full_backup_stops_verify_with_its_one_cause(chain: list[Path], tmp_path: Path) -> None:
    """No chain, state or digest failures that only follow from it, and no state summary
    of a chain that was not read (Spark is not even started: `spark` is never used)."""
    from doq.backup.verify import verify

    files = _copy(chain, tmp_path)
    files[0].write_bytes(b"PK\x03\x04 not a backup at all")
    r = verify(files, spark=object())
    assert [(f.reason, f.file) for f in r.failures] == [("BACKUP_BAD_MAGIC", str(files[0]))]
    assert not r.ok and "cannot be read" in r.stopped and str(files[0]) in r.stopped
    line = r.summary_line()
    assert "queues" not in line and "messages" not in line and "nothing after it was checked" in line
    doc = r.to_dict()
    assert doc["state"] is None and doc["stopped"] == r.stopped


def test_two_files_of_one_base_name_are_told_apart_in_a_chain_problem() -> None:
    from doq.backup.format import BackupHeader
    from doq.backup.ops import chain_problems

    a = BackupHeader("cluster-a", "n1", 0, 10, 0, 1)
    b = BackupHeader("cluster-b", "n1", 11, 20, 0, 1)
    [(i, err)] = chain_problems([a, b], names=["x.bak", "x.bak"])
    assert i == 1 and err.reason == "BACKUP_CLUSTER_MISMATCH"
    assert "x.bak (file #2) is a backup of cluster 'cluster-b', but x.bak (file #1)" in err.message
