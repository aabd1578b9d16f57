"""Membership changes under the lazy commit (`RaftNodeConfig.broadcast_commit=False`).

A conf change takes effect on a node when it applies it, and a follower applies what it
knows committed. With the lazy commit a follower learns a commit with the leader's next
append or heartbeat, so right after a conf change commits on the leader its followers
may not have applied it yet. Two things must still work from that moment on:

- a transfer of leadership to the member just made a voter (its TimeoutNow may arrive
  before it applied its promotion: the leader sends it again until it campaigns; the
  race itself is reproduced in the pure core, tests/raft/test_lazy_conf_change.py, since
  here the promotion's commit reaches the new voter first; this test passes on main too
  and guards the whole path on real nodes);
- the survivors of a leader killed right then electing a leader (they must learn the
  commit of a membership change without waiting for a later call: fails without the
  leader sending a conf change's commit at once).

Three production RaftNodes (peer door included) under virtual time with inline
"threads" (deterministic for the seeds); real LMDB.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from doq.node.raft_node import REFUSED, RaftNode, RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from tests.node.raftnet import Cluster, addrs, retry
from tests.node.simloop import InlineExecutor, VirtualTimeLoop

LAZY = RaftNodeConfig(tick_ms=25, election_tick=10, heartbeat_tick=1, broadcast_commit=False,
                      admin_timeout_ms=5_000)


def _inline(node: RaftNode) -> None:
    node._writer = node._applier = node._snapshots.executor = InlineExecutor()  # type: ignore[assignment]


def _is_voter(node: RaftNode, nid: str) -> bool:
    return node.core is not None and nid in node.core.voters


async def _join(cl: Cluster, ld: RaftNode, nid: str) -> RaftNode:
    """Start `nid` and add it as a learner through `ld` (as `doq serve --join`)."""
    node = await cl.start(nid, join=True)
    mine = dataclasses.replace(addrs(nid), store_id=node.identity.store_id)
    await retry(lambda: ld.add_member(nid, mine, empty=True))
    return node


async def _promoted_on(ld: RaftNode, nid: str, *, acked: bool = False) -> None:
    """Return at the first instant (1 ms of virtual time) `ld` has applied `nid`'s
    promotion (proposed by the leader on a tick once `nid` caught up); `acked`: and `ld`
    has `nid`'s acknowledgement of its whole log (a transfer then sends TimeoutNow at
    once)."""
    def done() -> bool:
        core = ld.core
        return (core is not None and nid in core.voters
                and (not acked or core.prs[nid].match == core.log.last_index()))

    while not done():
        await asyncio.sleep(0.001)


async def _transfer_scenario(root: Path) -> None:
    loop = asyncio.get_running_loop()
    cl = Cluster(root, LAZY, prepare=_inline,
                 clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        await _join(cl, ld, "n2")
        await _promoted_on(ld, "n2", acked=True)  # committed by n1 alone, the only voter
        assert await ld.transfer_leader("n2") == "n2"
        new = await cl.wait_leader(timeout_s=60)
        assert new.node_id == "n2"
        await retry(lambda: new.propose(c.Enqueue("q", [c.EnqueueItem(b"after")])))
    finally:
        await cl.close()


def test_leadership_moves_to_a_voter_whose_promotion_it_has_not_applied_yet(tmp_path: Path) -> None:
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(_transfer_scenario(tmp_path))
    finally:
        loop.close()


async def _crash_scenario(root: Path) -> None:
    loop = asyncio.get_running_loop()
    cl = Cluster(root, LAZY, prepare=_inline,
                 clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        ld = await cl.grow("n2")
        n3 = await _join(cl, ld, "n3")
        core = ld.core
        assert core is not None
        while core.prs["n3"].match < core.log.committed:  # caught up: promoted on a tick
            await asyncio.sleep(0.001)
        cl.net.blocked.add(("n1", "n3"))  # a slow link: n3 hears nothing more from n1
        await _promoted_on(ld, "n3")  # committed by n1 and n2
        assert not _is_voter(n3, "n3")
        refused_before = REFUSED.labels("not_member")._value.get()
        await cl.crash("n1")
        cl.net.heal()
        new = await cl.wait_leader(timeout_s=30)
        assert new.node_id in ("n2", "n3")
        # the two survivors are a quorum of the three voters: a write commits
        await retry(lambda: new.propose(c.Enqueue("q", [c.EnqueueItem(b"after")])))
        assert all(_is_voter(n, "n3") for n in cl.nodes.values())
        assert REFUSED.labels("not_member")._value.get() == refused_before  # the door let all in
    finally:
        await cl.close()


def test_the_survivors_elect_a_leader_when_it_dies_right_after_a_promotion_commits(tmp_path: Path) -> None:
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(_crash_scenario(tmp_path))
    finally:
        loop.close()
