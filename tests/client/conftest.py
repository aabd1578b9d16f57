"""Fixtures for the client tests: one real `doq serve` process per test module.

The client package lives in clients/python; it is put on sys.path (and PYTHONPATH, so the
server child process finds `doq_proto` too) when it is not installed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "python"
if str(CLIENT_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENT_DIR))
if str(CLIENT_DIR) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(CLIENT_DIR), os.environ.get("PYTHONPATH", "")) if p
    )

from doq_client import DoqClient  # noqa: E402
from tests.support.proc import NodeProc, running_node  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test using the real node below is an integration test (tests/support/marker_guard)."""
    for item in items:
        if "node" in getattr(item, "fixturenames", ()) and str(item.path).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A single-node `doq serve` shared by the tests of one module (each uses its own queue)."""
    with running_node(tmp_path_factory.mktemp("doq") / "data") as n:
        yield n


@pytest.fixture
def client(node: NodeProc) -> Iterator[DoqClient]:
    with DoqClient(node.grpc_addr, timeout_s=20) as c:
        yield c


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue(client: DoqClient, queue_name: str) -> str:
    """A fresh delayed queue with a 30 s visibility timeout."""
    client.create_queue(queue_name)
    return queue_name
