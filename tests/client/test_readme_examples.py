"""The client README's examples ("Unary calls" and "asyncio"), run twice in a row as
written against a real `doq serve` (only the address changes to the test node's): a user
can paste them and run them again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"


def example(heading: str) -> str:
    """The first ```python block after `## heading`."""
    text = README.read_text()
    section = text[text.index(f"\n## {heading}\n"):]
    found = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert found is not None, heading
    return found.group(1)


@pytest.mark.parametrize("heading", ["Unary calls", "asyncio"])
def test_example_runs_twice(doq_node: NodeProc, heading: str) -> None:
    code = example(heading).replace("127.0.0.1:10000", doq_node.grpc_addr)
    for run in (1, 2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"run {run}:\n{r.stdout}\n{r.stderr}"
        assert r.stdout.strip(), f"run {run} printed nothing"
