"""Leader changes as a client sees them, without Raft: real gRPC servers on 127.0.0.1 over
the real service and a real LMDB, whose nodes answer as followers and deposed leaders do.

- `Follower`: a caught-up follower (it reads the leader's committed state) that refuses
  every proposal with `NotLeader` naming the leader, whose gRPC address it lists in its
  `cluster_status()` (as a Raft member knows its peers' addresses).
- `DeposedAfterCommit`: a `LocalNode` that commits chosen commands and then answers
  `OutcomeUnknown` for them, as a Raft leader deposed before it learned that its entry
  committed: the client cannot know the command was applied.

The servers run on an event loop in a background thread (`LoopThread`), so tests drive
them with the synchronous client as well as with the asyncio one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from doq.errors import NotLeader, OutcomeUnknown
from doq.node.cluster import ClusterAdmin, ClusterStatus, Member, MemberAddrs
from doq.queues.commands import Command
from doq.service.api import QueueService
from doq.service.grpc_server import build_server
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.support.local_node import LocalNode
from tests.support.proc import free_port

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-servers", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Follower:
    """A follower over the leader's committed state; every proposal is refused."""

    def __init__(self, leader: LocalNode, node_id: str, addrs: MemberAddrs) -> None:
        self.state = leader.state
        self.leader = leader
        self.addrs = addrs
        self._node_id = node_id

    def _refuse(self) -> NotLeader:
        return NotLeader("not the leader", leader_hint=self.leader.node_id)

    @property
    def node_id(self) -> str:
        return self._node_id

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def propose(self, command: Command) -> object:
        raise self._refuse()

    def propose_nowait(self, command: Command) -> asyncio.Future[object]:
        raise self._refuse()

    async def read_barrier(self) -> None:
        return None

    def add_apply_listener(self, callback: Callable[[], None]) -> None:
        self.leader.add_apply_listener(callback)

    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_hint(self) -> str:
        return self.leader.node_id

    def is_ready(self) -> bool:
        return True

    def readiness_problems(self) -> list[str]:
        return []

    def liveness_problems(self) -> list[str]:
        return []

    def alarms(self) -> list[Any]:
        return []

    def storage_usage(self) -> None:
        return None

    @property
    def applied_index(self) -> int:
        return self.leader.applied_index

    def cluster_status(self) -> ClusterStatus:
        index = self.leader.applied_index
        return ClusterStatus(
            node_id=self._node_id, leader_id=self.leader.node_id, term=1, commit_index=index,
            applied_index=index, role="follower",
            members=[Member(self.leader.node_id, self.leader.addrs, "voter"),
                     Member(self._node_id, self.addrs, "voter")],
        )

    def cluster_admin(self) -> ClusterAdmin | None:
        return None

    def propose_alone(self, command: Command) -> asyncio.Future[object]:
        raise self._refuse()

    @property
    def restore_chunk_bytes(self) -> int:
        return self.leader.restore_chunk_bytes


class DeposedAfterCommit(LocalNode):
    """Commits every command, but answers `OutcomeUnknown` (naming itself) for the next
    `refusals[type]` commands of each type after their commit."""

    refusals: dict[type[Command], int]

    def propose_nowait(self, command: Command) -> asyncio.Future[object]:
        fut = super().propose_nowait(command)
        left = self.refusals.get(type(command), 0)
        if not left:
            return fut
        self.refusals[type(command)] = left - 1
        out: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def deposed(f: asyncio.Future[object]) -> None:
            if f.cancelled():
                out.cancel()
            elif not out.done():
                out.set_exception(OutcomeUnknown("leadership changed before the proposal committed; "
                                                 "it may still be applied", leader_hint=self.node_id))

        fut.add_done_callback(deposed)
        return out


@dataclass
class Servers:
    """The nodes and gRPC addresses of a fake cluster, with the loop they run on."""

    loop: LoopThread
    leader: DeposedAfterCommit
    api: QueueService  # the leader's
    leader_addr: str
    follower_addr: str

    def api_call(self, fn: Callable[[QueueService], Coroutine[Any, Any, T]]) -> T:
        """Run `fn(the leader's QueueService)` on the servers' loop."""
        return self.loop.run(fn(self.api))


@contextlib.contextmanager
def serving(path: Path, *, deposed: dict[type[Command], int] | None = None) -> Iterator[Servers]:
    """A leader (`DeposedAfterCommit` with `deposed` refusals, none by default) and a
    `Follower` pointing at it, each with its gRPC server on 127.0.0.1."""
    loop = LoopThread()
    leader_addr, follower_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = open_env(path / "doq.lmdb")
    servers: list[grpc.aio.Server] = []

    async def start() -> tuple[DeposedAfterCommit, QueueService]:
        leader = DeposedAfterCommit(StateStore(env), node_id="node-1",
                                    addrs=MemberAddrs("", leader_addr, ""))
        leader.refusals = dict(deposed or {})
        await leader.start()
        follower = Follower(leader, "node-2", MemberAddrs("", follower_addr, ""))
        apis = [QueueService(leader), QueueService(follower)]
        for api, addr in zip(apis, (leader_addr, follower_addr), strict=True):
            server, _ = build_server(api, addr)
            await server.start()
            servers.append(server)
        return leader, apis[0]

    async def stop(leader: LocalNode) -> None:
        for s in servers:
            await s.stop(None)
        await leader.stop()

    leader, api = loop.run(start())
    try:
        yield Servers(loop, leader, api, leader_addr, follower_addr)
    finally:
        loop.run(stop(leader))
        loop.stop()
        env.close()
