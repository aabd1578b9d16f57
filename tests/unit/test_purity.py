"""The pure cores never import I/O, clocks, threads or asyncio (also inside functions), and
use randomness only through an injected `random.Random` (never module-level random.*).

Imports are followed transitively: every doq module a core module imports (recursively,
package `__init__`s included) must itself be pure and must stay inside the core layers
(`doq.raft`, `doq.queues`, `doq.errors`): a core that reaches doq.storage, doq.service,
doq.node or any other outer layer, even through a helper, fails.
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
CORE_LAYERS = ("doq.raft", "doq.queues", "doq.errors")
CORE = [
    *sorted((ROOT / "doq" / "raft").rglob("*.py")),
    *sorted((ROOT / "doq" / "queues").rglob("*.py")),
]


def violations(source: str) -> list[str]:
    """Forbidden imports and global-randomness uses in one module's source."""
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


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str, root: Path) -> Path | None:
    """The source file of module `name` under `root` (None: not a module of the tree)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def doq_imports(path: Path, root: Path) -> set[str]:
    """Every doq module `path` imports (relative imports resolved; `from p import m` counts
    as importing p and, when m is a module, p.m), with their parent packages."""
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names
                         if module_file(f"{base}.{a.name}", root) is not None)
    with_parents = {".".join(n.split(".")[:i]) for n in found for i in range(1, n.count(".") + 2)}
    return {n for n in with_parents if n == "doq" or n.startswith("doq.")}


def transitive_violations(path: Path, root: Path = ROOT) -> list[str]:
    """Violations of `path` and of every doq module it reaches, each with its import chain."""
    bad: list[str] = []
    seen = {module_name(path, root)}
    todo: list[tuple[Path, str]] = [(path, module_name(path, root))]
    while todo:
        file, chain = todo.pop()
        bad += [f"{chain} imports {v}" for v in violations(file.read_text())]
        for name in sorted(doq_imports(file, root) - seen):
            seen.add(name)
            if name != "doq" and not name.startswith(tuple(f"{c}." for c in CORE_LAYERS)) \
                    and name not in CORE_LAYERS:
                bad.append(f"{chain} imports {name} (outside the core layers)")
                continue
            target = module_file(name, root)
            if target is not None:
                todo.append((target, f"{chain} -> {name}"))
    return bad


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_is_pure_transitively(path: Path) -> None:
    assert transitive_violations(path) == []


def test_every_core_package_is_checked() -> None:
    assert sum(1 for p in CORE if "raft" in p.parts) >= 5
    assert sum(1 for p in CORE if "queues" in p.parts) >= 5


def test_the_check_catches_io_and_global_randomness() -> None:
    src = ("import os\nimport random\nfrom time import monotonic\n"
           "def f():\n    import lmdb\n    return random.random()\nr: random.Random\n")
    assert violations(src) == ["os", "time", "lmdb", "random.random"]


def test_the_check_follows_imports_through_helpers_and_relative_imports(tmp_path: Path) -> None:
    files = {
        "doq/__init__.py": "",
        "doq/queues/a.py": "from doq.queues import b\n",
        "doq/queues/b.py": "from . import c\n",
        "doq/queues/c.py": "def f():\n    from doq.storage import keys\n",
        "doq/storage/__init__.py": "",
        "doq/storage/keys.py": "import lmdb\n",
        "doq/queues/d.py": "from doq.errors import E\n",
        "doq/errors.py": "import time\nclass E(Exception): ...\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert transitive_violations(tmp_path / "doq/queues/a.py", tmp_path) == [
        "doq.queues.a -> doq.queues.b -> doq.queues.c imports doq.storage (outside the core layers)",
        "doq.queues.a -> doq.queues.b -> doq.queues.c imports doq.storage.keys (outside the core layers)",
    ]
    assert transitive_violations(tmp_path / "doq/queues/d.py", tmp_path) == [
        "doq.queues.d -> doq.errors imports time",
    ]
