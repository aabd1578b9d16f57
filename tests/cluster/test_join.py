"""join_cluster against real HTTP servers on 127.0.0.1: follows the leader's address from
a 503, skips unreachable addresses, retries while no leader is known, stops at once on
a refusal, and gives up after its deadline."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from doq.cluster_client import ClusterError, join_cluster
from doq.node.cluster import ClusterStatus, Member, MemberAddrs
from tests.cluster.support import FakeCluster, addrs, cluster_app, serving, three_members
from tests.support.proc import free_port

ME = MemberAddrs("127.0.0.1:9004", "127.0.0.1:10004", "127.0.0.1:8004")


async def join(*join_addrs: str, timeout_s: float = 20.0, node_id: str = "node-4",
               a: MemberAddrs = ME) -> ClusterStatus:
    return await asyncio.to_thread(join_cluster, list(join_addrs), node_id, a, timeout_s=timeout_s,
                                   backoff_initial_s=0.02, backoff_max_s=0.1, rng=random.Random(1))


def with_http(members: list[Member], http: dict[str, str]) -> list[Member]:
    return [Member(m.node_id, MemberAddrs(m.addrs.raft_addr, m.addrs.grpc_addr, http[m.node_id]), m.role)
            for m in members]


async def test_join_through_a_follower_follows_the_leader() -> None:
    port1, port2 = free_port(), free_port()
    http = {"node-1": f"127.0.0.1:{port1}", "node-2": f"127.0.0.1:{port2}", "node-3": addrs(3).http_addr}
    members = with_http(three_members(), http)
    leader = FakeCluster("node-1", "node-1", members)
    follower = FakeCluster("node-2", "node-1", members)
    async with serving(cluster_app(leader), port1), serving(cluster_app(follower), port2):
        dead = f"127.0.0.1:{free_port()}"
        status = await join(dead, http["node-2"])
    assert leader.calls == [("add", "node-4")] and follower.calls == []
    assert status.leader_id == "node-1"
    assert [m.node_id for m in status.members] == ["node-1", "node-2", "node-3", "node-4"]


async def test_join_retries_until_a_leader_is_known() -> None:
    port1 = free_port()
    members = with_http(three_members(), {"node-1": f"127.0.0.1:{port1}", "node-2": "x:1", "node-3": "y:1"})
    node = FakeCluster("node-1", "", members)  # an election is going on: no leader, no hint
    async with serving(cluster_app(node), port1):
        task = asyncio.create_task(join(f"127.0.0.1:{port1}"))
        await asyncio.sleep(0.3)
        assert not task.done() and node.calls == []
        node.status = replace(node.status, leader_id="node-1", role="leader")  # elected
        status = await task
    assert node.calls == [("add", "node-4")]
    assert status.members[-1].role == "learner"


async def test_join_stops_at_a_refusal() -> None:
    port1 = free_port()
    members = with_http(three_members(), {"node-1": f"127.0.0.1:{port1}", "node-2": "x:1", "node-3": "y:1"})
    leader = FakeCluster("node-1", "node-1", members)
    async with serving(cluster_app(leader), port1):
        with pytest.raises(ClusterError) as e:
            await join(f"127.0.0.1:{port1}", node_id="node-3", timeout_s=60)  # node-3 exists with other addresses
    assert e.value.status == 409 and e.value.reason == "MEMBER_EXISTS"
    assert leader.join_attempts == 1 and leader.calls == []  # not retried


async def test_join_gives_up_after_its_deadline() -> None:
    with pytest.raises(ClusterError) as e:
        await join(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", timeout_s=0.5)
    assert e.value.status == 0 and "could not join the cluster in 0.5s" in str(e.value)


def test_join_needs_an_address() -> None:
    with pytest.raises(ValueError):
        join_cluster([], "node-4", ME)


async def test_a_joiner_that_means_one_cluster_refuses_an_answer_from_another() -> None:
    port1 = free_port()
    members = with_http(three_members(), {"node-1": f"127.0.0.1:{port1}", "node-2": "x:1", "node-3": "y:1"})
    node = FakeCluster("node-1", "node-1", members)
    node.status = replace(node.status, cluster_id="the-other-cluster")
    async with serving(cluster_app(node), port1):
        with pytest.raises(ClusterError) as e:
            await asyncio.to_thread(join_cluster, [f"127.0.0.1:{port1}"], "node-4", ME, timeout_s=5,
                                    cluster_id="my-cluster")
    assert (e.value.status, e.value.reason) == (409, "CLUSTER_MISMATCH")
    assert not e.value.retryable
