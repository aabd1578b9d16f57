"""RaftNode: online restore through the Raft log, over the in-memory network (real LMDB per
node, real asyncio, the real queue machine; the Ready contract is checked at every send).

Every replica must end with the state an offline restore of the chain gives (the same
digest), or, when the restore fails, with its state unchanged."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.backup.online import restore_online
from doq.backup.ops import RestoreResult, restore_offline, write_backup
from doq.errors import FailedPrecondition, InvalidArgument, NotLeader, OutcomeUnknown
from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.storage.env import node_dir, open_env
from doq.storage.state import STAGE_KEY, RestoreOutcome, StateStore
from tests.node.raftnet import FAST, Cluster, eventually, retry
from tests.support.restore_chain import RestoreChain, build_chain, digest_of_offline_restore

pytestmark = pytest.mark.timeout(180)
SMALL_CHUNKS = dataclasses.replace(FAST, restore_chunk_bytes=2048)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> RestoreChain:
    return build_chain(tmp_path_factory.mktemp("chain"))


def new_cluster(root: Path, config: RaftNodeConfig = SMALL_CHUNKS) -> Cluster:
    cl = Cluster(root, config)
    _open.append(cl)
    return cl


async def empty_three(root: Path, config: RaftNodeConfig = SMALL_CHUNKS) -> Cluster:
    """Three voters and an empty state (no command applied yet)."""
    cl = new_cluster(root, config)
    await cl.start("n1")
    await cl.grow("n2", "n3")
    assert all(n.state.is_empty() for n in cl.nodes.values())
    return cl


def files(chain: RestoreChain) -> list[io.BufferedReader]:
    return [open(p, "rb") for p in chain.paths]  # noqa: SIM115 - closed by close_all


def close_all(fs: list[io.BufferedReader]) -> None:
    for f in fs:
        f.close()


async def restore(node: RaftNode, chain: RestoreChain) -> RestoreResult:
    fs = files(chain)
    try:
        return await restore_online(node, fs, [p.name for p in chain.paths])
    finally:
        close_all(fs)


def digests(cl: Cluster) -> dict[str, int]:
    return {nid: n.state.state_digest()[1] for nid, n in cl.nodes.items()}


def staged(node: RaftNode) -> bool:
    node.state.wait_committed()  # a direct reader of LMDB: what was applied, committed
    with node.env.begin() as txn:
        return txn.get(STAGE_KEY, db=node.state._meta) is not None


async def test_three_nodes_restore_a_chain_through_the_log(tmp_path: Path, chain: RestoreChain) -> None:
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    before = leader.storage.last_index()
    own = leader.state.cluster_id
    res = await restore(leader, chain)
    assert leader.storage.last_index() - before > 10  # many chunk entries, then the commit
    assert (res.files, res.to_version) == (2, chain.to_version)
    await cl.converged()
    assert set(digests(cl).values()) == {chain.digest}
    for n in cl.nodes.values():
        assert sum(q.stats.total for q in n.state.list_queues()) == chain.messages
        assert not staged(n)
        assert n.state.state_digest()[0] == chain.to_version
        assert n.state.cluster_id == chain.cluster_id != own  # the restored history's id
    assert not cl.net.violations


async def test_writes_after_the_restore_get_higher_versions_and_back_up_exactly(
        tmp_path: Path, chain: RestoreChain) -> None:
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    res = await restore(leader, chain)
    out = await retry(lambda: leader.propose(c.Enqueue("jobs", [c.EnqueueItem(b"after")])))
    new_id = out[0].id  # type: ignore[index]
    await retry(lambda: leader.propose(c.CreateQueue("more", "delayed", QueueSettings())))
    await leader.read_barrier()  # as `POST /db/backup` does: the answers' commit is readable
    buf = io.BytesIO()
    last = write_backup(leader.state, res.to_version + 1, buf)
    assert last > res.to_version
    post = tmp_path / "post.bak"
    post.write_bytes(buf.getvalue())
    await cl.converged()
    live = set(digests(cl).values())
    assert len(live) == 1
    assert digest_of_offline_restore([*chain.paths, post], tmp_path / "offline") == live.pop()
    restore_offline(tmp_path / "check", "x", chain.full, [chain.inc, post])
    env = open_env(node_dir(tmp_path / "check", "x") / "doq.lmdb", map_size=1 << 30)
    try:
        assert StateStore(env).get_message("jobs", new_id).content == b"after"
    finally:
        env.close()


@pytest.mark.parametrize("elections", [0, 12])
async def test_a_one_member_cluster_restores_through_its_log(
        tmp_path: Path, chain: RestoreChain, elections: int) -> None:
    """Whether the chain's version is ahead of the log (0 elections) or behind it (12 with a
    young chain): new entries get versions above the restored ones, ids go on, and after a
    restart nothing from before the restore is applied again."""
    small = chain
    if elections:
        small = build_chain(tmp_path / "small", messages=30, first_index=1)
    cl = new_cluster(tmp_path / "dst")
    b = await cl.start("b")
    await cl.wait_leader()
    for _ in range(elections):  # each election appends an empty entry
        await cl.stop("b")
        b = await cl.start("b")
        await cl.wait_leader()
    assert (b.storage.last_index() > small.to_version) == bool(elections) and b.state.is_empty()
    res = await restore(b, small)
    assert b.state.state_digest()[1] == small.digest
    version = b.state.state_digest()[0]
    assert version == res.to_version >= small.to_version
    out = await retry(lambda: b.propose(c.Enqueue("jobs", [c.EnqueueItem(b"after")])))
    new_id = out[0].id  # type: ignore[index]
    assert {v for _, _, v in b.state.iter_changes(version + 1)} == {version + 1}
    digest = b.state.state_digest()
    await cl.stop("b")
    b = await cl.start("b")
    await cl.wait_leader()
    assert b.state.state_digest()[1] == digest[1]
    assert b.state.get_message("jobs", new_id).content == b"after"
    out = await retry(lambda: b.propose(c.Enqueue("jobs", [c.EnqueueItem(b"again")])))
    assert out[0].id == new_id + 1  # type: ignore[index]


async def test_a_follower_that_installs_a_snapshot_mid_restore_restores_the_same(
        tmp_path: Path, chain: RestoreChain) -> None:
    """n3 is down while half of the chunks commit; the log behind them is compacted, so n3
    catches up from a snapshot taken mid-restore: the staging must travel in it, or n3's
    commit fails and its state differs."""
    cfg = dataclasses.replace(SMALL_CHUNKS, snapshot_every=4, keep_entries=0)
    cl = await empty_three(tmp_path, cfg)
    await cl.stop("n3")
    leader = await cl.wait_leader()
    fs = files(chain)
    try:
        from doq.backup.format import BackupReader
        from doq.backup.ops import RestoreChain as Verified

        readers = [BackupReader(f) for f in fs]
        chunks = list(Verified(readers, [p.name for p in chain.paths]).chunks(cfg.restore_chunk_bytes))
    finally:
        close_all(fs)
    rid, half = b"x" * 16, len(chunks) // 2
    assert half > 4
    for seq, (payload, _) in enumerate(chunks[:half]):
        assert await leader.propose_alone(c.RestoreChunk(rid, seq, payload)) is None
    last_chunk = leader.storage.last_index()

    async def compacted() -> bool:
        await leader.propose_alone(c.RestoreAbort(b"not-this-one"))  # entries, so snapshots go on
        return leader.storage.first_index() > last_chunk

    await eventually(compacted, 30, "the leader's log compacted past the staged chunks")
    n3 = await cl.start("n3")
    await eventually(lambda: _true(n3.applied_index >= last_chunk), 30, "n3 caught up")
    assert n3.storage.snapshot_meta().index >= last_chunk  # by a snapshot, not from the log
    assert staged(n3)
    for seq, (payload, _) in enumerate(chunks[half:], start=half):
        assert await leader.propose_alone(c.RestoreChunk(rid, seq, payload)) is None
    outcome = await leader.propose_alone(
        c.RestoreCommit(rid, len(chunks), sum(n for _, n in chunks), chain.to_version))
    assert isinstance(outcome, RestoreOutcome), outcome
    await cl.converged()
    assert digests(cl) == {"n1": chain.digest, "n2": chain.digest, "n3": chain.digest}


async def test_a_follower_that_catches_up_by_snapshot_after_the_restore_keeps_its_versions(
        tmp_path: Path, chain: RestoreChain) -> None:
    """n3 is down during the whole restore and the writes after it; the leader's log is
    compacted past them, so n3 installs a snapshot taken after the commit: the version
    offset travels in it, and n3's next writes get the same versions as the others'."""
    cfg = dataclasses.replace(SMALL_CHUNKS, snapshot_every=4, keep_entries=0)
    cl = await empty_three(tmp_path, cfg)
    await cl.stop("n3")
    leader = await cl.wait_leader()
    await restore(leader, chain)
    commit_index = leader.state.applied_index
    assert leader.state.version_offset > 0

    async def compacted() -> bool:
        await retry(lambda: leader.propose(c.Enqueue("jobs", [c.EnqueueItem(b"after")])))
        return leader.storage.first_index() > commit_index + 1

    await eventually(compacted, 30, "the leader's log compacted past the restore")
    n3 = await cl.start("n3")
    await eventually(lambda: _true(n3.applied_index >= commit_index), 30, "n3 caught up")
    assert n3.storage.snapshot_meta().index > commit_index  # by a snapshot
    await retry(lambda: leader.propose(c.Enqueue("jobs", [c.EnqueueItem(b"later")])))
    await cl.converged()
    assert len({n.state.dump_state_bytes() for n in cl.nodes.values()}) == 1  # records, versions, offset
    assert n3.state.version_offset == leader.state.version_offset


async def _true(v: bool) -> bool:
    return v


async def test_a_non_empty_cluster_refuses_and_changes_nothing(tmp_path: Path, chain: RestoreChain) -> None:
    """Its own backup (RESTORE_TARGET_NOT_EMPTY) or another cluster's chain
    (RESTORE_CLUSTER_MISMATCH): refused before anything is proposed."""
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    await retry(lambda: leader.propose(c.CreateQueue("mine", "delayed", QueueSettings())))
    own = tmp_path / "own.bak"
    with open(own, "wb") as f:
        write_backup(leader.state, 0, f)
    await cl.converged()
    before = {nid: n.state.dump_state_bytes() for nid, n in cl.nodes.items()}
    last = leader.storage.last_index()
    with pytest.raises(FailedPrecondition) as e:
        await restore_online(leader, [io.BytesIO(own.read_bytes())], ["own.bak"])
    assert e.value.reason == "RESTORE_TARGET_NOT_EMPTY"
    with pytest.raises(FailedPrecondition) as e:
        await restore(leader, chain)
    assert e.value.reason == "RESTORE_CLUSTER_MISMATCH"
    assert leader.storage.last_index() == last  # refused before anything was proposed
    assert {nid: n.state.dump_state_bytes() for nid, n in cl.nodes.items()} == before


async def test_a_write_racing_the_restore_fails_its_commit_on_every_replica(
        tmp_path: Path, chain: RestoreChain) -> None:
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    # the restore's commit is proposed only after the write: on a loaded machine the
    # restore could otherwise finish between the poll that saw chunks staged and the write
    write_proposed = asyncio.Event()
    propose_alone = leader.propose_alone

    async def after_the_write(cmd: c.Command) -> object:
        await write_proposed.wait()
        return await propose_alone(cmd)

    leader.propose_alone = lambda cmd: (  # type: ignore[method-assign, assignment]
        asyncio.ensure_future(after_the_write(cmd)) if isinstance(cmd, c.RestoreCommit) else propose_alone(cmd))
    task = asyncio.create_task(restore(leader, chain))
    await eventually(lambda: _true(staged(leader)), 30, "chunks staged")
    write = leader.propose_nowait(c.CreateQueue("mine", "delayed", QueueSettings()))
    write_proposed.set()
    await write
    with pytest.raises(FailedPrecondition) as e:
        await task
    assert e.value.reason == "RESTORE_TARGET_NOT_EMPTY"
    await cl.converged()
    for n in cl.nodes.values():
        assert [q.name for q in n.state.list_queues()] == ["mine"] and not staged(n)
    assert len({n.state.dump_state_bytes() for n in cl.nodes.values()}) == 1


async def test_a_damaged_file_is_refused_before_anything_is_proposed(
        tmp_path: Path, chain: RestoreChain) -> None:
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    damaged = bytearray(chain.inc.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # inside a frame: only a full verify finds it
    last = leader.storage.last_index()
    with pytest.raises(InvalidArgument) as e:
        await restore_online(leader, [io.BytesIO(chain.full.read_bytes()), io.BytesIO(bytes(damaged))],
                             ["full.bak", "inc.bak"])
    assert e.value.reason.startswith("BACKUP_") and "inc.bak" in str(e.value)
    assert leader.storage.last_index() == last
    assert all(n.state.is_empty() and not staged(n) for n in cl.nodes.values())


async def test_losing_leadership_mid_restore_changes_nothing_and_a_retry_works(
        tmp_path: Path, chain: RestoreChain) -> None:
    cl = await empty_three(tmp_path, dataclasses.replace(SMALL_CHUNKS, restore_chunk_bytes=1024))
    old = await cl.wait_leader()
    task = asyncio.create_task(restore(old, chain))
    await eventually(lambda: _true(staged(old)), 30, "chunks staged")
    cl.net.isolate(old.node_id)
    with pytest.raises((NotLeader, OutcomeUnknown)):  # refused, or its chunk's fate unknown
        await task
    await cl.wait_leader(exclude=old.node_id)
    for n in cl.nodes.values():
        assert n.state.is_empty() and n.state.list_queues() == []
    cl.net.heal()

    async def again() -> RestoreResult:
        return await restore(await cl.wait_leader(), chain)

    res = await retry(again)
    assert res.to_version == chain.to_version
    await cl.converged()
    assert set(digests(cl).values()) == {chain.digest}
    assert not any(staged(n) for n in cl.nodes.values())



async def test_two_restores_at_once_restore_once(tmp_path: Path, chain: RestoreChain) -> None:
    """Two clients restore at once: the leader runs them one after the other (interleaved,
    their chunks would break each other's staging): one restores, the other is refused."""
    cl = await empty_three(tmp_path)
    leader = await cl.wait_leader()
    results = await asyncio.gather(restore(leader, chain), restore(leader, chain), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["FailedPrecondition", "RestoreResult"], results
    refused = next(r for r in results if isinstance(r, FailedPrecondition))
    assert refused.reason == "RESTORE_TARGET_NOT_EMPTY"
    await cl.converged()
    assert set(digests(cl).values()) == {chain.digest}
