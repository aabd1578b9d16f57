"""`doq backup --dir`: which file comes next in a chain directory, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from doq.backup.chain_dir import chain_files, next_file
from doq.backup.format import BackupFormatError, write_records


def _write(path: Path, since: int, last: int) -> None:
    with open(path, "wb") as f:
        write_records(f, [(b"k%d" % v, b"v", v) for v in range(max(since, 1), last + 1)],
                      from_version=since, to_version=last)


def test_an_empty_dir_starts_with_a_full_backup(tmp_path: Path) -> None:
    d = tmp_path / "new" / "chain"
    assert next_file(d) == (0, d / "000000-full.bak") and d.is_dir()


def test_the_next_file_continues_after_the_last_files_last_version(tmp_path: Path) -> None:
    _write(tmp_path / "000000-full.bak", 0, 7)
    assert next_file(tmp_path) == (8, tmp_path / "000001-since-8.bak")
    _write(tmp_path / "000001-since-8.bak", 8, 12)
    (tmp_path / "notes.txt").write_text("not part of the chain")
    (tmp_path / "000002-since-13.bak.part").write_bytes(b"an interrupted download")
    assert next_file(tmp_path) == (13, tmp_path / "000002-since-13.bak")
    # the chain is in the order of the numbers, not of the names' text
    _write(tmp_path / "10-since-13.bak", 13, 20)
    assert [p.name for p in chain_files(tmp_path)] == ["000000-full.bak", "000001-since-8.bak", "10-since-13.bak"]
    assert next_file(tmp_path) == (21, tmp_path / "000011-since-21.bak")


def test_a_damaged_last_file_is_named_and_nothing_is_chosen(tmp_path: Path) -> None:
    _write(tmp_path / "000000-full.bak", 0, 7)
    last = tmp_path / "000001-since-8.bak"
    _write(last, 8, 12)
    last.write_bytes(last.read_bytes()[:-5])
    with pytest.raises(BackupFormatError) as e:
        next_file(tmp_path)
    assert str(last) in e.value.message and e.value.reason == "BACKUP_TRUNCATED"
