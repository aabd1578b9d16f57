"""doq/raft is pure: no I/O, clock, threads or asyncio; randomness only via an injected
random.Random instance (never module-level random.* calls)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "asyncio", "grpc", "lmdb", "time", "os", "socket", "threading", "subprocess", "io",
    "pathlib", "select", "signal", "datetime", "shutil", "multiprocessing", "concurrent",
    "secrets", "uuid", "logging", "sys",
}


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN]
            bad += [f"import {a.name}" for a in node.names if a.name.startswith("random.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if root in FORBIDDEN:
                bad.append(node.module)
            if root == "random":
                bad.append(f"from random import {[a.name for a in node.names]}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
            and node.attr != "Random"
        ):
            bad.append(f"random.{node.attr}")
    return bad


def test_raft_package_is_pure() -> None:
    files = sorted((ROOT / "doq" / "raft").rglob("*.py"))
    assert len(files) >= 5
    found = {str(f.relative_to(ROOT)): violations(f) for f in files}
    assert {f: v for f, v in found.items() if v} == {}


def test_checker_flags_io_and_global_randomness(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import os\nimport random\nfrom time import monotonic\n"
        "x = random.random()\nr: random.Random\n"
    )
    assert violations(f) == ["os", "time", "random.random"]
