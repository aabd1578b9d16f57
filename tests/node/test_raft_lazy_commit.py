"""The node's lazy commit (`RaftNodeConfig.broadcast_commit=False`, the default): the
commit index rides the leader's next append or heartbeat, so a follower persists a call's
entry and applies the previous call's in ONE durable write, instead of a second write of
its own for each commit (etcd's broadcast on commit). Three production RaftNodes under
virtual time with inline "threads" (deterministic: no tick fires while the calls run,
since virtual time moves only when the loop idles); real LMDB."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from doq.node.raft_node import RaftNode, RaftNodeConfig, _Job
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.storage import env as env_mod
from doq.storage.segment_log import SegmentLog
from doq.storage.state import StateStore
from tests.node.raftnet import Cluster, retry
from tests.node.simloop import InlineExecutor, VirtualTimeLoop

CALLS = 12


class _CountingNode(RaftNode):
    """Counts its durable writes (one per Ready with something to persist or apply)."""

    writes = 0

    def _write(self, job: _Job) -> None:
        self.writes += 1
        super()._write(job)


def _inline(node: RaftNode) -> None:
    node._writer = node._applier = node._snapshots.executor = InlineExecutor()  # type: ignore[assignment]


async def _settled(cl: Cluster, leader: RaftNode) -> bool:
    """Three voters, and every node has applied all the leader committed."""
    st = leader.cluster_status()
    voters = [m for m in st.members if m.role == "voter"]
    return len(voters) == 3 and all(n.applied_index == st.commit_index for n in cl.nodes.values())


async def _scenario(root: Path) -> None:
    loop = asyncio.get_running_loop()
    cfg = RaftNodeConfig(tick_ms=25, election_tick=10, heartbeat_tick=1, broadcast_commit=False)
    cl = Cluster(root, cfg, _CountingNode, prepare=_inline,
                 clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        ld = await cl.grow("n2", "n3")
        while not await _settled(cl, ld):
            await asyncio.sleep(0.025)  # virtual: a tick
        followers = [n for n in cl.nodes.values() if n is not ld]
        assert all(isinstance(n, _CountingNode) for n in followers)
        before = [n.writes for n in followers]  # type: ignore[attr-defined]
        applied_before = [n.applied_index for n in followers]
        for i in range(CALLS):  # one call at a time, each waiting for its confirmation
            await ld.propose(c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)]))
        # one write per call on each follower (etcd's broadcast on commit: two)
        assert [n.writes - b for n, b in zip(followers, before, strict=True)] == [CALLS, CALLS]  # type: ignore[attr-defined]
        # each applied the calls before the last with the next call's entry; the last
        # call's commit reaches them with the next heartbeat
        assert [n.applied_index - a for n, a in zip(followers, applied_before, strict=True)] == [CALLS - 1] * 2
        while not await _settled(cl, ld):
            await asyncio.sleep(0.025)
        for n in followers:
            assert n.state.get_queue("q").stats.total == CALLS
    finally:
        await cl.close()


def test_a_follower_makes_one_durable_write_per_call_and_learns_the_last_commit_by_heartbeat(tmp_path: Path) -> None:
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(_scenario(tmp_path))
    finally:
        loop.close()


async def _syncs_scenario(root: Path, syncs: list[str]) -> None:
    loop = asyncio.get_running_loop()
    cfg = RaftNodeConfig(tick_ms=25, election_tick=10, heartbeat_tick=1, broadcast_commit=False,
                         apply_thread=False)  # (the batched commit is for the apply thread off)
    cl = Cluster(root, cfg, _CountingNode,
                 prepare=_inline, clock_ms=lambda: 1_700_000_000_000 + int(loop.time() * 1000))
    try:
        await cl.start("n1")
        ld = await cl.wait_leader()
        await retry(lambda: ld.propose(c.CreateQueue("q", "delayed", QueueSettings())))
        ld = await cl.grow("n2", "n3")
        while not await _settled(cl, ld):
            await asyncio.sleep(0.025)
        nodes = sorted(cl.nodes.values(), key=lambda n: n is not ld)  # the leader first
        writes_before = [n.writes for n in nodes]  # type: ignore[attr-defined]
        txnids_before = [n.env.info()["last_txnid"] for n in nodes]
        syncs.clear()
        for i in range(CALLS):
            await ld.propose(c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)]))
        writes = [n.writes - b for n, b in zip(nodes, writes_before, strict=True)]  # type: ignore[attr-defined]
        synced = [syncs.count(n.env.path()) for n in nodes]
        wal_synced = [syncs.count(f"wal:{n.env.path()}") for n in nodes]
        txns = [syncs.count(f"txn:{n.env.path()}") for n in nodes]
        # the leader: an append and an apply per call; a follower: one write per call;
        # each append is one segment log fdatasync, no LMDB commit syncs its meta page
        assert writes == [2 * CALLS, CALLS, CALLS], writes
        assert wal_synced == [CALLS, CALLS, CALLS], wal_synced
        assert synced == [0, 0, 0], synced
        # one LMDB write transaction per call on the leader: its append (no hard state,
        # nothing committed) opens none, its apply one. A follower's too, but for the
        # first call's append: the heartbeats of the settling told it every commit before,
        # so that write has nothing for LMDB (no new commit index, nothing to apply)
        assert txns == [CALLS, CALLS - 1, CALLS - 1], txns
        # and those write transactions are held open across the calls (the batched
        # commit, `RaftNodeConfig.hold_commit_ms`): no LMDB commit at all while the calls
        # ran (virtual time did not move: the flush timer did not fire); every commit
        # would sync its data pages (one fdatasync per call more)
        commits = [n.env.info()["last_txnid"] - b for n, b in zip(nodes, txnids_before, strict=True)]
        assert commits == [0, 0, 0], commits
        assert all(n.state.held for n in nodes)
        await asyncio.sleep(cl.nodes[ld.node_id].cfg.hold_commit_ms / 1000 + 0.025)  # virtual
        assert not any(n.state.held for n in nodes)
        commits = [n.env.info()["last_txnid"] - b for n, b in zip(nodes, txnids_before, strict=True)]
        assert all(1 <= k <= 3 for k in commits), commits  # the flush (and a heartbeat's commit index)
        # what the leader applied without a meta sync is in its store all the same
        assert ld.state.get_queue("q").stats.total == CALLS
    finally:
        await cl.close()


def test_entries_are_synced_once_in_the_segment_log_and_the_apply_never_syncs_the_meta_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries are made durable by the segment log's one fdatasync per write; the LMDB
    commit that applies them (and records the commit index) then syncs its data pages
    only: an OS crash that undoes it makes the node re-apply the same entries from its log
    (`RaftNode._must_be_durable`). Terms, votes, snapshots, memberships still sync the
    meta page (not in this steady state). A leader's Ready that only appends opens no
    LMDB transaction at all (`RaftNode._commit_state`)."""
    syncs: list[str] = []
    real = env_mod.sync_meta

    def counting(env: lmdb.Environment) -> None:
        syncs.append(env.path())
        real(env)

    real_seg_sync = SegmentLog.sync

    def counting_seg(log: SegmentLog) -> None:
        if log._dirty:  # an fdatasync follows
            syncs.append(f"wal:{log.path.parent}")
        real_seg_sync(log)

    real_write = StateStore.write

    def counting_write(store: StateStore, *, durable: bool = True, **kw: object) -> Iterator[lmdb.Transaction]:
        syncs.append(f"txn:{store.env.path()}")
        return real_write(store, durable=durable, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("doq.storage.state.sync_meta", counting)
    monkeypatch.setattr(SegmentLog, "sync", counting_seg)
    monkeypatch.setattr(StateStore, "write", counting_write)
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(_syncs_scenario(tmp_path, syncs))
    finally:
        loop.close()
