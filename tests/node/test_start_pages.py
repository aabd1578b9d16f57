"""A restarted node lets go of the data file's pages its start read: the Raft log's entries
since its snapshot, read again to be applied (the state skips those it holds), stay in the
page cache but not in the process's RSS (`RaftNode._release_start_pages`)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest

from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import FAST, Cluster, retry
from tests.storage.test_mapped_pages import _mapped_rss_bytes

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps: Linux")]


async def _released(node: object) -> int:
    while getattr(node, "start_pages_released", None) is None:  # set once the start's entries are applied
        await asyncio.sleep(0.01)
    return await node.start_pages_released  # type: ignore[attr-defined, no-any-return]


async def test_a_restarted_node_lets_go_of_the_pages_its_start_read(tmp_path: Path) -> None:
    cl = Cluster(tmp_path, dataclasses.replace(FAST, snapshot_every=0))  # the log keeps every entry
    try:
        n1 = await cl.start("n1")
        await cl.wait_leader()
        await retry(lambda: n1.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        for _ in range(90):  # ~45 MB of log entries (and as much of message bodies): more than
            # the log's cache at open holds (32 MiB), so the Readies after it read the rest
            await n1.propose(c.EnqueueColumns("q", [b"x" * 1000] * 500))
        await cl.stop("n1")
        n1 = await cl.start("n1")
        assert await asyncio.wait_for(_released(n1), 60) > 0
        data = tmp_path / "n1" / "data.mdb"
        assert data.stat().st_size > 80 << 20
        assert _mapped_rss_bytes(data) < data.stat().st_size // 20  # released after the last entry was read
        assert n1.state.get_queue("q").stats.total == 45_000  # the restarted node serves its state
    finally:
        await cl.close()
