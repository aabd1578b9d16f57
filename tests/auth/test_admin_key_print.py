"""Where the first admin key is shown (real `doq serve --secure` processes on 127.0.0.1):
its stdout a pipe (a pod's log) gets only the id and the path of `admin.key`; with
`--print-admin-key`, and when stdout is a terminal (a pty), the key itself."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def _started(node: NodeProc, tmp_path: Path) -> str:
    node.start()
    key_file = tmp_path / "admin.key"
    until("the admin key file", key_file.exists)
    until("the admin key announced", lambda: "admin key" in node.log())
    return key_file.read_text().strip()


def test_a_pipe_gets_the_path_not_the_key(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, extra_args=["--secure"])  # stdout: a file, not a terminal
    try:
        key = _started(node, tmp_path)
        log = node.log()
        assert key not in log and key.split("_", 2)[2] not in log  # not even the secret part
        assert str(tmp_path / "admin.key") in log and "--print-admin-key" in log
    finally:
        node.kill9()


def test_print_admin_key_prints_it_to_a_pipe(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, extra_args=["--secure", "--print-admin-key"])
    try:
        key = _started(node, tmp_path)
        assert f"(shown once): {key}" in node.log()
    finally:
        node.kill9()


def test_a_terminal_gets_the_key(tmp_path: Path) -> None:
    probe = NodeProc(tmp_path)  # for its ports and arguments only (never started)
    probe.extra_args = ["--secure"]
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "doq", "serve", "--data-dir", str(tmp_path), "--node-id", probe.node_id,
           "--grpc-addr", probe.grpc_addr, "--http-addr", f"127.0.0.1:{probe.http_port}",
           "--raft-addr", f"127.0.0.1:{probe.raft_port}", "--secure"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL,
                            env={**os.environ}, close_fds=True)
    os.close(slave)
    out = b""
    try:
        key_file = tmp_path / "admin.key"
        deadline = time.monotonic() + 120
        while b"(shown once)" not in out or not out.endswith(b"\n"):
            assert time.monotonic() < deadline, out.decode(errors="replace")
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the process ended
                    break
        until("the admin key file", key_file.exists)
        assert f"(shown once): {key_file.read_text().strip()}".encode() in out
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
