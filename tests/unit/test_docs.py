"""The user documentation is the repository's own and stays true to the code: no pointer
outside the repository, every relative link resolves, and docs/reference.md names every
`doq serve` flag with its default, every RPC, every status of the error table, and only
reasons the code raises."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from doq.config import ServeConfig
from doq.errors import STATUS_TABLE

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", ROOT / "clients/python/README.md", ROOT / "pulumi/README.md",
             *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "bench").rglob("*.md"))]
OUTSIDE = re.compile(r"\.\./shared|/work/|\b(CONTRACT|ARCHITECTURE|STYLE|PERFORMANCE)\.md\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REFERENCE = ROOT / "docs" / "reference.md"


def test_user_docs_point_nowhere_outside_the_repository() -> None:
    for doc in USER_DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), start=1):
            assert not OUTSIDE.search(line), f"{doc.relative_to(ROOT)}:{n}: {line}"


def test_relative_links_resolve_inside_the_repository() -> None:
    for doc in USER_DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.exists() and ROOT in path.parents, f"{doc.relative_to(ROOT)}: {target}"


def _rows(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("| ")]


def test_reference_names_every_serve_flag_with_its_environment_and_default() -> None:
    rows = _rows(REFERENCE.read_text())
    for f in fields(ServeConfig):
        default = getattr(ServeConfig(), f.name)
        shown = "off" if isinstance(default, bool) else "none" if default in ((), "") else f"`{default}`"
        flag = f"`--{f.name.replace('_', '-')}`"
        assert any(r.startswith(f"| {flag} | `DOQ_{f.name.upper()}` | {shown} |") for r in rows), flag


def test_reference_names_every_rpc() -> None:
    proto = (ROOT / "proto/doq/v1/doq.proto").read_text()
    text = REFERENCE.read_text()
    for rpc in re.findall(r"^\s*rpc (\w+)\(", proto, re.M):
        assert f"`{rpc}`" in text, rpc


def test_reference_error_table_matches_the_code() -> None:
    text = REFERENCE.read_text()
    table = _rows(text[text.index("## Errors"):])
    for row in STATUS_TABLE.values():
        assert any(r.startswith(f"| `{row.grpc_code}` | {row.http_status} |") for r in table), row
    code = "\n".join(p.read_text() for p in (ROOT / "doq").rglob("*.py"))
    for reason in re.findall(r"`([A-Z][A-Z_]+)`", "\n".join(table[2:])):
        if reason not in {r.grpc_code for r in STATUS_TABLE.values()}:
            assert f'"{reason}"' in code, f"{reason} is named in docs/reference.md but never raised"
