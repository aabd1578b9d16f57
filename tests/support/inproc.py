"""The real service in the test's own event loop: `QueueService` over a `LocalNode` over
LMDB in a temp dir (fsync and all), reached through the real HTTP app (httpx over ASGI, no
socket) or the real gRPC server on 127.0.0.1. Fast enough for unit tests of the adapters.
"""

from __future__ import annotations

import contextlib
import struct
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
import httpx
import lmdb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.service import metrics
from doq.service.api import QueueService
from doq.service.grpc_server import build_server
from doq.service.http_gateway import create_app
from doq.service.limits import Limits
from doq.storage.env import open_env
from doq.storage.state import DUMP_MAGIC, StateStore
from tests.support.local_node import LocalNode

_DUMP_REC = struct.Struct(">BII")
_META_TAG = 1  # the machine meta record: every applied command stamps replicated time


@contextlib.asynccontextmanager
async def local_service(path: Path, limits: Limits | None = None) -> AsyncIterator[QueueService]:
    """A started node and its facade, built as `doq serve` builds them; stopped on exit."""
    env = open_env(path / "doq.lmdb")
    node = LocalNode(StateStore(env), on_applied=metrics.observe_applied,
                     on_commit=metrics.observe_commit)
    await node.start()
    try:
        yield QueueService(node, limits)
    finally:
        await node.stop()
        env.close()


def user_records(service: QueueService) -> list[tuple[int, bytes, bytes]]:
    """Every stored queue, message, dedup and tombstone record (with its version).

    Equal before and after a request = the request changed nothing a user can observe.
    The meta record (replicated clock and id counters' home) is left out.
    """
    dump = service.node.state.dump_state_bytes()
    out: list[tuple[int, bytes, bytes]] = []
    pos = len(DUMP_MAGIC)
    while pos < len(dump):
        tag, kl, vl = _DUMP_REC.unpack_from(dump, pos)
        pos += _DUMP_REC.size
        if tag != _META_TAG:
            out.append((tag, dump[pos : pos + kl], dump[pos + kl : pos + kl + vl]))
        pos += kl + vl
    return out


def openapi_document() -> dict[str, object]:
    """The OpenAPI document of the gateway, built in process over the node `doq serve`
    runs (a RaftNode, unstarted: it has the `/cluster` routes)."""
    from doq.node.cluster import MemberAddrs
    from doq.node.raft_node import RaftNode
    from doq.node.transport import TcpRaftTransport

    with tempfile.TemporaryDirectory() as tmp:
        env = open_env(Path(tmp) / "doq.lmdb")
        try:
            node = RaftNode(StateStore(env), node_id="node-1", addrs=MemberAddrs("", "", ""),
                            transport=lambda cb: TcpRaftTransport("node-1", "127.0.0.1:0", cb))
            return create_app(QueueService(node)).openapi()
        finally:
            env.close()


@contextlib.asynccontextmanager
async def http_client(service: QueueService, *, raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the gateway app of `service` (in process, no socket)."""
    transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=raise_app_exceptions)
    async with httpx.AsyncClient(transport=transport, base_url="http://doq.test") as client:
        yield client


@contextlib.asynccontextmanager
async def grpc_stub(service: QueueService) -> AsyncIterator[pb_grpc.DOQStub]:
    """An asyncio stub on the gRPC server of `service`, listening on 127.0.0.1 (free port)."""
    server, port = build_server(service, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.DOQStub(channel)
    finally:
        await server.stop(None)


@dataclass
class Served:
    """A started service, its LMDB environment and a gRPC stub on its server."""

    api: QueueService
    env: lmdb.Environment
    stub: pb_grpc.DOQStub


@contextlib.asynccontextmanager
async def served(path: Path) -> AsyncIterator[Served]:
    """`local_service` and `grpc_stub` together; everything stopped on exit."""
    async with local_service(path) as api, grpc_stub(api) as stub:
        yield Served(api, cast(LocalNode, api.node).state.env, stub)


@contextlib.contextmanager
def stalled_commits(env: lmdb.Environment) -> Iterator[None]:
    """Hold LMDB's write lock in another thread: every commit waits until the block ends
    (as behind a stuck disk); the event loop keeps running."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with env.begin(write=True):
            held.set()
            release.wait()

    t = threading.Thread(target=hold, name="test-hold-writer")
    t.start()
    held.wait()
    try:
        yield
    finally:
        release.set()
        t.join()
