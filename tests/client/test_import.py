"""The client is importable and installable without the server's dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.client.conftest import CLIENT_DIR

SERVER_ONLY = ("doq", "lmdb", "fastapi", "uvicorn", "zstandard", "sortedcontainers", "starlette")


def test_import_pulls_no_server_modules(tmp_path: Path) -> None:
    code = (
        "import sys, doq_client\n"
        "from doq_client import DoqClient, AsyncDoqClient, Producer, Consumer\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r})\n"
        "print(','.join(bad))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(CLIENT_DIR)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ""


def test_pip_install_of_the_client_package(tmp_path: Path) -> None:
    # Build from a copy: an in-place build leaves build/ and an egg-info in clients/python,
    # which is on the test path and would then pose as an installed `doq-client`.
    source = tmp_path / "src"
    shutil.copytree(CLIENT_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*"))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert (target / "doq_proto" / "v1" / "doq_pb2_grpc.py").exists()
    assert (target / "doq_proto" / "v1" / "doq_pb2.pyi").exists()
    assert (target / "doq_proto" / "py.typed").exists()
    assert (target / "doq_client" / "py.typed").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", "import doq_client, doq_proto; print(doq_client.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith(str(target))
