"""RaftNode over an in-memory network: real LMDB per node, real asyncio, the real queue
machine. Every test also checks the Ready contract at each send (tests/node/raftnet.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from doq.errors import NotLeader, OutcomeUnknown
from doq.node import snapshot_keeper, stages
from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.raft.types import Ready
from tests.node.raftnet import FAST, Cluster, HoldsCommitAfterAnswer, addrs, eventually, retry

pytestmark = pytest.mark.timeout(180)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    """Stop every node a test started, also when it fails."""
    yield
    while _open:
        await _open.pop().close()


def new_cluster(root: Path, config: RaftNodeConfig = FAST, node_cls: type[RaftNode] = RaftNode) -> Cluster:
    cl = Cluster(root, config, node_cls)
    _open.append(cl)
    return cl


def enq(i: int) -> c.Enqueue:
    return c.Enqueue("q", [c.EnqueueItem(b"m%d" % i)])


async def create_queue(node: RaftNode) -> None:
    await retry(lambda: node.propose(c.CreateQueue("q", "delayed", QueueSettings())))


async def three(tmp_path: Path, config: RaftNodeConfig = FAST,
                node_cls: type[RaftNode] = RaftNode) -> Cluster:
    cl = new_cluster(tmp_path, config, node_cls)
    await cl.start("n1")
    await create_queue(await cl.wait_leader())
    await cl.grow("n2", "n3")
    return cl


async def test_one_node_bootstraps_serves_and_restarts_from_its_data(tmp_path: Path) -> None:
    cl = new_cluster(tmp_path)
    n1 = await cl.start("n1")
    assert await cl.wait_leader() is n1
    await create_queue(n1)
    res = await asyncio.gather(*(n1.propose(enq(i)) for i in range(50)))
    assert [r[0].id for r in res] == list(range(1, 51))  # type: ignore[index]
    await n1.read_barrier()
    st = n1.cluster_status()
    assert (st.role, st.leader_id, [m.node_id for m in st.members]) == ("leader", "n1", ["n1"])
    assert st.members[0].addrs == addrs("n1")
    digest, term = n1.state.snapshot_digest(), st.term
    await cl.stop("n1")
    n1 = await cl.start("n1")  # same data dir: restarts, not a new cluster
    await cl.wait_leader()
    assert n1.cluster_status().term > term
    await cl.converged()
    assert n1.state.get_queue("q").stats.total == 50
    assert n1.state.snapshot_digest() != "" and digest
    assert not cl.net.violations


async def test_three_nodes_replicate_with_identical_digests(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    assert sorted(m.node_id for m in leader.cluster_status().members if m.role == "voter") == ["n1", "n2", "n3"]
    futs = [leader.propose_nowait(enq(i)) for i in range(300)]  # one burst: group commit
    res = await asyncio.gather(*futs)
    assert len({r[0].id for r in res}) == 300  # type: ignore[index]
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    for n in cl.nodes.values():
        assert n.state.get_queue("q").stats.total == 300
        assert n.members == {nid: addrs(nid) for nid in ("n1", "n2", "n3")}  # addresses travelled
    assert not cl.net.violations, cl.net.violations[:5]


async def test_group_commit_puts_a_burst_into_few_entries(tmp_path: Path) -> None:
    cl = new_cluster(tmp_path)
    n1 = await cl.start("n1")
    await create_queue(await cl.wait_leader())
    before = n1.state.applied_index
    await asyncio.gather(*[n1.propose_nowait(enq(i)) for i in range(1000)])
    assert n1.state.applied_index - before <= 3  # 1000 commands, one entry per Ready


async def test_a_leader_replicates_its_entries_while_it_persists_them(tmp_path: Path) -> None:
    """Raft thesis 10.2.1: the leader's appends leave before its write makes their entries
    durable (the network sees entries past the sender's durable log), yet no commit index
    past its durable log is ever sent and every replica ends identical."""
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    before = cl.net.early_appends
    for i in range(30):
        await leader.propose(enq(i))
    assert cl.net.early_appends > before
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert not cl.net.violations, cl.net.violations[:5]


class HoldsCommitUntilAnswered(RaftNode):
    """Its writer, having handed the loop the answers of its own proposals (before its
    commit), waits until the test saw one of them answered: an answer that came only after
    the commit would find the commit done. Only once `holding` is set (a lone voter, while
    the cluster forms, answers before its commit too)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.answered = threading.Event()
        self.holding = False

    def _write(self, job: Any) -> None:
        early = job.answer
        if early is not None and self.holding:
            def answer(committed: Any, results: Any) -> None:
                mine = any(e.index in self._proposals.by_index for e in committed)
                early(committed, results)
                if mine:
                    self.answered.wait(60)
                    self.answered.clear()
            job.answer = answer
        super()._write(job)


async def test_a_leader_answers_once_applied_before_its_own_commit_and_only_what_a_quorum_holds(
        tmp_path: Path) -> None:
    """The leader answers a committed entry as soon as it has applied it, before the
    write that applies it commits (the readers' committed applied index is still behind
    then), but never before the entry is durable on a quorum: at each answer, a majority of
    the nodes' LMDB files hold the log up to the applied entry."""
    cl = await three(tmp_path, node_cls=HoldsCommitUntilAnswered)
    leader = await cl.wait_leader()
    assert isinstance(leader, HoldsCommitUntilAnswered)
    seen: list[tuple[bool, int]] = []  # (answered before the commit, nodes holding the entry)

    def at_answer(_fut: object) -> None:
        applied = leader.state.applied_index  # in memory: includes the answered entry
        durable = sum(cl.net.durable_last(nid) >= applied for nid in cl.nodes)
        seen.append((leader.applied_index < applied, durable))
        leader.answered.set()

    leader.holding = True
    for i in range(20):
        fut = leader.propose_nowait(enq(i))
        fut.add_done_callback(at_answer)
        await fut
    assert len(seen) == 20
    assert all(early for early, _ in seen), seen  # each answered before its apply committed
    assert all(durable >= 2 for _, durable in seen), seen  # on a majority of 3 at every answer
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert not cl.net.violations, cl.net.violations[:5]


async def test_a_lone_voter_answers_once_its_log_is_synced_and_direct_readers_wait_for_the_commit(
        tmp_path: Path) -> None:
    """One voter: an enqueue is answered once its entry is fdatasynced in the segment log
    and applied in memory, before the apply's LMDB commit; the direct readers of LMDB
    (`get_message`, `state_digest`, `iter_changes`) called after the answer wait for that
    commit and find the message. Fails if the answer waited for the commit, or if a
    reader read LMDB before it (MessageNotFound, an older digest)."""
    cl = new_cluster(tmp_path, node_cls=HoldsCommitAfterAnswer)
    n1 = await cl.start("n1")
    assert isinstance(n1, HoldsCommitAfterAnswer)
    await cl.wait_leader()
    await create_queue(n1)
    version_before, digest_before = n1.state.state_digest()
    n1.hold = True
    out = await n1.propose(enq(7))  # answered while its writer holds the commit
    assert n1.held.is_set()
    applied = n1.state.applied_index  # in memory: includes the answered entry
    assert n1.applied_index < applied  # the readers' committed index: the commit is held
    assert cl.net.durable_last("n1") >= applied  # the entry is durable in the segment log
    id_ = out[0].id  # type: ignore[index]
    seen: dict[str, object] = {}

    def read() -> None:
        try:
            seen["content"] = n1.state.get_message("q", id_).content
            seen["digest"] = n1.state.state_digest()
            seen["versions"] = {v for _, _, v in n1.state.iter_changes(version_before + 1)}
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            seen["error"] = e

    reader = threading.Thread(target=read)
    reader.start()
    await eventually(lambda: _async(n1.state.readers_waiting == 1), 30, "the reader waiting for the commit")
    n1.hold = False
    n1.release.set()
    await asyncio.to_thread(reader.join)
    assert "error" not in seen, seen
    assert seen["content"] == b"m7"
    version, digest = seen["digest"]  # type: ignore[misc]
    assert version >= applied and digest != digest_before
    assert applied in seen["versions"]  # type: ignore[operator]
    assert not cl.net.violations


class RecordsApplies(RaftNode):
    """Records, on the thread that commits them, the indexes each LMDB write applies; while
    `hold` is set its apply thread waits for `release` before a deferred apply."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.applied_order: list[int] = []
        self.deferred = 0
        self.hold = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def _apply_deferred(self, job: Any, t0: float) -> None:
        self.deferred += 1
        if self.hold:
            self.holding.set()
            self.release.wait(60)
        super()._apply_deferred(job, t0)

    def _commit_state(self, job: Any, *a: Any, **kw: Any) -> None:
        self.applied_order.extend(e.index for e in job.committed)
        super()._commit_state(job, *a, **kw)


async def test_the_loop_appends_past_a_held_apply_thread_and_every_apply_lands_once_in_log_order(
        tmp_path: Path) -> None:
    """A deferred apply (`RaftNode._defers_apply`) lets the loop append and commit the
    next entries while the apply thread is held; once it goes on, every entry is applied
    exactly once, in log order (the indexes the LMDB writes applied are contiguous), every
    proposal gets its own result (ids in proposal order), and the state survives a
    restart whole. Fails if the loop waited for the apply, or if an apply were lost,
    repeated or reordered."""
    cfg = dataclasses.replace(FAST, snapshot_every=0, apply_thread=True)  # no snapshot write: nothing drains
    cl = new_cluster(tmp_path, cfg, node_cls=RecordsApplies)
    n1 = await cl.start("n1")
    assert isinstance(n1, RecordsApplies)
    await cl.wait_leader()
    await create_queue(n1)
    n1.hold = True
    futs = [n1.propose_nowait(enq(0))]
    await asyncio.to_thread(n1.holding.wait, 60)  # the apply thread holds that entry's apply
    held_at = n1.state.applied_index
    core = n1.core
    assert core is not None
    for i in range(1, 40):
        futs.append(n1.propose_nowait(enq(i)))
        before = core.log.committed
        await eventually(lambda b=before: _async(core.log.committed > b), 30, "the next entry committed")
    assert n1.state.applied_index == held_at  # nothing applied meanwhile: all appended past it
    assert not any(f.done() for f in futs)
    n1.hold = False
    n1.release.set()
    results = await asyncio.gather(*futs)
    ids = [r[0].id for r in results]  # type: ignore[index]
    assert ids == list(range(ids[0], ids[0] + 40))
    order = n1.applied_order
    assert order == list(range(order[0], order[0] + len(order)))  # each index once, in order
    assert n1.deferred >= 40
    await n1.read_barrier()
    assert n1.state.get_queue("q").stats.total == 40
    await cl.stop("n1")
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await n1.read_barrier()
    assert n1.state.get_queue("q").stats.total == 40
    assert [n1.state.get_message("q", id_).content for id_ in ids] == [b"m%d" % i for i in range(40)]
    assert not cl.net.violations


class SendsBeforePersisting(RaftNode):
    """A planted bug: messages leave before the Ready is durable."""

    async def _handle_ready(self, core, rd: Ready) -> None:  # type: ignore[no-untyped-def]
        if rd.messages:
            self.transport.send(rd.messages)
            rd.messages = []
        await super()._handle_ready(core, rd)


async def test_contract_check_catches_sending_before_persisting(tmp_path: Path) -> None:
    cl = await three(tmp_path, node_cls=SendsBeforePersisting)
    leader = await cl.wait_leader()
    await asyncio.gather(*[leader.propose_nowait(enq(i)) for i in range(20)])
    assert cl.net.violations  # the check has teeth


async def test_follower_refuses_at_once_with_the_leader_hint(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    follower = next(n for n in cl.nodes.values() if n is not leader)
    await eventually(lambda: _async(follower.leader_hint == leader.node_id), 60, "hint")
    with pytest.raises(NotLeader) as ei:
        follower.propose_nowait(enq(0))
    assert ei.value.leader_hint == leader.node_id
    assert follower.leader_addrs() == addrs(leader.node_id)
    await follower.read_barrier()  # ReadIndex through the leader works on a follower


async def test_a_partitioned_leaders_proposals_fail_not_leader_once_replaced(tmp_path: Path) -> None:
    """The isolated leader's entries never reach a majority: when the partition heals, the
    new leader's entries replace them and their proposals fail NOT_LEADER (not applied)."""
    cl = await three(tmp_path, dataclasses.replace(FAST, admin_timeout_ms=600_000))
    old = await cl.wait_leader()
    await cl.converged()
    cl.net.isolate(old.node_id)
    futs = [old.propose_nowait(enq(i)) for i in range(10)]
    new = await cl.wait_leader(exclude=old.node_id)
    assert new is not old
    res = await retry(lambda: new.propose(enq(99)))
    assert res[0].id  # type: ignore[index]
    await eventually(lambda: _async(not old.is_leader), 30, "the old leader steps down")
    with pytest.raises(NotLeader):
        old.propose_nowait(enq(100))
    assert not any(f.done() for f in futs)  # their fate is not known on the old leader yet
    cl.net.heal()
    done, _ = await asyncio.wait(futs, timeout=60)
    assert len(done) == 10
    for f in futs:
        assert type(f.exception()) is NotLeader
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    # the isolated leader's entries were never committed: nobody has them
    assert all(n.state.get_queue("q").stats.total == 1 for n in cl.nodes.values())
    assert not cl.net.violations, cl.net.violations[:5]


async def test_a_deposed_leader_answers_its_proposals_that_the_next_leader_commits(tmp_path: Path) -> None:
    """A leader that hears nothing back (its appends reach the followers, their answers
    do not reach it) steps down with its proposals in the others' logs; the next leader
    commits them. The old leader, as a follower, answers them with their results — never
    NOT_LEADER for a command that was applied."""
    cl = await three(tmp_path, dataclasses.replace(FAST, admin_timeout_ms=600_000))
    old = await cl.wait_leader()
    await cl.converged()
    others = [n for n in cl.nodes if n != old.node_id]
    cl.net.blocked |= {(o, old.node_id) for o in others}  # the old leader is deaf
    futs = [old.propose_nowait(enq(i)) for i in range(10)]
    new = await cl.wait_leader(exclude=old.node_id)
    await retry(lambda: new.propose(enq(99)))  # commits the old term's entries before it
    total = new.state.get_queue("q").stats.total
    assert not any(f.done() for f in futs)
    cl.net.heal()
    results = await asyncio.wait_for(asyncio.gather(*futs), 60)
    ids = [r[0].id for r in results]  # type: ignore[index]
    assert len(set(ids)) == 10 and all(ids)
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert total == 11 == old.state.get_queue("q").stats.total
    assert not cl.net.violations, cl.net.violations[:5]


async def test_proposals_nobody_awaits_any_more_fail_without_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A stream that went away leaves its proposals behind; when the deposed leader fails
    them (their entries replaced), asyncio logs no "exception was never retrieved"."""
    cl = await three(tmp_path, dataclasses.replace(FAST, admin_timeout_ms=600_000))
    old = await cl.wait_leader()
    await cl.converged()
    cl.net.isolate(old.node_id)
    for i in range(5):
        old.propose_nowait(enq(i))  # nobody keeps the futures
    new = await cl.wait_leader(exclude=old.node_id)
    await retry(lambda: new.propose(enq(99)))
    await eventually(lambda: _async(not old.is_leader), 30, "the old leader steps down")
    cl.net.heal()
    await cl.converged()
    gc.collect()
    await asyncio.sleep(0)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_proposals_whose_fate_a_deposed_leader_does_not_learn_fail_outcome_unknown(tmp_path: Path) -> None:
    cl = await three(tmp_path, dataclasses.replace(FAST, admin_timeout_ms=300))
    old = await cl.wait_leader()
    await cl.converged()
    cl.net.isolate(old.node_id)
    futs = [old.propose_nowait(enq(i)) for i in range(3)]
    done, _ = await asyncio.wait(futs, timeout=60)  # check-quorum, then admin_timeout_ms
    assert len(done) == 3
    for f in futs:
        err = f.exception()
        assert type(err) is OutcomeUnknown and not err.retryable
        assert err.reason == "OUTCOME_UNKNOWN"


async def test_restarted_node_recovers_its_state_and_catches_up(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    await asyncio.gather(*[leader.propose_nowait(enq(i)) for i in range(50)])
    await cl.converged()
    victim = next(nid for nid in cl.nodes if nid != leader.node_id)
    hs, conf = cl.nodes[victim].storage.hard_state, cl.nodes[victim].core.conf_state()  # type: ignore[union-attr]
    await cl.stop(victim)
    await asyncio.gather(*[leader.propose_nowait(enq(i)) for i in range(50, 80)])
    node = await cl.start(victim)  # its own data: term, vote, log, conf state
    assert node.storage.hard_state.term >= hs.term and node.storage.hard_state.vote == hs.vote
    await cl.converged()
    assert node.core is not None and node.core.conf_state() == conf
    assert len(set(cl.digests().values())) == 1
    assert node.state.get_queue("q").stats.total == 80
    assert not cl.net.violations, cl.net.violations[:5]


async def test_node_behind_a_compacted_log_catches_up_by_snapshot(tmp_path: Path) -> None:
    cfg = RaftNodeConfig(tick_ms=25, election_tick=10, snapshot_every=20, keep_entries=5)
    cl = await three(tmp_path, cfg)
    leader = await cl.wait_leader()
    victim = next(nid for nid in cl.nodes if nid != leader.node_id)
    await cl.converged()
    await cl.stop(victim)
    for i in range(120):  # one entry each: the log is compacted several times
        await leader.propose(enq(i))
        if i % 10 == 0:
            await leader.propose(c.Dequeue("q", 1, ack=True))  # deletions: tombstones too

    async def compacted() -> bool:
        return leader.storage.first_index() > 60

    await eventually(compacted, 30, "leader log not compacted")
    node = await cl.start(victim)
    await cl.converged()
    assert node.storage.snapshot_meta().index > 60  # it got a snapshot, not entries
    assert len(set(cl.digests().values())) == 1
    assert node.members == leader.members
    assert not cl.net.violations, cl.net.violations[:5]


class RecordsWrites(RaftNode):
    """Records, per write txn that installs no leader snapshot: (first index before,
    after, the state's applied index before)."""

    def _write(self, job) -> None:  # type: ignore[no-untyped-def]
        first, applied = self.storage.first_index(), self.state.applied_index
        super()._write(job)
        if job.snapshot is None:
            self.__dict__.setdefault("writes", []).append(
                (first, self.storage.first_index(), applied))


COMPACT = RaftNodeConfig(tick_ms=25, election_tick=10, snapshot_every=20, keep_entries=5,
                         compact_entries_per_write=3)


async def test_compaction_discards_few_applied_entries_per_write_and_builds_no_snapshot_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic snapshot is a meta only: the log is compacted at most
    `compact_entries_per_write` entries per write, never an entry not yet applied, and no
    snapshot data is built until a follower needs one (then once, on demand: the follower
    catches up by it to an identical state)."""
    builds: list[int] = []
    build = snapshot_keeper.write_state_snapshot

    def counting(read, members, node_id):  # type: ignore[no-untyped-def]
        builds.append(read.applied_index)
        return build(read, members, node_id)

    monkeypatch.setattr(snapshot_keeper, "write_state_snapshot", counting)
    cl = await three(tmp_path, COMPACT, RecordsWrites)
    leader = await cl.wait_leader()
    builds.clear()  # the joiners' snapshots
    for i in range(100):  # one entry each: a snapshot meta every 20
        await leader.propose(enq(i))
    await cl.converged()
    for n in cl.nodes.values():
        writes = n.__dict__["writes"]
        assert n.storage.first_index() > 60, n.node_id  # compacted
        assert n.storage.snapshot_meta().index - n.storage.first_index() < 5 + 20 + 3 * 2
        assert max(after - before for before, after, _ in writes) == 3  # bounded, and it ran
        assert [w for w in writes if w[1] > w[0] and w[1] - 1 > w[2]] == []  # applied ones only
    assert builds == []  # nobody needed snapshot data
    victim = next(nid for nid in cl.nodes if nid != leader.node_id)
    await cl.stop(victim)
    for i in range(100, 160):
        await leader.propose(enq(i))
    await eventually(lambda: _async(leader.storage.first_index() > 140), 30, "compaction")
    node = await cl.start(victim)
    await cl.converged()
    assert len(builds) == 1 and node.storage.snapshot_meta().index == builds[0] >= 140
    assert len(set(cl.digests().values())) == 1
    assert not cl.net.violations, cl.net.violations[:5]


async def _follower_behind_compacted_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> tuple[Cluster, RaftNode, str, list[int], threading.Event]:
    """A three-node cluster whose stopped follower is behind the leader's compacted log.
    From then on every snapshot data build records its index in `builds` and waits for
    `go` (a large state: the build outlasts many writes)."""
    builds: list[int] = []
    go = threading.Event()
    build = snapshot_keeper.write_state_snapshot

    def slow(read, members, node_id):  # type: ignore[no-untyped-def]
        builds.append(read.applied_index)
        go.wait(60)
        return build(read, members, node_id)

    cl = await three(tmp_path, COMPACT)
    leader = await cl.wait_leader()
    await cl.converged()
    monkeypatch.setattr(snapshot_keeper, "write_state_snapshot", slow)  # after the joins
    await eventually(lambda: _async(leader.storage.compaction_hold is None), 30, "joins' data dropped")
    victim = next(nid for nid in cl.nodes if nid != leader.node_id)
    await cl.stop(victim)
    for i in range(60):
        await leader.propose(enq(i))
    await eventually(lambda: _async(leader.storage.first_index() > 40), 30, "compaction")
    return cl, leader, victim, builds, go


async def test_slow_snapshot_data_holds_compaction_until_the_follower_caught_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While snapshot data is being built (slowly) the leader keeps committing, but its
    log is not compacted past the data's index: the data is still usable when done, sent
    once, and the follower catches up to an identical state. Once no follower needs it,
    the data is dropped and compaction goes on."""
    cl, leader, victim, builds, go = await _follower_behind_compacted_log(tmp_path, monkeypatch)
    start = asyncio.ensure_future(cl.start(victim))
    try:
        await eventually(lambda: _async(bool(builds)), 30, "snapshot data build started")
        held = builds[0]
        for i in range(60, 160):  # many snapshot metas and writes while the build runs
            await leader.propose(enq(i))
        assert leader.storage.snapshot_meta().index > held + 5 + 3
        assert leader.storage.first_index() - 1 <= held  # not compacted past the data
    finally:
        go.set()
        node = await start
    await cl.converged()
    assert builds == [held]  # built once: the data was still usable
    assert node.storage.snapshot_meta().index >= held  # installed it (then its own metas)
    assert len(set(cl.digests().values())) == 1
    # caught up: the data is dropped and compaction passes its index
    await eventually(lambda: _async(leader.storage.compaction_hold is None), 30, "data dropped")
    for i in range(160, 170):
        await leader.propose(enq(i))
    assert leader.storage.first_index() - 1 > held
    assert builds == [held]
    assert not cl.net.violations, cl.net.violations[:5]


async def test_snapshot_data_for_a_follower_that_went_away_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower that stops while its snapshot data is being built holds neither the
    data in memory nor the log's compaction once the data is done."""
    cl, leader, victim, builds, go = await _follower_behind_compacted_log(tmp_path, monkeypatch)
    try:
        await cl.start(victim)
        await eventually(lambda: _async(bool(builds)), 30, "snapshot data build started")
        await cl.stop(victim)
    finally:
        go.set()
    held = builds[0]

    async def compacted_past() -> bool:
        await leader.propose(enq(0))
        return leader.storage.first_index() - 1 > held

    await eventually(compacted_past, 30, "compaction past the dropped data")
    assert leader.storage.compaction_hold is None and builds == [held]


async def test_a_node_stopped_midway_through_a_compaction_restarts_and_finishes_it(
        tmp_path: Path) -> None:
    cl = new_cluster(tmp_path, COMPACT)
    n1 = await cl.start("n1")
    await create_queue(await cl.wait_leader())
    i = 0

    def midway() -> bool:
        st = n1.storage
        return st.first_index() - 1 < st.snapshot_meta().index - COMPACT.keep_entries

    while not midway() or n1.storage.snapshot_meta().index < 40:
        await n1.propose(enq(i))
        i += 1
    first, snap = n1.storage.first_index(), n1.storage.snapshot_meta()
    await cl.crash("n1")  # between two write txns: the compaction is half done on disk
    n1 = await cl.start("n1")
    assert n1.storage.snapshot_meta() == snap
    assert first <= n1.storage.first_index() <= snap.index - COMPACT.keep_entries + 1
    await cl.wait_leader()
    assert n1.state.get_queue("q").stats.total == i
    for j in range(i, i + 10):  # the next writes carry on
        await n1.propose(enq(j))
    assert n1.storage.first_index() - 1 >= snap.index - COMPACT.keep_entries
    assert n1.state.get_queue("q").stats.total == i + 10


async def test_transfer_leadership_and_remove_a_member(tmp_path: Path) -> None:
    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    new_id = await retry(lambda: leader.transfer_leader())
    assert new_id != leader.node_id
    new = cl.nodes[new_id]
    await eventually(lambda: _async(new.is_leader), 60, "target leads")
    gone = leader.node_id
    await retry(lambda: new.remove_member(gone))
    assert sorted(m.node_id for m in new.cluster_status().members) == sorted(set(cl.nodes) - {gone})
    assert gone not in new.members
    await cl.stop(gone)
    await retry(lambda: new.propose(enq(1)))  # two voters left: still a quorum
    await cl.converged()
    assert len(set(cl.digests().values())) == 1


async def _async(v: bool) -> bool:
    return v


async def test_a_new_leader_never_stamps_a_time_before_one_already_applied(tmp_path: Path) -> None:
    """n2's wall clock is an hour behind; once it leads, its entries still carry a time
    >= the last applied one (replicated time never goes back)."""
    import time as _time

    from doq.queues.codec import decode_batch

    cl = new_cluster(tmp_path)
    real = lambda: _time.time_ns() // 1_000_000  # noqa: E731
    n1 = await cl.start("n1")
    n1._clock_ms = real
    await create_queue(await cl.wait_leader())
    await cl.grow("n2")
    n2 = cl.nodes["n2"]
    n2._clock_ms = lambda: real() - 3_600_000
    await retry(lambda: n1.propose(enq(0)))
    await retry(lambda: n1.transfer_leader("n2"))
    await retry(lambda: n2.propose(enq(1)))
    await cl.converged()
    st = n1.storage  # the whole log (n2 joined by a snapshot at the applied index of then)
    stamps = [decode_batch(e.data).now_ms for e in st.entries(st.first_index(), st.last_index() + 1, 1 << 30)
              if e.data and e.type == 0]
    assert len(stamps) >= 3 and stamps == sorted(stamps), stamps


async def test_single_node_data_becomes_a_raft_cluster_and_replicates(tmp_path: Path) -> None:
    """A data dir written without Raft (LocalNode, offline restore) bootstraps at its applied
    index; a node added later receives that state by snapshot."""
    from doq.storage.env import open_env
    from doq.storage.state import StateStore
    from tests.support.local_node import LocalNode

    env = open_env(tmp_path / "n1", map_size=1 << 30)
    local = LocalNode(StateStore(env))
    await local.start()
    await local.propose(c.CreateQueue("q", "delayed", QueueSettings()))
    for i in range(5):
        await local.propose(enq(i))
    await local.stop()
    env.close()
    cl = new_cluster(tmp_path)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    assert n1.state.get_queue("q").stats.total == 5
    res = await retry(lambda: n1.propose(enq(5)))
    assert res[0].id == 6  # type: ignore[index]
    await cl.grow("n2")
    await cl.converged()
    assert len(set(cl.digests().values())) == 1
    assert cl.nodes["n2"].state.get_queue("q").stats.total == 6


async def test_open_raft_node_bootstraps_joins_and_restarts_without_joining_again(tmp_path: Path) -> None:
    from doq.node.build import open_raft_node
    from doq.node.cluster import ClusterStatus, MemberAddrs
    from doq.storage.env import open_env
    from doq.storage.state import StateStore

    cl = new_cluster(tmp_path)
    loop = asyncio.get_running_loop()
    calls: list[tuple[list[str], str]] = []

    def join_cluster(join_addrs: Sequence[str], node_id: str, a: MemberAddrs, *, empty: bool,
                     cluster_id: str) -> ClusterStatus:
        """What the HTTP join does, from a thread: ask the leader to add the node."""
        calls.append((list(join_addrs), node_id))
        leader = cl.leader()
        assert leader is not None
        return asyncio.run_coroutine_threadsafe(
            leader.add_member(node_id, a, empty=empty, cluster_id=cluster_id), loop).result(30)

    async def open_node(nid: str, join: tuple[str, ...]) -> RaftNode:
        env = open_env(tmp_path / nid, map_size=1 << 30)
        cl.net.envs[nid] = env
        node = await open_raft_node(StateStore(env), node_id=nid, addrs=addrs(nid),
                                    transport=cl.net.factory(nid), join_addrs=join,
                                    join_cluster=join_cluster, config=FAST)
        await node.start()
        cl.nodes[nid] = node
        return node

    await open_node("n1", ())
    await create_queue(await cl.wait_leader())
    n2 = await open_node("n2", ("http-n1:3",))
    assert calls == [(["http-n1:3"], "n2")]
    await cl.converged()
    assert n2.state.get_queue("q").name == "q" and n2.members == {"n1": addrs("n1"), "n2": addrs("n2")}
    assert n2.members["n2"].store_id == n2.identity.store_id != cl.nodes["n1"].identity.store_id != ""
    await cl.stop("n2")
    await open_node("n2", ("http-n1:3",))  # its own data: no second join
    assert len(calls) == 1
    await cl.converged()
    assert len(set(cl.digests().values())) == 1


async def test_a_stopping_leader_hands_over_leadership_first(tmp_path: Path) -> None:
    # the hand-over is bounded by 3 election timeouts (then the node stops anyway): a long
    # election timeout (10 s: the bound is 30 s) gives a loaded machine the time to catch
    # the target up; the hand-over itself does not wait for it, and no election is waited
    # for here (n1 bootstraps alone, the others join)
    cl = await three(tmp_path, dataclasses.replace(FAST, election_tick=400))
    old = await cl.wait_leader()
    await cl.converged()
    term = old.cluster_status().term
    pending = [old.propose_nowait(enq(i)) for i in range(20)]
    await cl.stop(old.node_id)
    # the target leads in its core already; its node takes the role up after the write of
    # that Ready (old may hear of it first). One term more: the transfer's campaign, no
    # election after a timeout
    new = await cl.wait_leader()
    assert new.node_id != old.node_id and new.cluster_status().term == term + 1
    for f in pending:  # each resolved: applied, or one retryable error
        assert f.done() and (f.exception() is None or f.exception().retryable)  # type: ignore[union-attr]
    await retry(lambda: new.propose(enq(99)))


def test_raft_node_implements_the_node_and_cluster_protocols(tmp_path: Path) -> None:
    from doq.node.base import Node
    from doq.node.cluster import ClusterAdmin

    for proto in (Node, ClusterAdmin):
        members = {m for m in vars(proto) if not m.startswith("_")} | set(proto.__annotations__)
        missing = [m for m in members if not hasattr(RaftNode, m) and m not in ("state", "node_id")]
        assert missing == [], proto


async def test_restarted_members_reach_each_other_without_a_snapshot_of_the_full_membership(tmp_path: Path) -> None:
    """Regression: a member restarting from a snapshot older than the conf changes (here
    the bootstrap one: n1 alone) must still point its transport at every member whose
    address it knows, or two restarted followers could never elect a leader."""
    cl = await three(tmp_path)  # FAST takes no snapshot (snapshot_every=10_000)
    leader = await cl.wait_leader()
    others = [nid for nid in cl.nodes if nid != leader.node_id]
    for nid in others:
        assert cl.nodes[nid].storage.snapshot_meta().conf_state.voters != ("n1", "n2", "n3")
        await cl.stop(nid)
        await cl.start(nid)
    await cl.converged()
    await cl.stop(leader.node_id, transfer_leadership=False)
    new = await cl.wait_leader(timeout_s=30)
    assert new.node_id in others


async def test_the_service_runs_unchanged_on_a_raft_node_lease_expiry_replicates(tmp_path: Path) -> None:
    """QueueService over the leader: a long poll wakes on a replicated enqueue; an expired
    lease comes back through the leader's Tick, on every replica."""
    from doq.service.api import QueueService

    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    api = QueueService(leader)
    poll = asyncio.create_task(api.dequeue("q", wait_ms=60_000, visibility_timeout_ms=2000))
    await asyncio.sleep(0.05)
    await api.enqueue("q", c.EnqueueItem(b"hello"))
    got = await asyncio.wait_for(poll, 60)
    assert [m.content for m in got] == [b"hello"]

    async def redelivered() -> bool:  # the lease expired: replicated time moved via a Tick
        return all(n.state.get_queue("q").stats.ready == 1 for n in cl.nodes.values())

    await eventually(redelivered, 60, "lease did not expire on every replica")
    again = await api.dequeue("q", visibility_timeout_ms=60_000)
    assert [(m.id, m.attempts) for m in again] == [(got[0].id, 2)]
    await cl.converged()
    assert len(set(cl.digests().values())) == 1


async def test_add_member_is_idempotent_and_refuses_other_addresses(tmp_path: Path) -> None:
    from doq.errors import FailedPrecondition
    from doq.node.cluster import MemberAddrs

    cl = await three(tmp_path)
    leader = await cl.wait_leader()
    st = await leader.add_member("n2", addrs("n2"))  # same addresses: nothing to do
    assert [m.node_id for m in st.members] == ["n1", "n2", "n3"]
    with pytest.raises(FailedPrecondition):
        await leader.add_member("n2", MemberAddrs("elsewhere:1", "x:2", "y:3"))
    follower = next(n for n in cl.nodes.values() if n is not leader)
    with pytest.raises(NotLeader):
        await follower.add_member("n4", addrs("n4"))


async def test_a_restarted_bootstrap_node_does_not_wait_to_lead_alone(tmp_path: Path) -> None:
    """Regression: n1's only snapshot is the bootstrap one (n1 alone). On restart its core
    rightly refuses to campaign until the later conf changes are applied again, so start()
    must not wait `admin_timeout_ms` for a leadership it never sought."""
    slow_admin = dataclasses.replace(FAST, admin_timeout_ms=60_000)
    cl = await three(tmp_path, slow_admin)
    leader = await cl.wait_leader()
    if leader.node_id == "n1":
        await leader.transfer_leader("n2")
        await cl.wait_leader(timeout_s=30)
    assert cl.nodes["n1"].storage.snapshot_meta().conf_state.voters == ("n1",)
    await cl.stop("n1")
    node = await asyncio.wait_for(cl.start("n1"), 20)  # was: 60 s in _lead_if_alone
    await cl.converged()

    async def rejoined() -> bool:
        # not at once: the state's applied index (read from disk) already equals the commit
        # index, so converged() may hold before the first Ready re-applies the conf changes
        return node.core is not None and node.core.voters == ("n1", "n2", "n3")

    await eventually(rejoined, 60, "n1's core did not learn its peers again")


class CountsWrites(RaftNode):
    """Counts its durable writes and what its commit metrics hook observes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0
        self.observed: list[tuple[float, float]] = []  # (commit_s, fsync_s) per durable write
        self.applied: list[int] = []  # commands per applied batch
        self._on_commit = lambda commit_s, fsync_s: self.observed.append((commit_s, fsync_s))
        self._on_applied = self.applied.append

    def _write(self, job: Any) -> None:
        super()._write(job)
        self.writes += 1


async def test_the_commit_metrics_observe_every_durable_write(tmp_path: Path) -> None:
    """A follower's (and a leader's) writes that only append entries are fsynced commits
    too: `doq_commit_seconds` / `doq_fsync_seconds` observe each write, and the commands
    counted are those applied."""
    cl = await three(tmp_path, node_cls=CountsWrites)
    leader = await cl.wait_leader()
    assert isinstance(leader, CountsWrites)
    for i in range(20):
        await leader.propose(enq(i))
        # counted before the answer leaves (which is before the LMDB commit): who hears it sees it
        assert sum(leader.applied) >= i + 1
    await cl.converged()
    nodes = [n for n in cl.nodes.values() if isinstance(n, CountsWrites)]
    assert len(nodes) == 3

    async def all_observed() -> bool:
        # the commit hook runs after a write's LMDB commit, which the answers and the
        # readers' view precede (and before `writes` counts it): wait for the last writes
        return all(len(n.observed) == n.writes for n in nodes)

    await eventually(all_observed, 30, "the commit hook did not observe every write")
    for n in nodes:  # (every write observed: `all_observed`)
        assert n.writes > 0, n.node_id
        assert len(n.applied) < n.writes, n.node_id  # some appended (or voted) without applying
    assert sum(leader.applied) >= 20
    # a leader's write that only appends has no LMDB commit: no fsync time to observe
    # (not a zero), its apply's write has one
    assert any(f is None for _, f in leader.observed), leader.observed
    assert any(f is not None and f > 0 for _, f in leader.observed), leader.observed


def test_observe_commit_counts_an_fsync_only_for_a_write_with_an_lmdb_commit() -> None:
    from doq.service import metrics

    def count(h: Any) -> float:
        return next(x.value for x in h.collect()[0].samples if x.name.endswith("_count"))

    def counts() -> tuple[float, float]:
        return count(metrics.COMMIT_SECONDS), count(metrics.FSYNC_SECONDS)

    commits, fsyncs = counts()
    metrics.observe_commit(0.002, None)
    assert counts() == (commits + 1, fsyncs)
    metrics.observe_commit(0.002, 0.001)
    assert counts() == (commits + 2, fsyncs + 1)




class _StageRecorder:
    """A `doq.node.stages` observer that records the calls it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def frame_received(self, contents: Sequence[bytes]) -> None:
        self.calls.append(("frame_received", list(contents)))

    def proposed(self, commands: Sequence[object]) -> None:
        self.calls.append(("proposed", list(commands)))

    def write_started(self, write_id: int, commands: Sequence[object]) -> None:
        self.calls.append(("write_started", (write_id, list(commands))))

    def write_ended(self, write_id: int, notes: Sequence[str]) -> None:
        self.calls.append(("write_ended", (write_id, list(notes))))

    def back_on_loop(self, write_id: int) -> None:
        self.calls.append(("back_on_loop", (write_id, None)))

    def resolved(self, results: Sequence[Sequence[object]]) -> None:
        self.calls.append(("resolved", [list(r) for r in results]))

    def frame_built(self, messages: Sequence[object]) -> None:
        self.calls.append(("frame_built", list(messages)))


async def test_the_stage_hook_sees_a_proposal_through_its_write_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`doq.node.stages.observer` (the supported hook bench/e2e_stages.py uses instead of
    wrapping the driver's private methods) sees one proposal taken, the write that applies
    exactly it end and the loop come back after it, and its result handed out once that
    write started (a lone voter answers before the write's LMDB commit)."""
    cl = new_cluster(tmp_path)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await create_queue(n1)
    rec = _StageRecorder()
    monkeypatch.setattr(stages, "observer", rec)
    cmd = enq(1)
    res = await n1.propose(cmd)  # answered once applied, maybe before its write ends
    await n1.read_barrier()  # served after a later Ready: the write that applied it ended
    monkeypatch.setattr(stages, "observer", None)
    proposed = [i for i, (n, v) in enumerate(rec.calls) if n == "proposed" and v == [cmd]]
    started = [i for i, (n, v) in enumerate(rec.calls) if n == "write_started" and v[1] == [cmd]]
    assert len(proposed) == 1 and len(started) == 1 and proposed[0] < started[0]
    write_id = rec.calls[started[0]][1][0]
    after = [n for n, v in rec.calls[started[0]:]
             if n in ("write_ended", "back_on_loop") and v[0] == write_id]
    assert after == ["write_ended", "back_on_loop"]
    resolved_at = [i for i, (n, v) in enumerate(rec.calls) if n == "resolved" and [res] in v]
    assert resolved_at and resolved_at[0] > started[0]
