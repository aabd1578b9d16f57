"""What `/livez` and `/readyz` report comes from `RaftNode.liveness_problems()` and
`readiness_problems()`: real `RaftNode`s over real LMDB, the in-memory peer network of
`tests.node.raftnet` (cut per node); the HTTP routes over a real node through the ASGI app."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.service.api import QueueService
from doq.service.http_gateway import create_app
from doq.service.limits import Limits
from tests.node.raftnet import FAST, Cluster, HoldsCommitAfterAnswer, eventually, retry

pytestmark = pytest.mark.timeout(120)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def three(tmp_path: Path) -> Cluster:
    cl = Cluster(tmp_path, FAST, RaftNode)
    _open.append(cl)
    await cl.start("n1")
    await retry(lambda: cl.nodes["n1"].propose(c.CreateQueue("q", "delayed", QueueSettings())))
    await cl.grow("n2", "n3")
    await cl.converged()
    return cl


def _http(node: RaftNode) -> httpx.AsyncClient:
    app = create_app(QueueService(node, Limits()))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")


async def test_a_failed_raft_loop_fails_livez_and_readyz_with_the_reason(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    follower = next(n for n in cl.nodes.values() if not n.is_leader)
    async with _http(follower) as client:
        assert (await client.get("/livez")).json() == {"status": "ok", "reasons": []}
        assert (await client.get("/readyz")).json()["reasons"] == []

        def broken_ready() -> object:
            raise RuntimeError("injected: the loop fails")

        follower.core.ready = broken_ready  # type: ignore[method-assign,union-attr]
        await eventually(lambda: asyncio.sleep(0, follower.liveness_problems() == ["raft_failed"]), 30,
                         "the loop failed")
        r = await client.get("/livez")
        assert r.status_code == 503 and r.json() == {"status": "failed", "reasons": ["raft_failed"]}
        r = await client.get("/readyz")
        assert r.status_code == 503 and "raft_failed" in r.json()["reasons"]


async def test_a_store_not_admitted_is_not_ready_because_it_is_no_member(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    stranger = await cl.start("n9", join=True)  # started to join; nobody added it
    assert "not_a_member" in stranger.readiness_problems()
    assert stranger.liveness_problems() == []  # waiting is not failing


async def test_a_follower_cut_from_its_leader_stops_being_ready(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    follower = next(n for n in cl.nodes.values() if n is not leader)
    assert follower.readiness_problems() == []
    cl.net.isolate(follower.node_id)
    problems = await eventually(
        lambda: asyncio.sleep(0, follower.readiness_problems()), 30, "not ready once cut off")
    assert set(problems) & {"leader_unreachable", "no_leader"}
    assert follower.liveness_problems() == []  # it can make progress once the network heals
    cl.net.heal()
    await eventually(lambda: asyncio.sleep(0, follower.is_ready()), 30, "ready again")


async def test_a_write_in_flight_is_not_applying_but_a_commit_held_past_an_election_timeout_is(
        tmp_path: Path) -> None:
    """A busy leader always has entries committed and not yet applied (its write in
    flight): it stays ready while its applied index reaches the commit index it knew an
    election timeout ago, and says "applying" only once a write is held longer than that.
    Fails if readiness compares with the current commit index (the old rule flapped)."""
    slow_ticks = dataclasses.replace(FAST, election_tick=200)  # an election timeout of 5 s
    cl = Cluster(tmp_path, slow_ticks, HoldsCommitAfterAnswer)
    _open.append(cl)
    node = await cl.start("n1")  # a lone voter: it leads at once, answers before its commit
    assert isinstance(node, HoldsCommitAfterAnswer)
    await retry(lambda: node.propose(c.CreateQueue("q", "delayed", QueueSettings())))
    # ready, and a tick has marked the commit index (before the first, readiness compares
    # with the current one: a fast start may not have seen a tick yet)
    await eventually(lambda: asyncio.sleep(0, node.is_ready() and bool(node._commit_marks)), 30, "ready")
    node.hold = True
    await node.propose(c.Enqueue("q", [c.EnqueueItem(b"m")]))  # answered; its commit held
    assert node.core is not None and node.applied_index < node.core.log.committed  # in flight
    # ready: the write is in flight for less than an election timeout (unless this process
    # was starved of a CPU for that long since the commit: then the oldest mark holds it)
    assert node.readiness_problems() == [] or node._commit_marks[0] >= node.core.log.committed
    problems = await eventually(
        lambda: asyncio.sleep(0, node.readiness_problems() or None), 60, "applying once held")
    assert problems == ["applying"]
    node.hold = False
    node.release.set()
    await eventually(lambda: asyncio.sleep(0, node.is_ready()), 60, "ready once the commit is done")
