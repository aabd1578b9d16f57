from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.proc import NodeProc, running_node


@pytest.fixture
def doq_node(tmp_path: Path) -> Iterator[NodeProc]:
    """A fresh single-node `doq serve` process on free 127.0.0.1 ports."""
    with running_node(tmp_path / "data") as node:
        yield node
