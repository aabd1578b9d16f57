"""The file door: every directory doq creates or owns is 0700, every file it writes 0600,
whatever the process umask (other local users read nothing: messages, keys, certificates,
backups).

Creation asks for the private mode (the umask can only remove bits, never add them), and
what already exists is tightened (`chmod`): a data dir written by an older doq, or one
created by hand with a loose mode, becomes private on the next start.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and missing parents, each 0700) if needed and make it 0700. Raises OSError."""
    p = Path(path)
    missing = []
    q = p
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
    tighten(p, DIR_MODE)
    return p


def tighten(path: str | os.PathLike[str], mode: int = FILE_MODE) -> None:
    """Set `path`'s mode to `mode` if it is looser (or other); missing files are ignored."""
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_mode & 0o7777 != mode:
            os.chmod(path, mode)


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """`os.open` for writing a private file: created 0600, an existing one tightened to 0600."""
    fd = os.open(path, flags, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o7777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_binary(path: str | os.PathLike[str]) -> IO[bytes]:
    """`open(path, "wb")`, but the file is 0600 whatever the umask."""
    return os.fdopen(open_private(path), "wb")


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` (0600), flushed and fsynced."""
    fd = open_private(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
