"""One process per node directory: an OS lock on `<node dir>/doq.lock`.

`NodeDirLock.acquire` takes an exclusive `flock` on the lock file and writes the holder's
pid into it. The kernel releases the lock when the holder's file is closed or the process
dies (kill -9 included), so a stale lock file never blocks a restart: only a live holder
does. The file descriptor is not inherited by child processes (Python's default), so a
child never keeps the lock alive after its parent.

The lock also remembers which directories it had to create, so that a start that fails
later (e.g. a port in use) can leave the disk as it found it (`release(discard=True)`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from doq.storage.files import DIR_MODE, open_private, tighten

LOCK_FILE = "doq.lock"


class NodeDirInUse(Exception):
    """Another live process holds the node directory's lock."""

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not written yet"
        super().__init__(
            f"data dir {path} is in use by another doq process ({holder}); "
            "stop it first, or give this node another --data-dir or --node-id"
        )
        self.path = path
        self.pid = pid


def _make_dirs(path: Path) -> list[Path]:
    """Create `path` and its missing parents; return the ones this call created, outermost
    first. A directory created concurrently by someone else is not counted as ours."""
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)  # private whatever the umask (doq/storage/files.py)
        except FileExistsError:
            continue
        created.append(d)
    return created


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class NodeDirLock:
    """An exclusive lock on one node directory, held until `release` or process exit."""

    def __init__(self, path: Path, fd: int, created: list[Path]) -> None:
        self.path = path
        self._fd: int | None = fd
        self._created = created

    @classmethod
    def acquire(cls, node_dir: str | os.PathLike[str]) -> NodeDirLock:
        """Lock `node_dir` (created if missing) for this process.

        Raises NodeDirInUse (naming the directory and the holder's pid) if another live
        process holds it, OSError if the directory is unusable. Never waits.
        """
        path = Path(node_dir).absolute()
        lock_path = path / LOCK_FILE
        created: list[Path] = []
        while True:
            created += _make_dirs(path)
            tighten(path, DIR_MODE)
            fd = open_private(lock_path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise NodeDirInUse(path, _read_pid(lock_path)) from None
            except BaseException:
                os.close(fd)
                raise
            # A holder that failed its start unlinks the file it locked: a lock on that
            # unlinked inode protects nothing, so lock the file now at the path instead.
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd, created)

    def release(self, *, discard: bool = False) -> None:
        """Release the lock. With `discard`, first remove what `acquire` created: the node
        directory with everything in it (only the lock holder writes there), then the
        parents it created if they are still empty (other nodes may share them). Idempotent."""
        if self._fd is None:
            return
        if discard and self.path in self._created:
            shutil.rmtree(self.path, ignore_errors=True)
            for d in reversed(self._created):
                with contextlib.suppress(OSError):
                    d.rmdir()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> NodeDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.release()
