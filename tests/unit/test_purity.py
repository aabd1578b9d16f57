"""The pure cores never import I/O, clocks, threads or asyncio (also inside functions), and
use randomness only through an injected `random.Random` (never module-level random.*).

Covers doq/raft, doq/queues and the storage codecs the queue core imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "asyncio", "grpc", "lmdb", "time", "os", "socket", "threading", "subprocess", "io",
    "pathlib", "select", "signal", "datetime", "shutil", "multiprocessing", "concurrent",
    "secrets", "uuid", "logging", "sys", "fastapi", "uvicorn",
}
PURE = [
    *sorted((ROOT / "doq" / "raft").rglob("*.py")),
    *sorted((ROOT / "doq" / "queues").rglob("*.py")),
    ROOT / "doq" / "storage" / "keys.py",
    ROOT / "doq" / "storage" / "records.py",
]


def violations(source: str) -> list[str]:
    bad: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in FORBIDDEN:
                bad.append(node.module)
            if node.module.split(".")[0] == "random":
                bad.append(f"from random import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            bad.append("__import__")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "random" and node.attr != "Random"):
            bad.append(f"random.{node.attr}")
    return bad


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_is_pure(path: Path) -> None:
    assert violations(path.read_text()) == []


def test_every_core_package_is_checked() -> None:
    assert sum(1 for p in PURE if "raft" in p.parts) >= 5
    assert sum(1 for p in PURE if "queues" in p.parts) >= 5


def test_the_check_catches_io_and_global_randomness() -> None:
    src = ("import os\nimport random\nfrom time import monotonic\n"
           "def f():\n    import lmdb\n    return random.random()\nr: random.Random\n")
    assert violations(src) == ["os", "time", "lmdb", "random.random"]
