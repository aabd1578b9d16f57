"""The commit of a held write (the batched commit) is observed once, whoever asks for it:
the flush write as every write, a direct reader's commit in `RaftNode._held_committed`
(one `doq_commit_seconds` and one `doq_fsync_seconds` sample). Real LMDB, real threads,
the in-memory network (tests/node/raftnet.py); the hold is a minute so that only what a
test does commits a held write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.service.api import QueueService
from tests.node.heldnet import one_node
from tests.node.raftnet import Cluster, eventually

pytestmark = pytest.mark.timeout(180)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def _observed_node(root: Path) -> tuple[RaftNode, list[tuple[float, float | None]]]:
    _, n1 = await one_node(root, _open)
    await n1.inspect(lambda s: s.commit_held())
    samples: list[tuple[float, float | None]] = []
    n1._on_commit = lambda commit_s, fsync_s: samples.append((commit_s, fsync_s))
    return n1, samples


async def test_a_commit_a_reader_asks_for_is_observed_once_with_its_fsync(tmp_path: Path) -> None:
    """Three held writes (three samples, none with an LMDB commit), then `get_message` from
    a worker thread has the held write committed: one more sample, with its commit's
    time. Fails if a reader's commit goes unobserved."""
    n1, samples = await _observed_node(tmp_path)
    ids = [(await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"m")])))[0].id for _ in range(3)]  # type: ignore[index]
    assert await n1.inspect(lambda s: s.held)
    assert len(samples) == 3 and all(f is None for _, f in samples)
    await QueueService(n1).get_message("q", ids[-1])
    assert not await n1.inspect(lambda s: s.held)
    assert len(samples) == 4
    commit_s, fsync_s = samples[-1]
    assert fsync_s is not None and commit_s == fsync_s > 0


async def test_the_flush_writes_commit_is_observed_once(tmp_path: Path) -> None:
    """The timer's flush write commits the held write: one sample (the write's), with an
    LMDB commit. Fails if `_held_committed` observed the flush's commit a second time."""
    n1, samples = await _observed_node(tmp_path)
    await n1.propose(c.Enqueue("q", [c.EnqueueItem(b"m")]))
    assert await n1.inspect(lambda s: s.held)  # its write ended (answers come before: `_answer_early`)
    assert len(samples) == 1
    n1._on_flush_timer()  # as the timer would, `hold_commit_ms` later
    async def committed() -> bool | None:
        return None if await n1.inspect(lambda s: s.held) else True

    await eventually(committed, 30, "the flush write committed the held write")
    assert len(samples) == 2
    assert samples[-1][1] is not None

