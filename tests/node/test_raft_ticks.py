"""RaftNode's clock: ticks and messages reach the core in the order they happened.

A follower whose writer is busy longer than the election timeout (a slow fsync, a purge of
200k messages) still receives the leader's heartbeats on its loop meanwhile; the ticks
counted during the write must not all be fed after those heartbeats, or the follower
believes it has not heard from the leader for the whole write and starts an election
(found on real processes: every `doq bench` run's purge deposed the leader)."""

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


class SlowFollowerWrite(RaftNode):
    """A follower's write of the entry naming MARK takes 4x the longest election timeout."""

    slow_s = 4 * 2 * FAST.election_tick * FAST.tick_ms / 1000

    def _write(self, job):  # type: ignore[no-untyped-def]
        if self._role != Role.LEADER and any(MARK.encode() in e.data for e in job.committed):
            time.sleep(self.slow_s)  # the writer thread: the loop goes on receiving
        super()._write(job)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cl = Cluster(tmp_path, FAST, SlowFollowerWrite)
    try:
        await cl.start("n1")
        await retry(lambda: cl.nodes["n1"].propose(c.CreateQueue("q", "delayed", QueueSettings())))
        await cl.grow("n2", "n3")
        yield cl
    finally:
        await cl.close()


async def test_followers_busy_writing_past_the_election_timeout_keep_their_leader(cluster: Cluster) -> None:
    leader = await cluster.wait_leader()
    term = leader.cluster_status().term
    await leader.propose(c.CreateQueue(MARK, "delayed", QueueSettings()))
    await cluster.converged()  # the followers' slow writes are done
    await leader.propose(c.CreateQueue("after", "delayed", QueueSettings()))
    await cluster.converged()
    terms = {nid: n.cluster_status().term for nid, n in cluster.nodes.items()}
    assert terms == dict.fromkeys(cluster.nodes, term), f"an election happened: {terms} (was {term})"
    assert cluster.leader() is leader
