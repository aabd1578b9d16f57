"""`QueueService.get_message` hops to a worker thread only when it has a commit to wait for
(`StateStore.get_message_now`): with every answered apply committed it reads on the loop;
right after an answer whose write is held (the batched commit) it reads off the loop and
sees the message. Real LMDB, real threads, the in-memory network (tests/node/raftnet.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.service import api as service_api
from doq.service.api import QueueService
from tests.node.heldnet import one_node
from tests.node.raftnet import Cluster

pytestmark = pytest.mark.timeout(180)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def _one(root: Path) -> RaftNode:
    return (await one_node(root, _open))[1]


def _count_hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions the service hands to a worker thread."""
    hops: list[str] = []
    real = asyncio.to_thread

    async def to_thread(fn: Callable[..., Any], /, *args: Any) -> Any:
        hops.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(service_api.asyncio, "to_thread", to_thread)
    return hops


async def test_get_message_reads_on_the_loop_when_nothing_answered_waits_for_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answered apply committed: the read is done on the loop (no worker thread).
    Fails if every read hops."""
    n1 = await _one(tmp_path)
    out = await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"m0")]))
    await n1.inspect(lambda s: s.commit_held())
    assert n1.state.committed_index >= n1.applied_index
    hops = _count_hops(monkeypatch)
    view = await QueueService(n1).get_message("q", out[0].id)  # type: ignore[index]
    assert view.content == b"m0"
    assert hops == []


async def test_get_message_right_after_an_answer_whose_write_is_held_reads_off_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer whose write is held (not committed): the read hops to a worker thread,
    which has the held write committed, and finds the message. Fails if the fast path
    read LMDB before that commit (MessageNotFound) or took the loop for the wait."""
    n1 = await _one(tmp_path)
    out = await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"m1")]))
    assert await n1.inspect(lambda s: s.held)
    assert n1.state.get_message_now("q", out[0].id) is None  # type: ignore[index]
    hops = _count_hops(monkeypatch)
    view = await QueueService(n1).get_message("q", out[0].id)  # type: ignore[index]
    assert view.content == b"m1"
    assert hops == ["get_message"]
