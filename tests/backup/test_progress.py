"""Progress of long client work on stderr (`doq.progress`), against real `doq serve`
processes: `doq backup` draws its download and `doq restore --server` its upload when
asked (a terminal, or DOQ_PROGRESS=1 here), and nothing at all in a pipe or with `--json`,
where stdout carries only the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.proc import running_node

pytestmark = pytest.mark.integration


def doq(*args: str, progress: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DOQ_PROGRESS"}
    if progress is not None:
        env["DOQ_PROGRESS"] = progress
    proc = subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_backup_and_restore_show_progress_only_when_asked(tmp_path: Path) -> None:
    with running_node(tmp_path / "a") as src:
        req = urllib.request.Request(src.http_url + "/API/v1/queues", method="POST",
                                     data=json.dumps({"name": "p", "type": "delayed"}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).close()
        batch = {"messages": [{"content": "x" * 1000} for _ in range(2000)]}
        req = urllib.request.Request(src.http_url + "/API/v1/queues/p/messages:batch", method="POST",
                                     data=json.dumps(batch).encode(), headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).close()

        shown = doq("backup", "-o", str(tmp_path / "full.bak"), "--server", src.http_url, progress="1")
        assert "backup" in shown.stderr and "B" in shown.stderr  # the bar: its label and a byte count
        assert shown.stdout.startswith("wrote ")  # the result alone on stdout

        quiet = doq("backup", "-o", str(tmp_path / "again.bak"), "--server", src.http_url, progress=None)
        assert quiet.stderr == "" and quiet.stdout.startswith("wrote ")  # a pipe: no progress
        as_json = doq("backup", "-o", str(tmp_path / "j.bak"), "--server", src.http_url, "--json", progress="1")
        assert as_json.stderr == "" and json.loads(as_json.stdout)["records"] >= 2000

    with running_node(tmp_path / "b") as dst:
        shown = doq("restore", "-f", str(tmp_path / "full.bak"), "--server", dst.http_url, progress="1")
        assert "restore" in shown.stderr and shown.stdout.startswith("restored ")

    # offline: the records written, counted against the files' total; nothing in a pipe
    shown = doq("restore", "-f", str(tmp_path / "full.bak"), "--data-dir", str(tmp_path / "c"), progress="1")
    assert "restore" in shown.stderr and "records" in shown.stderr and shown.stdout.startswith("restored ")
    quiet = doq("restore", "-f", str(tmp_path / "full.bak"), "--data-dir", str(tmp_path / "d"), progress=None)
    assert quiet.stderr == "" and quiet.stdout.startswith("restored ")
    assert shown.stdout.split(" records")[0] == quiet.stdout.split(" records")[0]  # the same restore either way


@pytest.mark.parametrize("argv, env, shown", [
    ([], "1", True), (["--quiet"], "1", False), (["--json"], "1", False), ([], "0", False), ([], None, False),
])
def test_verify_shows_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                  env: str | None, shown: bool) -> None:
    """`doq verify`'s progress lines (pytest's stderr is not a terminal: DOQ_PROGRESS=1 stands in for one)."""
    import argparse

    from doq.backup.verify_cli import add_arguments, progress_shown

    if env is None:
        monkeypatch.delenv("DOQ_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("DOQ_PROGRESS", env)
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert progress_shown(p.parse_args(["f.bak", *argv])) is shown
