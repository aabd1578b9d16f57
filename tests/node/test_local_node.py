"""`LocalNode` on real LMDB files: cancelled proposals are dropped, a failed commit fails
only its own entry (the node goes on), and the node answers as a one-member cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.errors import Unavailable
from doq.node.cluster import MemberAddrs
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.service.api import QueueService
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.support.local_node import LocalNode


async def _started(path: Path, *, map_size: int = 64 * 1024**2, **kw: object) -> LocalNode:
    node = LocalNode(StateStore(open_env(path, map_size=map_size)), **kw)  # type: ignore[arg-type]
    await node.start()
    return node


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[LocalNode]:
    n = await _started(tmp_path / "db")
    yield n
    await n.stop()


async def test_a_proposal_cancelled_before_it_is_taken_is_never_applied(node: LocalNode) -> None:
    api = QueueService(node)
    await api.create_queue("jobs")
    await api.enqueue("jobs", c.EnqueueItem(b"precious"))
    applied = node.applied_index
    fut = node.propose_nowait(c.Dequeue("jobs", 1, True, 0))
    fut.cancel()  # e.g. the gRPC call was cancelled; the batcher has not run yet
    await api.create_queue("barrier")  # the next entry
    assert node.applied_index == applied + 1  # the cancelled dequeue made no entry
    assert [m.content for m in await api.dequeue("jobs", ack=True)] == [b"precious"]


async def test_a_failed_commit_fails_only_its_entry_and_the_node_goes_on(tmp_path: Path) -> None:
    node = await _started(tmp_path / "db", map_size=4 * 1024**2)  # a small disk: LMDB MapFullError
    try:
        api = QueueService(node)
        await api.create_queue("jobs")
        await api.enqueue("jobs", c.EnqueueItem(b"small"))
        before, applied = node.state.dump_state_bytes(), node.applied_index
        big = [("jobs", c.EnqueueItem(bytes([i]) * 1_000_000)) for i in range(8)]
        answers = await api.enqueue_many(big)
        assert all(isinstance(a, Unavailable) and a.reason == "COMMIT_FAILED" and a.retryable for a in answers)
        assert node.state.dump_state_bytes() == before and node.applied_index == applied
        assert (await api.get_queue("jobs")).stats.ready == 1
        # later writes work, with the next index
        assert (await api.enqueue("jobs", c.EnqueueItem(b"after"))).id == 2
        assert node.applied_index == applied + 1 and node.is_leader
        got = await api.dequeue("jobs", max_messages=10, ack=True)
        assert [m.content for m in got] == [b"small", b"after"]
    finally:
        await node.stop()


async def test_cluster_status_is_a_one_member_cluster(tmp_path: Path) -> None:
    addrs = MemberAddrs("127.0.0.1:9001", "127.0.0.1:10001", "127.0.0.1:8001")
    node = await _started(tmp_path / "db", node_id="n7", addrs=addrs)
    try:
        await node.propose(c.CreateQueue("q", "delayed", QueueSettings()))
        st = node.cluster_status()
        assert (st.node_id, st.leader_id, st.role, st.applied_index) == ("n7", "n7", "leader", 1)
        assert [(m.node_id, m.addrs, m.role) for m in st.members] == [("n7", addrs, "voter")]
        assert node.is_ready() and node.leader_hint == "n7"
        assert node.cluster_admin() is None  # a lone node cannot change membership
    finally:
        await node.stop()
    assert not node.is_ready() and node.cluster_status().leader_id == ""
    with pytest.raises(Unavailable):
        node.propose_nowait(c.Tick())


async def test_apply_listeners_run_after_each_applied_batch(node: LocalNode) -> None:
    seen: list[int] = []
    node.add_apply_listener(lambda: seen.append(node.state.view.applied_index))
    await asyncio.gather(*(node.propose(c.CreateQueue(f"q{i}", "delayed", QueueSettings())) for i in range(3)))
    await node.propose(c.Tick())
    assert seen and seen[-1] == node.applied_index  # the view readers see is the applied one
