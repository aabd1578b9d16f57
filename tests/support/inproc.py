"""An in-process doq service for tests: the real service over a temporary LMDB, served by
a grpc.aio server on 127.0.0.1 in the test's own event loop."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import lmdb

from doq.node.local import LocalNode
from doq.service import grpc_server
from doq.service.api import QueueService
from doq.storage.env import open_env
from doq.storage.state import StateStore
from doq_client.v1 import doq_pb2_grpc as pb_grpc


@dataclass
class Served:
    api: QueueService
    env: lmdb.Environment
    stub: pb_grpc.DOQStub


@asynccontextmanager
async def served(path: Path) -> AsyncIterator[Served]:
    """Start node, service and gRPC server (a free port); stop them all on exit."""
    env = open_env(path / "doq.lmdb", map_size=1 << 30)
    node = LocalNode(env, StateStore(env))
    await node.start()
    api = QueueService(node)
    server, port = grpc_server.build_server(api, "127.0.0.1:0", max_message_bytes=1 << 20)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(api, env, pb_grpc.DOQStub(channel))
    finally:
        await channel.close()
        await server.stop(None)
        await node.stop()
        env.close()


@contextmanager
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
