"""A member that lost its store (disk) comes back under the same node id: real `RaftNode`s
over real LMDB in one process, the in-memory peer network of `tests.node.raftnet`
(messages can be cut per node). The join path is `RaftNode.add_member`, as
`POST /cluster/join` calls it; the "wipe" stops the node and deletes its directory."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.errors import FailedPrecondition, Unavailable
from doq.node import store_identity
from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import FAST, Cluster, addrs, eventually, retry

_open: list[Cluster] = []


pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    """Stop every node a test started, also when it fails."""
    yield
    while _open:
        await _open.pop().close()


def enq(i: int) -> c.Enqueue:
    return c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)])


async def three(tmp_path: Path) -> Cluster:
    cl = Cluster(tmp_path, FAST, RaftNode)
    _open.append(cl)
    await cl.start("n1")
    await retry(lambda: cl.nodes["n1"].propose(c.CreateQueue("q", "delayed", QueueSettings())))
    await cl.grow("n2", "n3")
    return cl


async def wipe(cl: Cluster, tmp_path: Path, nid: str) -> None:
    await cl.stop(nid, transfer_leadership=False)
    shutil.rmtree(tmp_path / nid)


def voters(node: RaftNode) -> list[str]:
    return [m.node_id for m in node.cluster_status().members if m.role == "voter"]


async def test_a_follower_that_lost_its_store_is_replaced_then_promoted_and_holds_everything(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    for i in range(30):
        await retry(lambda i=i: leader.propose(enq(i)))  # type: ignore[misc]
    await cl.converged()
    victim = next(nid for nid in ("n1", "n2", "n3") if nid != leader.node_id)
    old_store = cl.nodes[victim].identity.store_id
    await wipe(cl, tmp_path, victim)
    node = await cl.start(victim, join=True)
    assert node.identity.voting_gated and node.identity.store_id != old_store
    assert node.core is not None and not node.core.voting_allowed
    new = dataclasses.replace(addrs(victim), store_id=node.identity.store_id)
    st = await retry(lambda: leader.add_member(victim, new, empty=True))
    assert {m.node_id: m.role for m in st.members}[victim] == "learner"  # fresh progress
    await eventually(lambda: asyncio.sleep(0, victim in voters(leader)), 30, "promoted again")
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert node.state.get_queue("q").stats.total == 30
    assert not node.identity.voting_gated and node.core.voting_allowed  # admitted: it votes again
    assert store_identity.load(node.env) == node.identity  # durably
    assert leader.members[victim].store_id == node.identity.store_id
    assert node.is_ready()


async def test_the_same_store_joining_again_changes_nothing(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    follower = next(n for n in cl.nodes.values() if n is not leader)
    same = dataclasses.replace(addrs(follower.node_id), store_id=follower.identity.store_id)
    term = leader.cluster_status().term
    commit = leader.cluster_status().commit_index
    st = await leader.add_member(follower.node_id, same)
    assert voters(leader) == ["n1", "n2", "n3"] and st.term == term
    assert leader.cluster_status().commit_index == commit  # no conf change proposed


async def test_a_join_meant_for_another_cluster_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    assert leader.state.cluster_id
    with pytest.raises(FailedPrecondition) as e:
        await leader.add_member("n4", addrs("n4"), cluster_id="another-cluster")
    assert e.value.reason == "CLUSTER_MISMATCH"
    assert "n4" not in {m.node_id for m in leader.cluster_status().members}


async def test_the_replacement_waits_for_a_quorum_without_the_wiped_voter(tmp_path: Path) -> None:
    """n3 lost its store and n2 is cut off: the removal of n3's old entry needs n2 (n3's
    stale acknowledgements cannot count), so nothing commits — no write is acknowledged on
    the wiped node's word — until n2 is back."""
    cl = await three(tmp_path)
    leader = cl.nodes["n1"]
    await retry(lambda: leader.transfer_leader("n1"))
    await cl.converged()
    await wipe(cl, tmp_path, "n3")
    node = await cl.start("n3", join=True)
    cl.net.isolate("n2")
    commit = leader.cluster_status().commit_index
    new = dataclasses.replace(addrs("n3"), store_id=node.identity.store_id)
    join = asyncio.ensure_future(leader.add_member("n3", new, empty=True))
    write = leader.propose_nowait(enq(1))
    await asyncio.sleep(2.0)  # long enough for any commit to happen: none may
    assert not write.done() and not join.done()
    assert leader.cluster_status().commit_index == commit  # n1 alone + n3's stale progress: nothing
    assert voters(leader) == ["n1", "n2", "n3"] and node.core is not None and not node.core.voting_allowed
    cl.net.heal()
    await write  # committed once n2 is back
    try:
        await join
    except Unavailable:  # the first attempt may have timed out meanwhile: the joiner retries
        await retry(lambda: leader.add_member("n3", new, empty=True))
    await eventually(lambda: asyncio.sleep(0, voters(leader) == ["n1", "n2", "n3"] and node.is_ready()),
                     30, "n3 promoted again")
    await retry(lambda: leader.propose(enq(2)))
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert node.state.get_queue("q").stats.total == 2


async def test_a_store_of_one_cluster_refuses_to_start_as_a_member_of_another(tmp_path: Path) -> None:
    from doq.node.build import ClusterMismatch, open_raft_node
    from doq.storage.env import open_env
    from doq.storage.state import StateStore

    cl = await three(tmp_path)
    node = cl.nodes["n2"]
    cluster_id = node.state.cluster_id
    await cl.stop("n2")
    env = open_env(tmp_path / "n2", map_size=1 << 30)
    try:
        with pytest.raises(ClusterMismatch):
            await open_raft_node(StateStore(env), node_id="n2", addrs=addrs("n2"), transport=cl.net.factory("n2"),
                                 join_addrs=("http-n1:3",), cluster_id="another-cluster")
        same = await open_raft_node(StateStore(env), node_id="n2", addrs=addrs("n2"), transport=cl.net.factory("n2"),
                                    join_addrs=("http-n1:3",), cluster_id=cluster_id)
        assert same.node_id == "n2"  # its own cluster: it restarts from its data (no join)
    finally:
        env.close()
