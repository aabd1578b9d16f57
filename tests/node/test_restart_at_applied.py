"""A restarted node starts its Raft core at its state's applied index (`RaftConfig.applied`,
`WalLogStorage.start_at`): the entries the state holds are neither read nor applied again,
the committed entries it does not hold are applied once, and the membership is the one of
its applied index (conf changes after the snapshot included), also its own removal.
Real LMDB and segment files; the network is `tests.node.raftnet`'s in-memory one."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from doq.node.raft_node import RaftNode
from doq.node.wal_log import WalLogStorage
from doq.raft.types import EntryType, Role
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.node.raftnet import FAST, Cluster, eventually, retry
from tests.node.test_raft_node import create_queue, enq

pytestmark = pytest.mark.timeout(180)


class Spy:
    """What a node's start reads of its log and what it applies."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []  # [lo, hi) of every segment read
        self.applied: list[int] = []  # entry indexes given to the state

    def prepare(self, node: RaftNode) -> None:
        seg_read = node.storage.seg.read
        apply_entries = node.state.apply_entries

        def read(lo: int, hi: int, max_bytes: int | None = None) -> list[tuple[int, int, int, bytes]]:
            got = seg_read(lo, hi, max_bytes)
            self.reads.append((lo, lo + len(got)))
            return got

        def apply(txn: object, items: list[tuple[int, object]]) -> list[list[object]]:
            self.applied += [i for i, _ in items]
            return apply_entries(txn, items)  # type: ignore[arg-type]

        node.storage.seg.read = read  # type: ignore[method-assign]
        node.state.apply_entries = apply  # type: ignore[method-assign]


async def test_a_restart_reads_and_applies_no_entry_its_state_holds_and_keeps_the_membership(tmp_path: Path) -> None:
    cl = Cluster(tmp_path, dataclasses.replace(FAST, snapshot_every=0))  # the snapshot: the bootstrap's (n1 alone)
    try:
        n1 = await cl.start("n1")
        await cl.wait_leader()
        await create_queue(n1)
        for i in range(20):
            await n1.propose(enq(i))
        ld = await cl.grow("n2", "n3")
        for i in range(20, 30):
            await retry(lambda i=i: ld.propose(enq(i)))  # type: ignore[misc]
        await cl.converged()
        for nid in ("n3", "n2", "n1"):
            await cl.stop(nid, transfer_leadership=False)

        spy = Spy()
        cl.prepare = spy.prepare
        n1 = await cl.start("n1")
        held = n1.state.applied_index
        assert n1.core is not None and n1.core.log.applied == held
        # the membership of its applied index, from the conf changes after the snapshot:
        # alone it may not elect itself (with the snapshot's membership it would)
        assert (n1.core.voters, n1.core.learners) == (("n1", "n2", "n3"), ())
        conf_entries = {i for lo, hi in spy.reads for i in range(lo, hi)}
        storage = n1.storage
        assert conf_entries and all(e.type == EntryType.CONF_CHANGE for e in storage.entries(
            min(conf_entries), max(conf_entries) + 1, 1 << 30) if e.index in conf_entries)
        assert len(conf_entries) == 4  # n2, n3 added as learners and promoted: nothing else read
        await asyncio.sleep(20 * FAST.tick_ms / 1000)  # more than an election timeout
        assert n1._role != Role.LEADER
        cl.prepare = None
        await cl.start("n2")
        await cl.start("n3")
        ld = await cl.wait_leader()
        for i in range(30, 35):
            await retry(lambda i=i: ld.propose(enq(i)))  # type: ignore[misc]
        await cl.converged()
        assert spy.applied and min(spy.applied) > held  # nothing applied again
        assert spy.applied == sorted(set(spy.applied))  # each once, in order
        assert len(set(cl.digests().values())) == 1
        assert n1.state.get_queue("q").stats.total == 35
    finally:
        await cl.close()


async def test_committed_entries_the_state_does_not_hold_are_applied_once_at_restart(tmp_path: Path) -> None:
    """The hard state's commit index is ahead of the state's applied index (a Ready applies
    at most `max_committed_bytes` of committed entries; the node died after the first such
    write): the restart applies the rest, each entry once."""
    # one entry per Ready, each write committed (no batched commit: the first write must be in LMDB)
    cfg = dataclasses.replace(FAST, snapshot_every=0, max_committed_bytes=1, hold_commit_ms=0)
    cl = Cluster(tmp_path, cfg)
    try:
        n1 = await cl.start("n1")
        await cl.wait_leader()
        await create_queue(n1)
        writes = 0
        apply_entries = n1.state.apply_entries

        def one_write_then_die(txn: object, items: list[tuple[int, object]]) -> list[list[object]]:
            nonlocal writes
            writes += 1
            if writes > 1:
                raise RuntimeError("the process dies before this write commits")
            return apply_entries(txn, items)  # type: ignore[arg-type]

        n1.state.apply_entries = one_write_then_die  # type: ignore[method-assign]
        futs = [n1.propose_alone(enq(i)) for i in range(10)]  # ten entries, one Ready
        await eventually(lambda: _done(n1), 30, "the node did not fail")
        for f in futs:
            f.cancel()
        await cl.crash("n1")
        env = open_env(tmp_path / "n1", map_size=1 << 30)
        try:
            st = StateStore(env)
            log = WalLogStorage(env)
            held, commit, last = st.applied_index, log.hard_state.commit, log.last_index()
            log.close()
            assert st.get_queue("q").stats.total == 1
        finally:
            env.close()
        assert held < commit == last  # committed (a lone voter commits at append), one applied

        spy = Spy()
        cl.prepare = spy.prepare
        n1 = await cl.start("n1")  # (a lone voter: it leads and applies at once)
        await cl.wait_leader()
        await retry(lambda: n1.propose(enq(10)))
        assert spy.applied[: commit - held] == list(range(held + 1, commit + 1))
        assert spy.applied == sorted(set(spy.applied))
        assert n1.state.get_queue("q").stats.total == 11
    finally:
        await cl.close()


async def _done(node: RaftNode) -> bool | None:
    return True if node.liveness_problems() else None


async def test_a_removed_member_knows_it_at_restart(tmp_path: Path) -> None:
    cl = Cluster(tmp_path, dataclasses.replace(FAST, snapshot_every=0))
    try:
        n1 = await cl.start("n1")
        await cl.wait_leader()
        await create_queue(n1)
        ld = await cl.grow("n2", "n3")
        await retry(lambda: ld.remove_member("n3"))
        await cl.converged()
        await eventually(lambda: _removed(cl.nodes["n3"]), 30, "n3 did not apply its removal")
        await cl.stop("n3", transfer_leadership=False)
        n3 = await cl.start("n3")
        assert n3.core is not None and n3.core.voters == ("n1", "n2")
        assert n3._removed and "not_a_member" in n3.readiness_problems()
    finally:
        await cl.close()


async def _removed(node: RaftNode) -> bool | None:
    return True if node._removed else None
