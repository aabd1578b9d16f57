"""`make serve` sets up only what the server needs; `make test` adds the rest; the two
installs keep separate stamps and never undo or repeat each other."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _make_n(target: str, venv: Path) -> list[str]:
    """The commands `make target` would run (dry run) with VENV=venv."""
    out = subprocess.run(["make", "-n", "-s", target, f"VENV={venv}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [x for x in lines if "pip install" in x and "--upgrade pip" not in x]


def test_make_serve_installs_the_base_package_and_make_test_the_extras(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    [serve_install] = _installs(_make_n("serve", venv))
    assert serve_install.rstrip().endswith("pip install -q -c constraints.txt -e .")  # pinned versions
    [test_install] = _installs(_make_n("test", venv))
    assert test_install.rstrip().endswith("pip install -q -c constraints.txt -e '.[all]'")

    # A venv set up by `make serve`: `make serve` installs nothing more, `make test` the extras.
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed-server").touch()
    assert _installs(_make_n("serve", venv)) == []
    assert _installs(_make_n("test", venv)) == [test_install]
    # After `make test`, neither reinstalls.
    (venv / ".installed-dev").touch()
    assert _installs(_make_n("serve", venv)) == [] and _installs(_make_n("test", venv)) == []


def _base_closure() -> set[str]:
    """Distributions `pip install -e .` brings: doq's requirements without extras (read from
    this repository's pyproject.toml, not from whatever doq the environment has installed:
    a shared environment may hold another checkout, under another name), transitively (with
    the extras those requirements ask for, e.g. uvicorn[standard])."""
    seen: set[str] = set()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    todo: list[tuple[str, frozenset[str]]] = [
        (r.name, frozenset(r.extras)) for r in map(Requirement, project["dependencies"])]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if (key, extras) in seen:
            continue
        seen.add((key, extras))  # type: ignore[arg-type]
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # a requirement for another platform/python: not installed here
        for raw in reqs:
            req = Requirement(raw)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return {k for k, _ in seen}  # type: ignore[misc]


def _module_owners() -> dict[str, set[str]]:
    """Module name -> the installed distributions that ship it (from their RECORD files)."""
    owners: dict[str, set[str]] = {}
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        for f in dist.files or ():
            parts = list(f.parts)
            if not parts or f.suffix not in (".py", ".so") or "__pycache__" in parts or ".." in parts:
                continue
            parts[-1] = parts[-1].split(".")[0]
            if parts[-1] == "__init__":
                parts.pop()
            if parts and all(p.isidentifier() for p in parts):
                owners.setdefault(".".join(parts), set()).add(name)
    return owners


def _imported_distributions(importtime_stderr: str) -> set[str]:
    """The distributions whose modules `-X importtime` saw imported (stdlib and doq own none)."""
    names = {m.group(1).strip()
             for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(.+)$", importtime_stderr, re.M)}
    owners = _module_owners()
    return {d for n in names for d in owners.get(n, ())}


# A virtualenv comes with pip and setuptools (the site start-up may import from them);
# `grpc/__init__.py` imports grpc_tools only if it is installed (try/except ImportError).
# anyio imports sniffio when it is installed (it is optional there); the dev install has it
# (selenium's trio), a server install does not.
NOT_NEEDED = {"pip", "setuptools", "grpcio-tools", "sniffio"}
DISTRIBUTION = "doq-server"  # doq's name on the package index (pyproject.toml)


def test_the_server_imports_only_what_the_base_package_installs(tmp_path: Path) -> None:
    """`doq serve`, serving HTTP and gRPC requests, imports nothing from the extras."""
    node = NodeProc(tmp_path / "data")
    node.extra_args = []
    log = tmp_path / "serve.err"
    cmd = [sys.executable, "-X", "importtime", "-m", "doq", "serve", "--data-dir", str(node.data_dir),
           "--grpc-addr", node.grpc_addr, "--http-addr", f"127.0.0.1:{node.http_port}",
           "--raft-addr", f"127.0.0.1:{node.raft_port}"]
    with open(log, "w") as err:
        node.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ})  # type: ignore[assignment]
    try:
        node.log_path = log
        node.wait_ready(60)
        req = urllib.request.Request(node.http_url + "/API/v1/queues", method="POST",
                                     data=json.dumps({"name": "q", "type": "fair"}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
        urllib.request.urlopen(node.http_url + "/docs", timeout=10).close()
        urllib.request.urlopen(node.http_url + "/metrics", timeout=10).close()
        from doq_client import DoqClient

        with DoqClient(node.grpc_addr) as c:
            c.enqueue("q", b"x", group="g")
            assert len(c.dequeue("q", ack=True)) == 1
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGTERM)
        assert node.proc.wait(30) == 0
    finally:
        node.kill9()
    imported = _imported_distributions(log.read_text())
    assert imported, "no import recorded"
    extra = imported - _base_closure() - NOT_NEEDED - {DISTRIBUTION, "doq"}  # "doq": its name before
    assert not extra, f"the server imports distributions outside the base install: {sorted(extra)}"
