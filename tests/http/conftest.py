"""Fixtures for the HTTP gateway tests.

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

from doq.service.http_gateway import create_app  # noqa: E402
from tests.http.fakes import FakeQueueService  # noqa: E402


@pytest.fixture
def fake() -> FakeQueueService:
    return FakeQueueService()


@pytest.fixture
async def client(fake: FakeQueueService) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the gateway app over the in-memory fake service (no sockets)."""
    transport = httpx.ASGITransport(app=create_app(fake))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://doq.test") as c:
        yield c
