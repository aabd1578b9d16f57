"""The server runs on the one generated copy in `doq_proto` (proto/generate.py says why it
lives there). That it imports nothing of the client package `doq_client` is an
import-linter contract (pyproject.toml, `make lint`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULES = ("doq.server", "doq.service.grpc_server", "doq.service.convert",
                  "doq.service.http_gateway", "doq.backup.format", "doq.backup.ops", "doq.backup.cli")


def test_server_modules_use_the_one_generated_copy() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {SERVER_MODULES!r}:\n"
        "    importlib.import_module(m)\n"
        "print('doq_proto.v1.doq_pb2' in sys.modules)\n"
    )
    path = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": path})
    assert out.stdout.split("\n")[0] == "True"
