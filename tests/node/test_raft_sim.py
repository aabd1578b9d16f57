"""The production RaftNode under a seeded, virtual-time simulation: real LMDB and the real
queue machine, virtual clock and ticks, inline "threads", a faulty in-memory network
(loss, duplication, delays that reorder), partitions, abrupt crashes at any await point
(e.g. after a Ready was persisted but before it was sent) and restarts. After healing:
every acknowledged enqueue is present exactly once on every replica, replicas are
byte-identical, nothing was ever sent before it was durable; the same seed replays the
same run (identical message trace and digest)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import tempfile
from pathlib import Path

import pytest

from doq.errors import DoqError, OutcomeUnknown
from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import Cluster, retry
from tests.node.simloop import InlineExecutor, VirtualTimeLoop

pytestmark = pytest.mark.timeout(600)
CFG = RaftNodeConfig(tick_ms=50, election_tick=10, snapshot_every=150, keep_entries=8)


def _inline(node: RaftNode) -> None:
    node._writer = node._applier = node._snapshots.executor = InlineExecutor()  # type: ignore[assignment]


async def scenario(root: Path, seed: int, virtual_s: float = 12.0,
                   node_cls: type[RaftNode] = RaftNode) -> tuple[str, str, int]:
    """Returns (trace hash, final digest, acknowledged count)."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    cl = Cluster(root, CFG, node_cls, prepare=_inline,
                 clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    cl.net.rng = random.Random(seed + 1)
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
                    await asyncio.sleep(0.05)
                    continue
                items = [c.EnqueueItem(b"p%d-%d" % (pid, k + j)) for j in range(1 + k % 3)]
                k += len(items)
                try:
                    res = await leader.propose(c.Enqueue("q", items))
                except DoqError as e:
                    assert e.retryable or type(e) is OutcomeUnknown, e  # unacknowledged either way
                    await asyncio.sleep(0.02)
                    continue
                for it, r in zip(items, res, strict=True):  # type: ignore[call-overload]
                    acked[it.content] = r.id
                await asyncio.sleep(0.001 * (pid + 1))

        async def nemesis() -> None:
            down: list[str] = []
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                leader = cl.leader()
                action = rng.choice(["isolate", "crash", "crash_leader", "restart", "net", "heal"])
                if action == "isolate" and leader is not None:
                    cl.net.isolate(leader.node_id)
                elif action in ("crash", "crash_leader") and not down:
                    victim = leader.node_id if action == "crash_leader" and leader else rng.choice(sorted(cl.nodes))
                    await asyncio.sleep(rng.uniform(0, 0.01))  # land at any await point
                    await cl.crash(victim)
                    down.append(victim)
                elif action == "restart" and down:
                    await cl.start(down.pop())
                elif action == "net":
                    cl.net.drop_rate = rng.uniform(0, 0.2)
                    cl.net.dup_rate = rng.uniform(0, 0.1)
                    cl.net.max_delay_s = rng.uniform(0, 0.08)
                else:
                    cl.net.heal()
                    cl.net.drop_rate = cl.net.dup_rate = cl.net.max_delay_s = 0.0
            for nid in down:
                await cl.start(nid)

        tasks = [asyncio.create_task(producer(i)) for i in range(3)] + [asyncio.create_task(nemesis())]
        await asyncio.sleep(virtual_s)
        stop.set()
        await asyncio.gather(*tasks)
        cl.net.heal()
        cl.net.drop_rate = cl.net.dup_rate = cl.net.max_delay_s = 0.0

        async def tick() -> object:
            return await (await cl.wait_leader(60)).propose(c.Tick())

        await retry(tick, 60)
        await cl.converged(60)
        digests = set(cl.digests().values())
        assert len(digests) == 1, cl.digests()
        for n in cl.nodes.values():
            total = n.state.get_queue("q").stats.total
            contents = [n.state.get_message("q", i).content for i in range(1, total + 1)]  # type: ignore[attr-defined]
            assert len(set(contents)) == total  # nothing applied twice
            for content, id_ in acked.items():
                assert contents[id_ - 1] == content  # nothing acknowledged lost
        assert not cl.net.violations, cl.net.violations[:5]
        trace = hashlib.sha256(repr(cl.net.trace).encode()).hexdigest()
        return trace, digests.pop(), len(acked)
    finally:
        await cl.close()


def run(root: Path, seed: int, node_cls: type[RaftNode] = RaftNode) -> tuple[str, str, int]:
    """One seed on a fresh virtual-time loop. The files go to tmpfs when there is one:
    fsync costs no virtual time, only real time."""
    loop = VirtualTimeLoop()
    shm = Path("/dev/shm")
    try:
        if shm.is_dir():
            with tempfile.TemporaryDirectory(dir=shm, prefix="doq-raft-sim-") as d:
                return loop.run_until_complete(scenario(Path(d) / root.name, seed, node_cls=node_cls))
        return loop.run_until_complete(scenario(root, seed, node_cls=node_cls))
    finally:
        loop.close()


@pytest.mark.parametrize("seed", range(2))
def test_seeded_simulation_of_the_driver(tmp_path: Path, seed: int) -> None:
    trace, digest, acked = run(tmp_path / "a", seed)
    assert acked > 100


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 2 + int(os.environ.get("DOQ_DRIVER_SIM_SEEDS", "10"))))
def test_more_seeds_of_the_driver_simulation(tmp_path: Path, seed: int) -> None:
    _, _, acked = run(tmp_path / "a", seed)
    assert acked > 100


def test_a_seed_replays_exactly(tmp_path: Path) -> None:
    assert run(tmp_path / "a", 7) == run(tmp_path / "b", 7)


def test_the_simulation_catches_a_driver_that_sends_before_persisting(tmp_path: Path) -> None:
    from tests.node.test_raft_node import SendsBeforePersisting

    with pytest.raises(AssertionError, match="durable"):
        run(tmp_path / "a", 0, SendsBeforePersisting)
