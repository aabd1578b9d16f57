"""End to end with real `doq serve` processes: `doq backup` (full + incremental, deletions
included), then `doq restore` offline into a new data dir and online into a fresh node."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from doq.backup.format import BackupReader
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration


def _call(node: NodeProc, method: str, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read()
    return json.loads(text) if text else None


def _doq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True, timeout=60)


def _records(path: Path) -> list[tuple[bytes, bytes | None, int]]:
    with open(path, "rb") as f:
        return list(BackupReader(f).records())


def _live(node: NodeProc) -> dict[bytes, bytes | None]:
    """Latest value per key from a fresh full backup (tombstones as None)."""
    out: dict[bytes, bytes | None] = {}
    f = node.data_dir / "check.bak"
    r = _doq("backup", "--server", node.http_url, "--since", "0", "-o", str(f))
    assert r.returncode == 0, r.stderr
    for k, v, _ in _records(f):
        out[k] = v
    return out


def test_backup_and_restore_end_to_end(tmp_path: Path) -> None:
    with running_node(tmp_path / "src") as src:
        _call(src, "POST", "/API/v1/queues", {"name": "user_indexing_queue", "type": "delayed"})
        _call(src, "POST", "/API/v1/queues", {"name": "other", "type": "fair"})
        ids = [_call(src, "POST", "/API/v1/queues/user_indexing_queue/messages",
                     {"content": json.dumps({"user_id": i}), "group": "default", "priority": 60 + i})["id"]
               for i in range(20)]
        full = tmp_path / "backup-0.bak"
        r = _doq("backup", "--server", src.http_url, "--since", "0", "-o", str(full), "--json")
        assert r.returncode == 0, r.stderr
        last0 = json.loads(r.stdout)["last_version"]
        assert last0 > 0 and _records(full)

        _call(src, "DELETE", f"/API/v1/queues/user_indexing_queue/messages/{ids[0]}")
        _call(src, "PUT", f"/API/v1/queues/user_indexing_queue/messages/{ids[1]}/priority", {"priority": 12})
        _call(src, "DELETE", "/API/v1/queues/other")
        inc = tmp_path / "backup-1.bak"
        r = _doq("backup", "--server", src.http_url, "--since", str(last0 + 1), "-o", str(inc), "--json")
        assert r.returncode == 0, r.stderr
        last1 = json.loads(r.stdout)["last_version"]
        assert last1 > last0
        assert any(v is None for _, v, _ in _records(inc))  # the deletions travel as tombstones
        expected = _live(src)
        queues = _call(src, "GET", "/API/v1/queues")

    # offline into a new data dir, then serve it
    r = _doq("restore", "-f", str(full), "-i", str(inc), "--data-dir", str(tmp_path / "off"), "--node-id", "node-1")
    assert r.returncode == 0, r.stderr
    with running_node(tmp_path / "off") as off:
        assert _live(off) == expected
        assert _call(off, "GET", "/API/v1/queues") == queues
        got = _call(off, "GET", f"/API/v1/queues/user_indexing_queue/messages/{ids[1]}")
        assert got["priority"] == 12  # type: ignore[index]

    # online into a fresh node
    with running_node(tmp_path / "on") as on:
        r = _doq("restore", "--server", on.http_url, "-f", str(full), "-i", str(inc))
        assert r.returncode == 0, r.stderr
        assert _live(on) == expected
        assert _call(on, "GET", "/API/v1/queues") == queues
        # a second online restore is refused: the node is no longer empty
        r = _doq("restore", "--server", on.http_url, "-f", str(full))
        assert r.returncode == 1 and "not empty" in r.stderr
        # and the node keeps working after the restore, with versions moving forward
        _call(on, "POST", "/API/v1/queues/user_indexing_queue/messages", {"content": "after"})
        r = _doq("backup", "--server", on.http_url, "--since", str(last1 + 1), "-o", str(tmp_path / "after.bak"),
                 "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["last_version"] > last1


def _restore_json(*args: str) -> dict[str, int]:
    r = _doq("restore", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_a_repeated_or_overlapping_incremental_is_restored_and_counted_once(tmp_path: Path) -> None:
    """Real files from a real node: the chain full + inc1 + inc1 (the same file twice) and
    full + inc1 + an incremental since the full (overlapping inc1) restore the same state
    and report the same records as the chains without the repeat, offline and online."""
    def backup(name: str, since: int) -> tuple[Path, int]:
        out = tmp_path / name
        r = _doq("backup", "--server", src.http_url, "--since", str(since), "-o", str(out), "--json")
        assert r.returncode == 0, r.stderr
        return out, json.loads(r.stdout)["last_version"]

    q = "/API/v1/queues/jobs"
    with running_node(tmp_path / "src") as src:
        _call(src, "POST", "/API/v1/queues", {"name": "jobs", "type": "delayed"})
        ids = [_call(src, "POST", f"{q}/messages", {"content": f"m{i}"})["id"] for i in range(10)]  # type: ignore[index]
        full, last0 = backup("full.bak", 0)
        for i in range(5):
            _call(src, "POST", f"{q}/messages", {"content": f"n{i}"})
        _call(src, "DELETE", f"{q}/messages/{ids[0]}")
        inc1, last1 = backup("inc1.bak", last0 + 1)
        for i in range(3):
            _call(src, "POST", f"{q}/messages", {"content": f"o{i}"})
        _call(src, "DELETE", f"{q}/messages/{ids[1]}")
        inc2, _ = backup("inc2.bak", last1 + 1)  # the next one, and one reaching back to the full:
        overlap, _ = backup("overlap.bak", last0 + 1)  # taken at the same point
        expected = _live(src)

    plain = _restore_json("-f", str(full), "-i", str(inc1), "--data-dir", str(tmp_path / "a"))
    repeated = _restore_json("-f", str(full), "-i", str(inc1), "-i", str(inc1), "--data-dir", str(tmp_path / "b"))
    assert (repeated["records"], repeated["tombstones"]) == (plain["records"], plain["tombstones"])
    assert repeated["files"] == 3
    chained = _restore_json("-f", str(full), "-i", str(inc1), "-i", str(inc2), "--data-dir", str(tmp_path / "c"))
    overlapping = _restore_json("-f", str(full), "-i", str(inc1), "-i", str(overlap), "-i", str(overlap),
                                "--data-dir", str(tmp_path / "d"))
    assert (overlapping["records"], overlapping["tombstones"]) == (chained["records"], chained["tombstones"])
    assert chained["records"] < plain["records"] + len(_records(overlap))  # the overlap is not counted again
    with running_node(tmp_path / "d") as restored:
        assert _live(restored) == expected
    with running_node(tmp_path / "on") as on:
        online = _restore_json("--server", on.http_url, "-f", str(full), "-i", str(inc1), "-i", str(inc1),
                               "-i", str(overlap))
        assert (online["records"], online["tombstones"]) == (chained["records"], chained["tombstones"])
        assert _live(on) == expected
