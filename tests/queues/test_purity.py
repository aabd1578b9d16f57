"""doq/queues stays pure: no I/O, clock, threads or event loop imports (also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "grpc", "lmdb", "time", "os", "socket", "threading", "datetime", "random",
             "subprocess", "shutil", "pathlib", "io", "select", "signal", "concurrent", "multiprocessing"}


def top_level_imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            names.add("__import__")
    return names


def test_queue_core_imports_no_io() -> None:
    files = sorted((ROOT / "doq" / "queues").rglob("*.py"))
    assert len(files) >= 5
    bad = {f.name: sorted(top_level_imports(f.read_text()) & (FORBIDDEN | {"__import__"})) for f in files}
    assert {f: m for f, m in bad.items() if m} == {}


def test_storage_codecs_used_by_the_core_are_pure_too() -> None:
    for name in ("keys.py", "records.py"):
        src = (ROOT / "doq" / "storage" / name).read_text()
        assert top_level_imports(src) & FORBIDDEN == set(), name


def test_the_check_catches_io() -> None:
    assert top_level_imports("import os\nfrom time import time\ndef f():\n    import lmdb\n") == {
        "os", "time", "lmdb"}
