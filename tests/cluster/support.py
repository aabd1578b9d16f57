"""An in-test `ClusterAdmin` (the protocol only, for unit-level tests of the HTTP surface
and the join client) and a real uvicorn server for an app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import uvicorn
from fastapi import FastAPI

from doq.errors import FailedPrecondition, NotFound, NotLeader
from doq.node.cluster import ClusterStatus, Member, MemberAddrs, NodeIdentity
from doq.service.http.cluster import build_cluster_router
from doq.service.http.problems import install_handlers
from tests.support.proc import free_port


def addrs(n: int) -> MemberAddrs:
    return MemberAddrs(f"127.0.0.1:{9000 + n}", f"127.0.0.1:{10000 + n}", f"127.0.0.1:{8000 + n}")


class FakeCluster:
    """One node's view of a cluster. Mutations succeed only if `node_id == leader_id`,
    else raise NotLeader(leader_hint=leader_id). `calls` records every mutation that ran."""

    def __init__(self, node_id: str, leader_id: str, members: list[Member], term: int = 3) -> None:
        self.status = ClusterStatus(node_id=node_id, leader_id=leader_id, term=term, commit_index=120,
                                    applied_index=118, role="leader" if node_id == leader_id else "follower",
                                    members=list(members))
        self.calls: list[tuple[str, ...]] = []
        self.join_attempts = 0

    def cluster_status(self) -> ClusterStatus:
        return self.status

    def cluster_admin(self) -> FakeCluster:
        return self

    def _check_leader(self) -> None:
        if self.status.leader_id != self.status.node_id:
            raise NotLeader("not the leader", leader_hint=self.status.leader_id)

    def identity_of_store(self) -> NodeIdentity:
        return NodeIdentity(self.status.node_id, "f" * 32, self.status.cluster_id, empty=False)

    async def add_member(self, node_id: str, a: MemberAddrs, *, empty: bool = False,
                         cluster_id: str = "") -> ClusterStatus:
        self.join_attempts += 1
        self._check_leader()
        for m in self.status.members:
            if m.node_id == node_id:
                if m.addrs != a:
                    raise FailedPrecondition(f"{node_id} is a member with other addresses", reason="MEMBER_EXISTS")
                return self.status
        self.calls.append(("add", node_id))
        self.status = replace(self.status, members=[*self.status.members, Member(node_id, a, "learner")])
        return self.status

    async def remove_member(self, node_id: str) -> None:
        self._check_leader()
        if all(m.node_id != node_id for m in self.status.members):
            raise NotFound(f"no member {node_id!r}", reason="MEMBER_NOT_FOUND")
        self.calls.append(("remove", node_id))
        self.status = replace(self.status, members=[m for m in self.status.members if m.node_id != node_id])

    async def transfer_leader(self, target_id: str | None = None) -> str:
        self._check_leader()
        voters = [m.node_id for m in self.status.members if m.role == "voter" and m.node_id != self.status.node_id]
        target = target_id or (voters[0] if voters else "")
        if target not in voters:
            raise NotFound(f"no voter {target!r}", reason="MEMBER_NOT_FOUND")
        self.calls.append(("transfer", target))
        self.status = replace(self.status, leader_id=target, role="follower")
        return target


def three_members() -> list[Member]:
    return [Member(f"node-{i}", addrs(i), "voter") for i in (1, 2, 3)]


def cluster_app(node: Any) -> FastAPI:
    """A gateway app with only the /cluster routes over `node` (problem+json handlers on)."""
    app = FastAPI()
    install_handlers(app)
    app.router.routes.extend(build_cluster_router(SimpleNamespace(node=node)).routes)  # type: ignore[arg-type]
    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test runner keeps its signal handlers
        yield


@contextlib.asynccontextmanager
async def serving(app: Any, port: int = 0) -> AsyncIterator[str]:
    """Serve the ASGI `app` with uvicorn on 127.0.0.1:`port` (0: a free one) in this loop; yields HOST:PORT."""
    port = port or free_port()

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        # uvicorn calls its app with no arguments to spot a factory; a mutation run's
        # wrapped __call__ (mutmut) accepts that, so uvicorn gets a plain function
        await app(scope, receive, send)

    server = _Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning",
                                    lifespan="off", access_log=False))
    task = asyncio.create_task(server.serve())
    loop = asyncio.get_running_loop()
    end = loop.time() + 20
    while not server.started:
        if task.done() or loop.time() > end:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    import os

    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
