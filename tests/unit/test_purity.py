"""The pure cores (doq/raft, doq/queues) never import I/O, clocks or asyncio."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "grpc", "lmdb", "time", "os", "socket", "threading", "fastapi", "uvicorn",
             "datetime", "subprocess", "shutil", "pathlib", "io", "select", "signal"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ["doq/raft", "doq/queues"])
def test_core_is_pure(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package} has no modules"
    bad = {str(f.relative_to(ROOT)): sorted(imported_modules(f) & FORBIDDEN) for f in files}
    assert not {f: m for f, m in bad.items() if m}


def test_the_check_catches_an_impure_module(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom time import monotonic\nimport random\n")
    assert imported_modules(f) & FORBIDDEN == {"os", "time"}
