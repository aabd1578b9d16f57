"""A backup chain kept in one directory (`doq backup --dir`, `doq verify --dir`).

Files are named `NNNNNN-full.bak` (the first, since 0) and `NNNNNN-since-V.bak` (the
incrementals), NNNNNN the position in the chain: the chain is the `*.bak` files whose name
starts with a number, in the order of that number. `doq backup --dir` writes the next one
(full when there is none) with `since` = the last file's last version + 1. Run one
`doq backup --dir` at a time per directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from doq.backup.format import BackupFormatError, BackupReader
from doq.storage.files import private_dir

_NAME = re.compile(r"^(\d+)-[^/]*\.bak$")


def chain_files(directory: Path) -> list[Path]:
    """The chain's files in order (by their number); other files are not part of it."""
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p.name, p))
    return [p for _, _, p in sorted(found)]


def next_file(directory: Path) -> tuple[int, Path]:
    """(since, path) of the next file of the chain in `directory` (created if missing).
    Raises BackupFormatError (naming the file) if the last file does not read, OSError."""
    private_dir(directory)
    files = chain_files(directory)
    if not files:
        return 0, directory / f"{0:06d}-full.bak"
    last = files[-1]
    with open(last, "rb") as f:
        try:
            summary = BackupReader(f).summary
        except BackupFormatError as e:
            raise BackupFormatError(e.reason.removeprefix("BACKUP_"), f"{last}: {e.message} (the chain's "
                                    "last file: repair or move it away before the next backup)",
                                    offset=e.offset) from e
    m = _NAME.match(last.name)
    assert m is not None
    since = summary.last_version + 1
    return since, directory / f"{int(m.group(1)) + 1:06d}-since-{since}.bak"
