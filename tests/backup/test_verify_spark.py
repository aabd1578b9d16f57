"""The verification job on real PySpark (local[2], one session for the test run): a chain
verifies with the digest of an offline restore of it, a big file is split across several
Spark tasks, and each kind of damage is reported (file, frame, offset) with exit code 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.chain import ChainFile, generate
from doq import cli
from doq.backup.format import BackupReader
from doq.backup.ops import restore_offline
from doq.backup.verify import VerifyReport, verify
from doq.storage import digest as D
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> list[ChainFile]:
    return generate(tmp_path_factory.mktemp("chain"), 6_000, 3, frame_bytes=8 * 1024)


@pytest.fixture
def chain(made: list[ChainFile], tmp_path: Path) -> list[Path]:
    """A private copy of the chain (tests damage it)."""
    out = []
    for f in made:
        shutil.copy(f.path, tmp_path / f.path.name)
        out.append(tmp_path / f.path.name)
    return out


def _run(spark: Any, paths: list[Path], **kw: Any) -> VerifyReport:
    return verify(paths, spark=spark, frames_per_task=4, **kw)


def _summary(path: Path) -> Any:
    with open(path, "rb") as f:
        return BackupReader(f).summary


def test_a_chain_verifies_and_its_rebuilt_state_is_the_restored_one(spark: Any, made: list[ChainFile],
                                                                    tmp_path: Path) -> None:
    paths = [f.path for f in made]
    r = _run(spark, paths)
    assert r.ok, [f.line() for f in r.failures]
    doc = r.to_dict()
    assert doc["verified"] and doc["records"] == sum(f.records for f in made)
    assert doc["state"]["digest"] == D.hex_digest(made[-1].digest)
    # the offline restore of the same chain holds exactly the rebuilt state
    restore_offline(tmp_path / "data", "n1", paths[0], paths[1:])
    env = open_env(node_dir(tmp_path / "data", "n1") / "doq.lmdb")
    try:
        st = StateStore(env)
        assert st.state_digest() == (r.to_version, r.digest)
        for q in st.list_queues():
            got = doc["state"]["queues"][q.name]
            assert (got["ready"], got["delayed"], got["in_flight"], got["dead"], got["type"]) == (
                q.stats.ready, q.stats.delayed, q.stats.in_flight, q.stats.dead, q.type.value), q.name
        assert set(doc["state"]["queues"]) == {q.name for q in st.list_queues()}
    finally:
        env.close()


def test_a_multi_frame_file_is_split_across_spark_tasks(spark: Any, made: list[ChainFile]) -> None:
    full = made[0].path
    frames = len(_summary(full).frames)
    r = _run(spark, [full])
    assert r.ok, [f.line() for f in r.failures]
    f = r.files[0]
    assert frames > 8 and f.tasks == -(-frames // 4) and f.tasks > 1
    assert len(f.partitions) == f.tasks > 1  # decoded by that many distinct Spark partitions (tasks)


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def _failures(r: VerifyReport) -> list[tuple[str, str | None, int | None, int | None]]:
    return [(f.reason, f.file, f.frame, f.offset) for f in r.failures]


def test_flipped_byte_in_the_header(spark: Any, chain: list[Path]) -> None:
    _flip(chain[1], 20)
    r = _run(spark, chain)
    assert ("BACKUP_CHECKSUM_MISMATCH", str(chain[1]), None, 0) in _failures(r)


def test_flipped_byte_in_a_frame(spark: Any, chain: list[Path]) -> None:
    fr = _summary(chain[0]).frames[5]
    _flip(chain[0], fr.offset + fr.length // 2)
    r = _run(spark, chain)
    assert _failures(r)[0] == ("BACKUP_CHECKSUM_MISMATCH", str(chain[0]), 5, fr.offset)
    assert not r.ok and r.files[0].frames_bad == 1 and r.digest is None  # no digest claimed


def test_flipped_byte_in_the_footer(spark: Any, chain: list[Path]) -> None:
    s = _summary(chain[2])
    _flip(chain[2], s.footer_offset + 3)
    r = _run(spark, chain)
    assert ("BACKUP_CHECKSUM_MISMATCH", str(chain[2]), None, s.footer_offset) in _failures(r)


def test_flipped_byte_in_the_trailer(spark: Any, chain: list[Path]) -> None:
    size = chain[2].stat().st_size
    _flip(chain[2], size - 10)  # the trailer's reserved field
    r = _run(spark, chain)
    assert ("BACKUP_CORRUPT", str(chain[2]), None, size - 10) in _failures(r)  # the field's own offset
    assert any("reserved field" in f.message for f in r.failures)


def test_truncated_file(spark: Any, chain: list[Path]) -> None:
    data = chain[1].read_bytes()
    chain[1].write_bytes(data[:-100])
    r = _run(spark, chain)
    assert _failures(r)[0][:2] == ("BACKUP_TRUNCATED", str(chain[1])) and not r.ok


def test_missing_incremental(spark: Any, chain: list[Path]) -> None:
    r = _run(spark, [chain[0], chain[2]])
    assert ("BACKUP_CHAIN_GAP", str(chain[2]), None, None) in _failures(r) and not r.ok


def test_files_out_of_order(spark: Any, chain: list[Path]) -> None:
    r = _run(spark, [chain[0], chain[2], chain[1]])
    reasons = {(f.reason, f.file) for f in r.failures}
    assert {("BACKUP_CHAIN_GAP", str(chain[2])), ("BACKUP_CHAIN", str(chain[1]))} <= reasons


def test_a_file_from_another_history(spark: Any, chain: list[Path], tmp_path: Path) -> None:
    """Another node's incremental, versions lined up, no cluster ids: the digest names it."""
    other = generate(tmp_path / "other", 7_000, 3, frame_bytes=8 * 1024)
    r = _run(spark, [chain[0], other[1].path, chain[2]])
    assert ("DIGEST_MISMATCH", str(other[1].path)) in {(f.reason, f.file) for f in r.failures}
    assert not r.ok


