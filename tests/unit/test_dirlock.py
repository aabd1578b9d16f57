"""`NodeDirLock` on real files (flock conflicts between open files, also in one process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from doq.storage.dirlock import LOCK_FILE, NodeDirInUse, NodeDirLock


def test_a_held_directory_is_refused_with_its_path_and_pid(tmp_path: Path) -> None:
    d = tmp_path / "data" / "node-1"
    with NodeDirLock.acquire(d):
        assert (d / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(NodeDirInUse) as e:
            NodeDirLock.acquire(d)
        assert e.value.pid == os.getpid() and e.value.path == d
        assert str(d) in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    NodeDirLock.acquire(d).release()  # released: free again


def test_discard_removes_only_what_acquire_created(tmp_path: Path) -> None:
    shared = tmp_path / "data"
    lock = NodeDirLock.acquire(shared / "node-1")
    (shared / "node-2").mkdir()  # another node arrives in the data dir meanwhile
    (shared / "node-1" / "doq.lmdb").mkdir()
    lock.release(discard=True)
    assert sorted(p.name for p in shared.iterdir()) == ["node-2"]
    lock.release(discard=True)  # idempotent
    existing = NodeDirLock.acquire(shared / "node-2")
    existing.release(discard=True)  # did not create it: keeps it
    assert (shared / "node-2").is_dir()


def test_a_lock_on_a_replaced_file_does_not_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the file is unlinked (a failed start discarding its directory) between our open and
    our flock, the lock we got protects nothing: acquire must lock the file now at the path."""
    import fcntl

    from doq.storage import dirlock

    d = tmp_path / "node-1"
    real_flock = fcntl.flock
    calls = []

    def racing_flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            (d / LOCK_FILE).unlink()
        real_flock(fd, op)

    monkeypatch.setattr(dirlock.fcntl, "flock", racing_flock)
    lock = NodeDirLock.acquire(d)
    monkeypatch.setattr(dirlock.fcntl, "flock", real_flock)
    assert len(calls) == 2
    with pytest.raises(NodeDirInUse):
        NodeDirLock.acquire(d)  # the file at the path is the one held
    lock.release()
