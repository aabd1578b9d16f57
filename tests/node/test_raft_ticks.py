"""RaftNode while its writer is busy longer than the election timeout (a slow fsync, a
purge of 200k messages, a Ready of 4 MB of commands on a loaded machine): no election.

Found on real processes (`doq bench` runs deposed the leader). A busy follower answers
its leader's heartbeats from the loop, and the ticks counted during the write are not
all fed after the heartbeats received meanwhile (the core gets both in arrival order); a
busy leader goes on sending heartbeats from the loop."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.raft.types import Role
from tests.node.raftnet import FAST, Cluster, retry

pytestmark = pytest.mark.timeout(180)
MARK = "slow-marker"


class SlowWrite(RaftNode):
    """The write of the entry naming MARK takes 4x the longest election timeout on the
    nodes whose role is in `slow_roles`."""

    slow_s = 4 * 2 * FAST.election_tick * FAST.tick_ms / 1000
    slow_roles: tuple[Role, ...] = ()

    def _write(self, job):  # type: ignore[no-untyped-def]
        if self._role in self.slow_roles and any(MARK.encode() in e.data for e in job.committed):
            time.sleep(self.slow_s)  # the writer thread: the loop goes on receiving
        super()._write(job)


class SlowFollowerWrite(SlowWrite):
    slow_roles = (Role.FOLLOWER,)


class SlowLeaderWrite(SlowWrite):
    slow_roles = (Role.LEADER,)


@pytest.fixture(params=[SlowFollowerWrite, SlowLeaderWrite])
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    cl = Cluster(tmp_path, FAST, request.param)
    try:
        await cl.start("n1")
        await retry(lambda: cl.nodes["n1"].propose(c.CreateQueue("q", "delayed", QueueSettings())))
        await cl.grow("n2", "n3")
        yield cl
    finally:
        await cl.close()


async def test_a_write_longer_than_the_election_timeout_keeps_the_leader(cluster: Cluster) -> None:
    """Followers or leader busy writing: no election either way."""
    leader = await cluster.wait_leader()
    term = leader.cluster_status().term
    await leader.propose(c.CreateQueue(MARK, "delayed", QueueSettings()))
    await cluster.converged()  # the followers' slow writes are done
    await leader.propose(c.CreateQueue("after", "delayed", QueueSettings()))
    await cluster.converged()
    terms = {nid: n.cluster_status().term for nid, n in cluster.nodes.items()}
    assert terms == dict.fromkeys(cluster.nodes, term), f"an election happened: {terms} (was {term})"
    assert cluster.leader() is leader
