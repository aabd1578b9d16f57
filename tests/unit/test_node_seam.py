"""The `Node` protocol is the whole seam between the service/backup and a node: `LocalNode`
implements every member, and nothing in doq/service or doq/backup probes a node with
getattr/hasattr (mypy then finds a node that lacks a member)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from doq.node.base import Node
from tests.support.local_node import LocalNode

ROOT = Path(__file__).resolve().parents[2]
USERS = sorted([*(ROOT / "doq" / "service").rglob("*.py"), *(ROOT / "doq" / "backup").rglob("*.py")])


def probes(source: str) -> list[str]:
    """getattr/hasattr calls whose object is a node (a name or attribute called `node`)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr") and n.args:
            target = ast.unparse(n.args[0])
            if target == "node" or target.endswith(".node"):
                found.append(ast.unparse(n))
    return found


@pytest.mark.parametrize("path", USERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_probing_of_the_node(path: Path) -> None:
    assert probes(path.read_text()) == []


def test_the_probe_finder_finds_probes() -> None:
    assert probes("getattr(node, 'x', None)\nhasattr(self.api.node, 'y')\ngetattr(r, 'z')") == [
        "getattr(node, 'x', None)", "hasattr(self.api.node, 'y')"]


def test_local_node_has_every_member_of_the_protocol() -> None:
    members = {m for m in vars(Node) if not m.startswith("_")} | set(Node.__annotations__)
    assert {"propose_alone", "restore_chunk_bytes", "is_ready", "node_id", "cluster_status", "applied_index"} <= members
    missing = [m for m in members if not hasattr(LocalNode, m) and m not in ("state", "node_id")]
    assert missing == []
