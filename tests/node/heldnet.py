"""Helpers of the batched-commit tests (`RaftNodeConfig.hold_commit_ms`): a one-node
cluster on the in-memory network (tests/node/raftnet.py) whose writes are held for a
minute, so that only what a test does commits a held write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import FAST, Cluster, retry

HOLD = dataclasses.replace(FAST, hold_commit_ms=60_000, apply_thread=False)


async def one_node(root: Path, opened: list[Cluster], cfg: RaftNodeConfig = HOLD) -> tuple[Cluster, RaftNode]:
    """A one-node cluster under `root` with delayed queue "q", its leader elected; the
    cluster is appended to `opened` (the caller's fixture closes it)."""
    cl = Cluster(root, cfg, RaftNode)
    opened.append(cl)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await retry(lambda: n1.propose(c.CreateQueue("q", "delayed", QueueSettings())))
    return cl, n1


def enq(i: int) -> c.Enqueue:
    """An enqueue of one message, body b"m<i>", into "q"."""
    return c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)])


async def held(node: RaftNode) -> bool:
    """Is a write held, as of the end of the last write? (Read on the apply thread: an
    answer may come before its write ends, `RaftNode._answer_early`.)"""
    return await node.inspect(lambda s: s.held)
