"""Fixtures for the HTTP gateway tests: the gateway app over the real service (a started
`LocalNode` over LMDB in the test's temp dir), reached in process through httpx.

The client package (clients/python, also home of the generated `doq_proto` package the
server imports) is put on sys.path and PYTHONPATH when it is not installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "python"
if str(CLIENT_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENT_DIR))
if str(CLIENT_DIR) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CLIENT_DIR), os.environ.get("PYTHONPATH", "")) if p)

import httpx  # noqa: E402

from doq.service.api import QueueService  # noqa: E402
from tests.support.inproc import http_client, local_service  # noqa: E402


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[QueueService]:
    async with local_service(tmp_path) as s:
        yield s


@pytest.fixture
async def client(service: QueueService) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the gateway app over `service` (no sockets)."""
    async with http_client(service) as c:
        yield c
