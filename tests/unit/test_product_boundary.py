"""The installed `doq` package is the product: the chaos tester and the simulator live in
`tools/`, the benchmark harnesses and one-off measurements in `bench/`, the test node in
`tests/`; nothing in `doq` imports them (an installed doq would fail), the package list
of the distribution holds none of them, and `doq/bench` holds only the `doq bench`
command."""

from __future__ import annotations

import ast
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = {"tools", "tests", "bench", "backup"}


def test_nothing_in_doq_imports_what_is_not_installed() -> None:
    bad = []
    for path in sorted((ROOT / "doq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in OUTSIDE]
    assert bad == []


def test_the_distribution_holds_the_product_only() -> None:
    packages = find_packages(str(ROOT), include=["doq*", "doq_proto*", "doq_client*"])
    assert "doq" in packages and "doq.service" in packages
    assert not [p for p in packages if p.split(".")[0] in OUTSIDE or p in ("doq.chaos", "doq.sim")]
    assert not (ROOT / "doq" / "node" / "local.py").exists()  # the test node is in tests/support


def test_doq_bench_holds_only_the_command() -> None:
    """`doq bench` (registration, arguments, the gRPC load generator) is all that ships of
    the benchmarks; the harnesses run from the checkout as `python bench/NAME.py`."""
    shipped = sorted(p.name for p in (ROOT / "doq" / "bench").iterdir() if p.suffix == ".py")
    assert shipped == ["__init__.py", "args.py", "cli.py", "grpc_load.py"]
    imported = set()
    for name in shipped:
        tree = ast.parse((ROOT / "doq" / "bench" / name).read_text())
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.startswith("doq.bench")} == {"doq.bench.args", "doq.bench.grpc_load"}


def test_the_harnesses_are_imported_from_bench() -> None:
    """Scripts, tools and tests import a harness as `bench.NAME` (a `doq.bench.NAME` import
    of one would fail: only the command's modules are there)."""
    command = {"doq.bench", "doq.bench.args", "doq.bench.cli", "doq.bench.grpc_load"}
    bad = []
    for path in sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
                        *(ROOT / "tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                         if node.module == "doq.bench"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if n.startswith("doq.bench") and n not in command and n != "doq.bench"]
    assert bad == []