def test_a_file_of_another_cluster(spark: Any, chain: list[Path], tmp_path: Path) -> None:
    """Files that record their cluster: the chain rule names the stranger."""
    from doq.backup.format import BackupWriter

    def rewrite(src: Path, dst: Path, cluster: str) -> None:
        with open(src, "rb") as f:
            r = BackupReader(f)
            h, s = r.header, r.summary
            with open(dst, "wb") as out:
                w = BackupWriter(out, from_version=h.from_version, to_version=h.to_version, cluster_id=cluster,
                                 node_id=h.node_id, created_at_ms=h.created_at_ms, state_digest=s.state_digest)
                w.add_many(r.records())
                w.close()

    ours = [tmp_path / f"a{i}.bak" for i in range(3)]
    for i, p in enumerate(ours):
        rewrite(chain[i], p, "cluster-a" if i != 1 else "cluster-b")
    r = _run(spark, ours)
    f = next(f for f in r.failures if f.reason == "BACKUP_CLUSTER_MISMATCH")
    assert f.file == str(ours[1]) and all(x in f.message for x in ("cluster-a", "cluster-b", str(ours[0])))
    assert not r.ok and r.to_dict()["cluster_id"] == "cluster-a"


def test_doq_verify_exit_codes_and_report(spark: Any, chain: list[Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`doq verify` (in-process, on the session of the tests): 0 and a report when all is
    verified; 1 when anything is not; 2 for bad arguments."""
    report = tmp_path / "report.json"
    assert cli.main(["verify", *map(str, chain), "--report", str(report), "--quiet"]) == 0
    doc = json.loads(report.read_text())
    assert doc["verified"] and doc["failures"] == [] and len(doc["files"]) == 3
    assert "verified: 3 files" in capsys.readouterr().out
    _flip(chain[0], _summary(chain[0]).frames[0].offset)
    assert cli.main(["verify", *map(str, chain), "--json"]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert not doc["verified"] and doc["failures"][0]["reason"] == "BACKUP_CHECKSUM_MISMATCH"
    assert "frame 0, offset" in out.err  # the human summary on stderr names the place
    assert cli.main(["verify"]) == 2
    assert cli.main(["verify", str(chain[0]), "--dir", str(tmp_path)]) == 2
