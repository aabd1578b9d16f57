"""The file door (issue 18): whatever the umask (0o022, 0o000), a real `doq serve` makes its
data dir and every directory under it 0700 and every file it writes (LMDB data and lock,
the node lock) 0600; `doq backup` writes 0600 files (and a 0700 chain directory); an
offline `doq restore` leaves the same modes. A data dir left loose by an older version is
tightened on the next start. Real processes, real files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import call
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def modes(root: Path, skip: set[Path] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """{path relative to root: permission bits} of root and everything below it."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p not in skip:
                out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def loose(found: dict[str, int], root: Path) -> dict[str, str]:
    """Entries whose mode is not 0700 (directory) / 0600 (file)."""
    bad = {}
    for rel, mode in found.items():
        want = 0o700 if (root / rel).is_dir() else 0o600
        if mode != want:
            bad[rel] = oct(mode)
    return bad


def run_cli(args: list[str], umask: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True,
                          timeout=120, umask=umask, env={**os.environ})


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_every_directory_is_0700_and_every_file_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    data = tmp_path / "data"
    node = NodeProc(data, umask=umask)
    node.log_path = tmp_path / "node.log"  # the harness's log lives outside the data dir
    node.start()
    try:
        status, body = call(node, "POST", "/API/v1/queues", {"name": "jobs"})
        assert status in (200, 201), body
        status, body = call(node, "POST", "/API/v1/queues/jobs/messages", {"content": "secret"})
        assert status in (200, 201), body
        one = tmp_path / "one.bak"
        res = run_cli(["backup", "--server", node.http_url, "-o", str(one)], umask)
        assert res.returncode == 0, res.stderr
        chain = tmp_path / "chain"
        res = run_cli(["backup", "--server", node.http_url, "--dir", str(chain)], umask)
        assert res.returncode == 0, res.stderr
        assert loose(modes(data), data) == {}
    finally:
        node.kill9()
    assert stat.S_IMODE(one.stat().st_mode) == 0o600
    assert loose(modes(chain), chain) == {}
    assert {p.name for p in (data / "node-1").iterdir()} >= {"doq.lmdb"}
    assert {p.name for p in (data / "node-1" / "doq.lmdb").iterdir()} >= {"data.mdb", "lock.mdb"}

    restored = tmp_path / "restored"
    res = run_cli(["restore", "--data-dir", str(restored), "-f", str(one)], umask)
    assert res.returncode == 0, res.stderr
    assert loose(modes(restored), restored) == {}


def test_a_loose_data_dir_of_an_older_version_is_tightened_on_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    node = NodeProc(data, umask=0o022)
    node.log_path = tmp_path / "node.log"
    node.start()
    node.kill9()
    for dirpath, dirnames, filenames in os.walk(data):  # as doq wrote them before issue 18
        for d in dirnames:
            os.chmod(Path(dirpath) / d, 0o755)
        for f in filenames:
            os.chmod(Path(dirpath) / f, 0o644)
    os.chmod(data, 0o755)
    node.start()
    try:
        assert loose(modes(data), data) == {}
    finally:
        node.kill9()
