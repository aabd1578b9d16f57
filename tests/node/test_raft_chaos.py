"""A short randomized run of three RaftNodes under a nemesis (leader isolation, restarts,
message loss) with a producer: nothing acknowledged is lost, nothing is applied twice,
replicas end byte-identical, and nothing was ever sent before it was durable."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from doq.errors import DoqError, OutcomeUnknown
from doq.node.raft_node import RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import Cluster, retry

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("seed", [1, 2])
async def test_acknowledged_enqueues_survive_a_nemesis(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    cfg = RaftNodeConfig(tick_ms=20, election_tick=10, snapshot_every=40, keep_entries=10)
    cl = Cluster(tmp_path, cfg)
    cl.net.rng = random.Random(seed)
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        await cl.grow("n2", "n3")
        acked: dict[bytes, int] = {}
        stop = asyncio.Event()

        async def producer(pid: int) -> None:
            k = 0
            while not stop.is_set():
                leader = cl.leader()
                if leader is None:
                    await asyncio.sleep(0.01)
                    continue
                items = [c.EnqueueItem(b"p%d-%d" % (pid, k + j)) for j in range(rng.randint(1, 5))]
                k += len(items)
                try:
                    res = await leader.propose(c.Enqueue("q", items))
                except DoqError as e:
                    assert e.retryable or type(e) is OutcomeUnknown, e  # unacknowledged either way
                    await asyncio.sleep(0.005)
                    continue
                for it, r in zip(items, res, strict=True):  # type: ignore[call-overload]
                    acked[it.content] = r.id

        async def nemesis() -> None:
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.1, 0.4))
                action = rng.choice(["isolate", "restart", "loss", "heal"])
                leader = cl.leader()
                if action == "isolate" and leader is not None:
                    cl.net.isolate(leader.node_id)
                    await asyncio.sleep(rng.uniform(0.3, 0.8))
                    cl.net.heal()
                elif action == "restart":
                    nid = rng.choice(sorted(cl.nodes))
                    if len(cl.nodes) == 3:
                        await cl.stop(nid, transfer_leadership=rng.random() < 0.5)
                        await asyncio.sleep(rng.uniform(0.05, 0.5))
                        await cl.start(nid)
                elif action == "loss":
                    cl.net.drop_rate = rng.uniform(0.05, 0.3)
                else:
                    cl.net.heal()
                    cl.net.drop_rate = 0.0

        tasks = [asyncio.create_task(producer(i)) for i in range(3)] + [asyncio.create_task(nemesis())]
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        cl.net.heal()
        cl.net.drop_rate = 0.0

        async def tick() -> object:
            return await (await cl.wait_leader()).propose(c.Tick())

        await retry(tick)
        await cl.converged(60)
        assert len(acked) > 50, len(acked)
        assert len(set(cl.digests().values())) == 1
        for n in cl.nodes.values():
            for content, id_ in acked.items():
                assert n.state.get_message("q", id_).content == content  # type: ignore[attr-defined]
            total = n.state.get_queue("q").stats.total
            assert total >= len(acked)
            contents = [n.state.get_message("q", i).content for i in range(1, total + 1)]  # type: ignore[attr-defined]
            assert len(set(contents)) == total  # nothing applied twice
        assert not cl.net.violations, cl.net.violations[:5]
    finally:
        await cl.close()
