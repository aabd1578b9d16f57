"""`RaftNode`: the asyncio driver of the pure `RaftCore` over LMDB and a peer transport.

Implements `doq.node.base.Node` (the service does not change) and
`doq.node.cluster.ClusterAdmin`. The design (threads, order of persist / send / apply,
leadership loss) is in docs/raft.md, "The node driver"; in short:

- One task (`_run`) owns the core. Inbound messages, ticks, proposals and admin requests
  only queue work and wake it (messages and ticks in arrival order); the task feeds them
  to the core between two Readies, so the core and the log storage are never used while
  the writer thread works (the loop only reads the core's term, role, leader and peers'
  progress then, to answer the leader's heartbeats on a follower and to send heartbeats
  on a leader: a long write must not look like a dead node).
- Group commit: every proposal queued since the last Ready becomes ONE log entry (a
  `CommandBatch` stamped with the leader's `now_ms`), so one Ready, one write txn, one
  fsync and one AppendEntries per peer carry them all.
- Per Ready: install a snapshot (one durable LMDB commit, then the segment log reset
  after it), append the entries to the segment log with ONE fdatasync
  (`doq.node.wal_log`), then the Ready's messages may leave (`_send_after_log`), then in
  ONE LMDB write txn set the hard state and apply the committed entries (and the member
  addresses of conf changes), its meta page synced only when `_must_be_durable` (no txn
  when the Ready has nothing for LMDB: a leader's Ready that only appends). The
  log is the writer thread's; every LMDB write txn runs on the apply thread. With
  `apply_thread`, a Ready that needs only the fdatasync before the next (`_defers_apply`)
  leaves its LMDB part to the apply thread and the loop goes on; any other waits for those (`_drain_applies`)
  and is written whole. Answers leave once applied in memory (`_answer_early`). A
  leader's appends and heartbeats leave before the write (`write_overlap.split_early`);
  after it: conf changes applied to the core, the proposers' futures resolved with the
  machine's results, reads served, `advance`.
- A proposal resolves when its entry is applied with the term it was proposed in;
  otherwise (another leader's entry won that index, a snapshot covered it, leadership was
  lost, the node stops) it fails with `NotLeader` + the leader hint: it never hangs.

This module is the loop and the `Node` surface; each other concern is a module of its own
that the loop calls between two Readies (or, for `log_start`, before the first):

- `doq.node.membership`: membership and leadership changes (`ClusterAdmin`'s mutations),
  an orchestration over the driver primitives `check_serving`, `run_on_core`,
  `add_proposal` and `wait_leader_change`;
- `doq.node.snapshot_keeper`: this node's snapshot metas and the snapshot data a
  follower behind the compacted log needs;
- `doq.node.read_index`: the linearizable reads in flight (`read_barrier`);
- `doq.node.storage_admission`: the storage alarms and the proposals they refuse;
- `doq.node.write_overlap`: what may be sent while the writer persists a Ready;
- `doq.node.log_start`: bootstrap, rebase and a joiner's first write.

An online restore is not the node's business: `doq.backup.online` orchestrates it over
`propose_alone` (a command alone in its entry), the one primitive it needs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import lmdb
from prometheus_client import Counter

from doq.errors import (
    DoqError,
    NotLeader,
    Overloaded,
    Unavailable,
)
from doq.node import late_dequeues, log_start, peer_door, stages, store_identity, write_overlap
from doq.node.alarms import Alarm, StorageGauge
from doq.node.base import ProposalFuture
from doq.node.cluster import ClusterStatus, Member, MemberAddrs, NodeIdentity, StorageUsage
from doq.node.membership import Membership, promote_caught_up_learner
from doq.node.proposal_book import ProposalBook
from doq.node.proposals import (
    MAX_PENDING_COMMANDS,
    Proposal,
    fail_future,
    ignore_result,
    take_count,
    wall_clock_ms,
)
from doq.node.raft_meta import decode_addrs
from doq.node.raft_snapshot import install_snapshot_data
from doq.node.rate_log import RateLimitedLog
from doq.node.read_index import ReadIndexWaits
from doq.node.snapshot_keeper import SnapshotKeeper
from doq.node.storage_admission import StorageAdmission, compact_floor
from doq.node.transport_base import OnMessages, PeerFrame, RaftTransport
from doq.node.wal_log import WalLogStorage
from doq.node.writer import WriterThread
from doq.queues.codec import encode_batch
from doq.queues.commands import (
    Command,
    CommandBatch,
    Tick,
)
from doq.raft import codec
from doq.raft.config import RaftConfig
from doq.raft.core import RaftCore
from doq.raft.types import (
    NONE,
    ConfChangeType,
    Entry,
    EntryType,
    HardState,
    Message,
    ProposalDropped,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from doq.raft.types import NotLeader as CoreNotLeader
from doq.storage.chunks import DEFAULT_CHUNK_BYTES
from doq.storage.mapped import release_mapped_pages
from doq.storage.state import StateStore

log = logging.getLogger(__name__)
REFUSED = Counter("doq_raft_messages_refused_total",
                  "Raft messages dropped at the peer door before the core (doq/node/peer_door.py)", ["reason"])
_REFUSED = {r: REFUSED.labels(r.value) for r in peer_door.Refusal}
Fut = asyncio.Future[object]
TransportFactory = Callable[[OnMessages], RaftTransport]


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RaftNodeConfig:
    """Tunables of the driver (times in ms, counts in log entries)."""

    tick_ms: int = 100
    election_tick: int = 10  # election timeout: 10..20 ticks
    heartbeat_tick: int = 1
    snapshot_every: int = 10_000  # applied entries between two snapshots (0: never)
    keep_entries: int = 5_000  # entries kept behind a snapshot for slow followers
    compact_entries_per_write: int = 64  # log entries discarded per write txn, at most
    read_timeout_ms: int = 5_000  # ReadIndex not served by then -> Unavailable
    admin_timeout_ms: int = 10_000  # membership change / transfer not applied by then
    max_inflight_msgs: int = 256
    # False (the lazy commit, the default): the commit index rides the next append or
    # heartbeat (RaftConfig.broadcast_commit): a follower applies it with its next
    # entries, not in a write of its own (one durable write per call on a follower
    # instead of two; measured faster one call at a time). A conf change's commit is
    # sent at once all the same, and a transfer target gets TimeoutNow again with its
    # heartbeat answers (docs/raft.md, "Membership changes under the lazy commit").
    broadcast_commit: bool = False
    max_msg_bytes: int = 4 << 20
    max_committed_bytes: int = 4 << 20  # committed entries' data applied per Ready (at least one)
    snapshot_chunk_bytes: int = 1 << 20
    restore_chunk_bytes: int = DEFAULT_CHUNK_BYTES  # records per RestoreChunk entry (uncompressed)
    compact_entries_under_alarm: int = 4096  # log entries discarded per write under a storage alarm
    nospace_retry_max_ms: int = 2_000  # a write that failed for want of space: longest wait between tries
    # True: a Ready that needs nothing but the log's fdatasync before its messages and
    # the next Ready hands its LMDB part (hard state, apply, answers) to the apply
    # thread, and the loop goes on to the next Ready at once (`RaftNode._defers_apply`).
    # Off by default (`--apply-thread`): measured slower end to end at 1k msg/s on 1 and
    # 3 nodes, though faster one call at a time at p50 (docs/benchmarks.md, apply8)
    apply_thread: bool = False
    # The batched commit (apply thread off): a write whose LMDB part need not be durable
    # leaves its transaction open, held, and the next writes continue it; it commits at
    # most `hold_commit_ms` after it began, once it holds `hold_commit_entries` applied
    # entries or `hold_commit_bytes` of their data, and at once when something needs LMDB
    # to hold it (a durable write, a direct reader, snapshot data, a stop). 0: every
    # write commits (docs/raft.md, "The batched commit"; docs/benchmarks.md, lat11)
    hold_commit_ms: int = 100
    hold_commit_entries: int = 1_000
    hold_commit_bytes: int = 4 << 20


@dataclass(slots=True)
class _Job:
    """What the writer thread does for one Ready."""

    snapshot: Snapshot | None
    entries: list[Entry]
    hard_state: HardState | None
    committed: list[Entry]
    own_snapshot: SnapshotMeta | None  # this node's new snapshot (meta only) to record
    results: list[list[object]] = field(default_factory=list)
    members: dict[str, MemberAddrs] | None = None
    compacted: int = 0  # log entries this write discarded
    admitted: bool = False  # this write holds this store's admission: it may vote from now on
    cluster_id_changed: bool = False  # a snapshot or an online restore replaced the state's
    compact_floor: int | None = None  # under log pressure: compact up to here (else keep_entries)
    durable_committed: int = 0  # how many of `committed` are answered before the commit (`_answer_early`)
    answer: Callable[[list[Entry], list[list[object]]], None] | None = None  # see `_answer_early`
    must_sync: bool = True  # the core's `Ready.must_sync` (see `_must_be_durable`)
    after_log: Callable[[], None] | None = None  # sends the Ready's messages (see `_send_after_log`)
    sent_after_log: bool = False
    deferred: bool = False  # the LMDB part runs on the apply thread, after the loop moved on
    apply_posted: bool = False
    on_applied: Callable[[], None] | None = None  # deferred: the loop's part once applied
    flush: bool = False  # no Ready: commit the held write (and apply again what a failed one lost)
    refill: list[Entry] = field(default_factory=list)  # entries applied again first (`_refill`)


class RaftNode:
    """A member of a Raft cluster. Implements `Node` and `ClusterAdmin` (see the module doc).

    `join=False` and no data: bootstrap a one-node cluster (this node its only voter).
    `join=True` and no data: wait, empty, to be added by the leader (`peers` are the
    members the join answer listed, so this node can answer the leader at once); such a
    store takes no part in elections until its admission is in its log
    (`doq.node.store_identity`, "voting_gated").
    With data, the node restarts from it either way.
    `join_cluster_id`: the cluster id the join answer named; until the node has caught up,
    its peer door takes only that cluster's frames (it is remembered across restarts).
    """

    def __init__(
        self,
        state: StateStore,
        *,
        node_id: str,
        addrs: MemberAddrs,
        transport: TransportFactory,
        config: RaftNodeConfig | None = None,
        join: bool = False,
        peers: dict[str, MemberAddrs] | None = None,
        join_cluster_id: str = "",
        clock_ms: Callable[[], int] = wall_clock_ms,
        seed: int | None = None,
        on_applied: Callable[[int], None] | None = None,
        on_commit: Callable[[float, float | None], None] | None = None,
        gauge: StorageGauge | None = None,
    ) -> None:
        self.env = state.env  # the node's one environment: the Raft log lives beside the state
        self.state = state
        self.node_id = node_id
        self.addrs = addrs
        self.cfg = config or RaftNodeConfig()
        self._join = join
        self._join_cluster_id = join_cluster_id
        self._peers = dict(peers or {})
        self._clock_ms = clock_ms
        self._rng = random.Random(seed)
        self._on_applied = on_applied  # (commands) once a write's batch is applied, before its answers
        self._on_commit = on_commit  # (commit_seconds, fsync_seconds or None: no LMDB commit) after each durable write
        self.storage = WalLogStorage(self.env)  # the entries in segment files beside the state
        self.transport = transport(self._on_messages)
        self.core: RaftCore | None = None
        self._writer = WriterThread("doq-raft-writer")  # the segment log (and, in a slow Ready, all of it)
        # every LMDB write transaction and every change of the state machine's memory,
        # in log order (`_defers_apply`); the writer hands it a Ready's LMDB part
        self._applier = WriterThread("doq-raft-apply")
        self._apply_error: BaseException | None = None  # a deferred apply failed: the node fails
        # deferred applies not committed, in log order: the first failed for want of space
        # and the loop retries them (`_replay_stalled`); only the apply thread changes it
        self._stalled: list[tuple[_Job, float]] = []
        # the batched commit (`_holds`): the apply thread's count of what the held write
        # applied, the highest index applied in memory (a failed commit of a held write
        # loses what follows LMDB's applied index: `_refill`), the loop's flush timer and
        # its flags (a flush due; entries to apply again)
        self._held_entries = self._held_bytes = 0
        self._applied_upto = 0
        self._reload_due = False  # apply thread: a held write's commit failed, the log's view is stale
        self._flush_handle: asyncio.TimerHandle | None = None
        self._flush_due = False
        self._flushing = False  # the flush write commits the held write (`_held_committed`)
        self._refill_due = False
        if self._batches_commits():
            state.commit_wanted = self._want_commit
            state.on_held_committed = self._held_committed
            state.on_lost = self._state_lost
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        # messages and ticks (None) in the order they happened: a heartbeat that arrived
        # during a long write resets the election clock the ticks before it advanced
        self._inbox: list[Message | None] = []
        self._ack_term = 0  # while the writer works: the durable term heartbeats are answered in
        # the commit index at each of the last `election_tick` ticks: readiness compares the
        # applied index with the oldest (a write in flight is not "applying")
        self._commit_marks: collections.deque[int] = collections.deque(maxlen=self.cfg.election_tick)
        self._pending: list[tuple[Command, ProposalFuture]] = []
        self._admin: list[Callable[[RaftCore], None]] = []
        self._proposals = ProposalBook()
        self._reads = ReadIndexWaits()
        self._last_stamp_ms = 0
        self._lead = NONE
        self._announced_lead = NONE  # the leader _lead_changed waiters last heard of
        self._role = Role.FOLLOWER
        self._lead_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._lease_handle: asyncio.TimerHandle | None = None
        self._orphan_handle: asyncio.TimerHandle | None = None  # `_give_up_orphans`
        self._stopping = False
        self._failed: BaseException | None = None
        self._removed = False
        self._peers_set: set[str] = set()
        self._ready_lock = asyncio.Lock()
        self._membership = Membership(self, admin_timeout_ms=self.cfg.admin_timeout_ms)
        self._snapshots = SnapshotKeeper(self.storage, state, node_id, snapshot_every=self.cfg.snapshot_every,
                                         election_tick=self.cfg.election_tick, ready_lock=self._ready_lock)
        self._store_db = store_identity.meta_db(self.env)
        self.identity = store_identity.StoreIdentity("")  # `start` loads (or creates) it
        # the peer door (doq/node/peer_door.py): refreshed when the configuration or ids change
        self._own_cluster_ids: tuple[str, ...] = ()
        self._door_members: frozenset[str] = frozenset()
        self._refused_log = RateLimitedLog(log)
        # storage alarms (doq.node.alarms): this node's gauge and the alarms the leader
        # refuses growth for (its own and its members' reports)
        self._admission = StorageAdmission(gauge, self.transport, self._leading_core,
                                           fresh_s=self.cfg.election_tick * self.cfg.tick_ms / 1000)
        # the log's last index at start when the state did not hold it: once applied, the
        # data file's pages read meanwhile are let go (`_release_start_pages`); else None
        self._release_after: int | None = None
        self.start_pages_released: asyncio.Future[int] | None = None  # bytes advised, once done

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.identity = store_identity.ensure(self.env, empty_join=self._join and self.storage.is_empty())
        self.addrs = dataclasses.replace(self.addrs, store_id=self.identity.store_id)
        if self.storage.is_empty():
            if not self._join:
                await loop.run_in_executor(self._writer, log_start.bootstrap, self.env, self.storage,
                                           self.state, self.node_id, self.addrs, self._rng)
            elif self._join_cluster_id:
                await loop.run_in_executor(self._writer, log_start.remember_join_cluster_id, self.env,
                                           self.storage, self._join_cluster_id)
        elif self.state.applied_index > self.storage.last_index():
            # the state is ahead of the log (an offline restore into a member, or an online
            # restore of an older doq, which rebased the log of a one-member cluster, cut
            # short by a crash): entries it already holds must not be reused
            conf = self.storage.snapshot_meta().conf_state
            await loop.run_in_executor(self._writer, log_start.rebase, self.env, self.storage,
                                       self.state, conf, self.node_id)
        self.core = self._new_core()
        if self.storage.last_index() > self.core.log.applied:
            self._release_after = self.storage.last_index()
        else:  # nothing to apply again: the pages the start read (the rebuild's) go now
            self._release_start_pages()
        if self.identity.voting_gated:
            self.core.allow_voting(False)
            log.info("node %s (store %s) takes no part in elections until the cluster has admitted "
                     "this store", self.node_id, self.identity.store_id)
        self._last_stamp_ms = self.state.machine.now_ms
        self._sync_peers()
        self._refresh_door()
        await self.transport.start()
        self._task = asyncio.create_task(self._run(), name=f"doq-raft-{self.node_id}")
        self._tick_handle = loop.call_later(self.cfg.tick_ms / 1000, self._on_tick)
        self._wake.set()
        await self._lead_if_alone()

    async def _lead_if_alone(self) -> None:
        """A lone voter campaigned at once: return when it leads (its next Ready), so it
        serves at once instead of answering NotLeader (bounded by `admin_timeout_ms`)."""
        core, task = self.core, self._task
        if core is None or task is None or core.role == Role.FOLLOWER:
            return  # not alone (a restarted node knows its membership as of its applied
            # index; conf changes committed after it are applied before it campaigns)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.admin_timeout_ms / 1000
        while self._role != Role.LEADER and not task.done() and loop.time() < deadline:
            await self.wait_leader_change(0.05)

    async def stop(self, *, transfer_leadership: bool = True) -> None:
        """Leave well: a leader with other voters first hands leadership to the most
        up-to-date one (bounded by max(1 s, 3 election timeouts); on failure it stops
        anyway), so clients see at most one retryable error instead of waiting for an
        election. Then refuse new proposals,
        let the current Ready finish, fail what is still pending (`Unavailable`,
        retryable), stop the transport and the threads."""
        if self._stopping:
            return
        core = self.core
        if transfer_leadership and self.is_leader and core is not None and len(core.voters) > 1:
            timeout_s = max(1.0, 3 * self.cfg.election_tick * self.cfg.tick_ms / 1000)
            try:
                target = await asyncio.wait_for(self.transfer_leader(), timeout_s)
                log.info("node %s handed leadership to %s before stopping", self.node_id, target)
            except (DoqError, TimeoutError) as e:
                log.warning("leadership transfer before stopping failed: %r", e)
        self._stopping = True
        for h in (self._tick_handle, self._lease_handle, self._orphan_handle):
            if h:
                h.cancel()
        self._wake.set()
        if self._task:
            try:
                await self._task
            except Exception:  # already logged by _run
                pass
        with contextlib.suppress(Exception):  # deferred applies end (and answer) first
            await self._drain_applies()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        try:  # the held write: committed (aborted if the node failed: the log has it)
            await self._applier.call(self._end_held, None)
        except Exception:
            log.exception("node %s: the held write could not be committed at stop; its entries "
                          "are applied again from the log at the next start", self.node_id)
        self._snapshots.cancel()
        self._fail_all(Unavailable("node is shutting down", reason="SHUTTING_DOWN"))
        await self.transport.stop()
        self._writer.shutdown(wait=True)
        self._applier.shutdown(wait=True)
        self._snapshots.shutdown()
        self.storage.close()

    # -- Node protocol -----------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._role == Role.LEADER and not self._stopping and not self._removed

    @property
    def leader_hint(self) -> str:
        return self._lead

    @property
    def members(self) -> dict[str, MemberAddrs]:
        return self.storage.members

    def leader_addrs(self) -> MemberAddrs | None:
        """Addresses of the leader this node knows of (None if none)."""
        return self.storage.members.get(self._lead) if self._lead else None

    async def propose(self, command: Command) -> object:
        return await self.propose_nowait(command)

    def propose_nowait(self, command: Command) -> Fut:
        """Queue a command for the next entry. Raises at once on a follower (`NotLeader` +
        hint), while stopping (`Unavailable`) or when too many wait (`Overloaded`)."""
        if self._role != Role.LEADER or self._stopping or self._removed or self._failed is not None:
            self.check_serving()  # raises the right error
        admission = self._admission
        if admission.gauge is not None:
            admission.admit(command)
        pending = self._pending
        if len(pending) >= MAX_PENDING_COMMANDS:
            raise Overloaded("too many commands waiting for commit; retry later")
        fut = ProposalFuture(loop=asyncio.get_running_loop())
        pending.append((command, fut))
        if len(pending) == 1:
            self._wake.set()  # the first since the last Ready wakes the driver
        return fut

    async def read_barrier(self) -> None:
        """ReadIndex: wait until this node has applied everything committed when the read
        began, as confirmed by a heartbeat quorum of the leader. Raises `NotLeader` without
        a known leader, `Unavailable` if not confirmed within `read_timeout_ms`."""
        if self._stopping or self._failed is not None:
            raise Unavailable("node is shutting down", reason="SHUTTING_DOWN")
        if self._lead == NONE:
            raise NotLeader("no leader known", leader_hint="")
        await self._reads.wait(self.run_on_core, self.cfg.read_timeout_ms / 1000)

    async def inspect(self, fn: Callable[[StateStore], T]) -> T:
        """Run `fn(state)` on the apply thread between two applies (see `Node.inspect`)."""
        return await self._applier.call(fn, self.state)

    def add_apply_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _notify_applied(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("apply listener %r failed", callback)

    def _release_start_pages(self) -> None:
        """The entries logged before this start that the state did not hold are applied
        (at once when there are none): the data file's pages the start read are let go of
        the process's RSS, once (`doq.storage.mapped`; they stay in the page cache). Off
        the loop and the writer."""
        self._release_after = None
        path = os.path.join(self.env.path(), "data.mdb")
        self.start_pages_released = asyncio.get_running_loop().run_in_executor(None, release_mapped_pages, path)

    @property
    def applied_index(self) -> int:
        return self.state.view.applied_index  # published: committed or held (the writer may be applying more)

    def is_ready(self) -> bool:
        """Can serve: no `readiness_problems()`."""
        return not self.readiness_problems()

    def readiness_problems(self) -> list[str]:
        """[] when this node is a member of the configuration (voter or learner), knows a
        leader it has heard from within an election timeout (or is it), and has applied up
        to the commit index it knew an election timeout ago (the oldest of `_commit_marks`;
        the current one before the first tick); else the reasons, with the liveness ones.
        Entries committed since are a write in flight on a busy node, not a lag."""
        core = self.core
        problems = self.liveness_problems()
        if self._stopping:
            problems.append("shutting_down")
        if core is None:
            return [*problems, "starting"]
        if self._removed or (self.node_id not in core.voters and self.node_id not in core.learners):
            problems.append("not_a_member")  # e.g. a new or replaced store not admitted yet
        if self._lead == NONE:
            problems.append("no_leader")
        elif self._role != Role.LEADER and core.election_elapsed >= self.cfg.election_tick:
            problems.append("leader_unreachable")
        marks = self._commit_marks
        if self.applied_index < (marks[0] if marks else core.log.committed):
            problems.append("applying")
        return problems

    def liveness_problems(self) -> list[str]:
        """A failed Raft loop (`_run` raised), or a broken store: nothing more will be
        applied by this process."""
        problems = []
        task = self._task
        if self._failed is not None or (task is not None and task.done() and not self._stopping):
            problems.append("raft_failed")
        if self.state.broken:
            problems.append("store_broken")
        return problems

    def cluster_admin(self) -> RaftNode:
        return self

    @property
    def restore_chunk_bytes(self) -> int:
        return self.cfg.restore_chunk_bytes

    # -- storage alarms ----------------------------------------------------------------------
    def storage_usage(self) -> StorageUsage | None:
        return None if self.gauge is None else self.gauge.usage()

    def alarms(self) -> list[Alarm]:
        """The storage alarms on now: this node's, and on a leader its members' too (any
        of them makes the leader refuse writes that grow the state)."""
        return list(self._admission.alarms)

    @property
    def gauge(self) -> StorageGauge | None:
        """This node's storage measure (None: it measures nothing, refuses nothing)."""
        return self._admission.gauge

    @gauge.setter
    def gauge(self, gauge: StorageGauge | None) -> None:
        self._admission.gauge = gauge

    def _refresh_alarms(self) -> None:
        """Recompute the storage alarms (`StorageAdmission.refresh`)."""
        self._admission.refresh()

    def _leading_core(self) -> RaftCore | None:
        """The core while this node leads (its members' storage alarms count then)."""
        return self.core if self._role == Role.LEADER else None

    def propose_alone(self, command: Command) -> Fut:
        """Propose `command` as the only command of its own entry (restore commands: the
        store applies such an entry itself; see `Node.propose_alone`). Resolves as
        `propose_nowait`'s future; raises at once as it does when this node cannot take it."""
        self.check_serving()
        admission = self._admission
        if admission.gauge is not None:
            admission.admit(command)
        fut: Fut = asyncio.get_running_loop().create_future()

        def request(core: RaftCore) -> None:
            if core.role != Role.LEADER:
                fail_future(fut, NotLeader("not the leader", leader_hint=core.lead))
                return
            batch = CommandBatch(self._stamp_ms(), [command])
            try:
                index = core.propose_batch([encode_batch(batch)])[0]
            except (CoreNotLeader, ProposalDropped) as e:
                hint = (e.leader_hint or "") if isinstance(e, CoreNotLeader) else core.lead_transferee
                fail_future(fut, NotLeader(f"proposal refused: {e}", leader_hint=hint))
                return
            self.add_proposal(index, Proposal(core.term, [fut], batch=batch))

        self.run_on_core(request)
        return fut

    def _stamp_ms(self) -> int:
        """The leader's time for a new entry: never earlier than one already stamped or applied."""
        now_ms = max(self._last_stamp_ms, self.state.machine.now_ms, self._clock_ms())
        self._last_stamp_ms = now_ms
        return now_ms

    def _new_core(self) -> RaftCore:
        """The core, started at the state's applied index (`RaftConfig.applied`): the
        entries the state holds are neither read nor applied again; the membership is the
        snapshot's with the log's conf changes up to that index (`WalLogStorage.start_at`),
        and a removal of this node among them counts as when it was applied."""
        st = self.storage
        applied = min(self.state.applied_index, st.hard_state.commit)
        if applied < st.first_index() - 1:
            applied = 0  # (never expected) the state is behind the log's start: apply from there
        for cc in st.start_at(applied):
            if cc.node_id == self.node_id:  # the last change about this node counts (`_handle_ready`)
                self._removed = cc.type == ConfChangeType.REMOVE_NODE
        rcfg = RaftConfig(
            id=self.node_id, election_tick=self.cfg.election_tick,
            heartbeat_tick=self.cfg.heartbeat_tick, max_inflight_msgs=self.cfg.max_inflight_msgs,
            max_msg_bytes=self.cfg.max_msg_bytes, snapshot_chunk_bytes=self.cfg.snapshot_chunk_bytes,
            broadcast_commit=self.cfg.broadcast_commit, max_committed_bytes=self.cfg.max_committed_bytes,
            applied=applied,
        )
        core = RaftCore(rcfg, st, random.Random(self._rng.getrandbits(64)))
        if core.voters == (self.node_id,):
            core.campaign()  # alone: no need to wait for an election timeout
        return core

    # -- ClusterAdmin ------------------------------------------------------------------------
    def cluster_status(self) -> ClusterStatus:
        core = self.core
        members: list[Member] = []
        voters = core.voters if core else ()
        learners = core.learners if core else ()
        addrs = self.storage.members
        heard = self.transport.last_heard()
        fresh_s = self.cfg.election_tick * self.cfg.tick_ms / 1000
        committed = core.log.committed if core else 0
        leading = core is not None and self._role == Role.LEADER
        for nid in sorted(set(voters) | set(learners)):
            a = addrs.get(nid) or self._peers.get(nid) or MemberAddrs("", "", "")
            role_name = "voter" if nid in voters else "learner"
            if nid == self.node_id:
                match = self.storage.last_index()
                members.append(Member(nid, a, role_name, True, 0, match, max(0, committed - match)))
            elif leading or nid == self._lead:  # a follower hears from its leader only
                ago = heard.get(nid)
                pr = core.prs.get(nid) if leading and core is not None else None
                match_i = pr.match if pr is not None else None
                members.append(Member(
                    nid, a, role_name, ago is not None and ago <= fresh_s,
                    None if ago is None else int(ago * 1000), match_i,
                    None if match_i is None else max(0, committed - match_i)))
            else:
                members.append(Member(nid, a, role_name))
        if self._role == Role.LEADER:
            role = "leader"
        elif self._role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            role = "candidate"
        else:
            role = "learner" if self.node_id in learners else "follower"
        return ClusterStatus(
            node_id=self.node_id, leader_id=self._lead, term=core.term if core else 0,
            commit_index=core.log.committed if core else 0,
            applied_index=self.applied_index, role=role, members=members,
            cluster_id=self.state.cluster_id,
            alarms=tuple((a.node_id, a.reason, a.message) for a in self._admission.alarms),
            storage=self.storage_usage(),
        )

    def identity_of_store(self) -> NodeIdentity:
        cluster_id = self.state.cluster_id or self.identity.cluster_id
        return NodeIdentity(self.node_id, self.identity.store_id, cluster_id,
                            empty=not cluster_id and self.storage.is_empty())

    async def add_member(self, node_id: str, addrs: MemberAddrs, *, empty: bool = False,
                         cluster_id: str = "") -> ClusterStatus:
        """See `ClusterAdmin.add_member` and `doq.node.membership`."""
        return await self._membership.add_member(node_id, addrs, empty=empty, cluster_id=cluster_id)

    async def remove_member(self, node_id: str) -> None:
        """See `doq.node.membership.Membership.remove_member`."""
        await self._membership.remove_member(node_id)

    async def transfer_leader(self, target_id: str | None = None) -> str:
        """See `ClusterAdmin.transfer_leader` and `doq.node.membership`."""
        return await self._membership.transfer_leader(target_id)

    # -- inputs (event loop) -----------------------------------------------------------------
    def _on_messages(self, frame: PeerFrame) -> None:
        """Transport callback: the peer door (`peer_door.admit`: cluster id, receiver,
        sender, membership) drops what may not reach the core, counted and logged at most
        once a minute per reason; the rest is queued for the core (stepped between two
        Readies). While the writer works, a follower answers its leader's heartbeats at
        once (`write_overlap.heartbeat_acks`)."""
        if self._stopping:
            return
        msgs, refused = peer_door.admit(self.node_id, self._own_cluster_ids, self._door_members,
                                        frame.sender, frame.cluster_ids, frame.messages)
        if refused:
            self._count_refused(frame, refused)
            if not msgs:
                return
        if self._ack_term:  # the writer works: answer the leader's heartbeats now
            acks = write_overlap.heartbeat_acks(self.core, self._ack_term, self.node_id, msgs)
            if acks:
                self.transport.send(acks)
        self._inbox.extend(msgs)
        self._wake.set()

    def _count_refused(self, frame: PeerFrame, refused: list[tuple[Message, peer_door.Refusal]]) -> None:
        for m, reason in refused:
            _REFUSED[reason].inc()
            self._refused_log.warn(
                reason.value, "node %s dropped a %s message from %r (term %d, cluster ids %r): %s",
                self.node_id, m.type.name, m.frm[:64], m.term, [i[:64] for i in frame.cluster_ids[:4]],
                reason.value)

    def _refresh_door(self) -> None:
        """Recompute what the peer door admits (after a configuration or cluster id change)
        and the ids this node's frames carry."""
        core = self.core
        members = set(self.storage.members)
        if core is not None:
            members.update(core.voters, core.learners)
        self._door_members = frozenset(members)
        own = tuple(dict.fromkeys(i for i in (self.state.cluster_id, *self.storage.peer_cluster_ids) if i))
        if own != self._own_cluster_ids:
            self._own_cluster_ids = own
            self.transport.set_cluster_ids(own)

    def _on_tick(self) -> None:
        if self._stopping:
            return
        self._inbox.append(None)
        if self.core is not None:
            self._commit_marks.append(self.core.log.committed)
        if self._ack_term:  # the writer works: keep the followers' election clocks reset
            beats = write_overlap.heartbeats_while_writing(self.core, self._ack_term, self.node_id)
            if beats:
                self.transport.send(beats)
        if self.gauge is not None:
            self.gauge.check_disk(force=False)  # a disk freed while no write runs lifts its alarm
            self._refresh_alarms()
        self._wake.set()
        self._tick_handle = asyncio.get_running_loop().call_later(self.cfg.tick_ms / 1000, self._on_tick)

    # -- driver primitives (what `doq.node.membership` orchestrates) -------------------------
    def check_serving(self) -> None:
        """Raise unless this node is the serving leader: `Unavailable` SHUTTING_DOWN while
        stopping or failed, `NotLeader` + hint when removed or not the leader."""
        if self._stopping or self._failed is not None:
            raise Unavailable("node is shutting down", reason="SHUTTING_DOWN")
        if self._removed:
            raise NotLeader("this node was removed from the cluster", leader_hint=self._lead)
        if self._role != Role.LEADER:
            raise NotLeader("not the leader", leader_hint=self._lead)

    def run_on_core(self, request: Callable[[RaftCore], None]) -> None:
        """Run `request(core)` on the loop task between two Readies (it wakes the loop)."""
        self._admin.append(request)
        self._wake.set()

    def add_proposal(self, index: int, prop: Proposal) -> None:
        """Wait for the entry at `index` (this node just appended it as leader). A proposal
        of an earlier term still waiting there lost its entry (this leader's log, which
        holds every committed entry, has another one at that index): never applied."""
        self._proposals.add(index, prop, self._lead)

    async def wait_leader_change(self, timeout_s: float) -> None:
        """Return when the leader this node knows of changes, or after `timeout_s`."""
        changed = self._lead_changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)

    # -- the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self._stopping:
                await self._wake.wait()
                self._wake.clear()
                if self._apply_error is not None:
                    raise self._apply_error
                async with self._ready_lock:  # a restore runs between two Readies
                    if self._stalled:  # a deferred apply failed for want of space
                        await self._drain_applies()
                    if self._flush_due or self._refill_due:
                        self._flush_due = self._refill_due = False
                        await self._write_off_loop(_Job(None, [], None, [], None, flush=True))
                    core = self.core
                    assert core is not None
                    self._feed(core)
                    handled = core.has_ready()
                    if handled:
                        await self._handle_ready(core, core.ready())
                        self._wake.set()  # more may have arrived meanwhile
                        self._schedule_flush()
                    if self.storage.snapshot_wanted and not self._snapshots.producing:
                        await self._drain_applies()  # the state at the core's applied index
                        self._snapshots.produce(core, self._applier)
                if handled:
                    # the tasks its results woke (frames first, then confirmations) send
                    # before the next Ready is made: its writer then runs while this loop
                    # idles, not against it for the GIL at every LMDB call (measured:
                    # shorter commits, and frames not held behind the next Ready)
                    await asyncio.sleep(0)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                log.exception("Raft node %s failed; it stops taking requests", self.node_id)
            self._failed = e
            self._role = Role.FOLLOWER
            self._fail_all(Unavailable(f"node failed: {e}", reason="NODE_FAILED"))
            raise

    def _feed(self, core: RaftCore) -> None:
        """Give the core everything queued since the last Ready."""
        if self._inbox:
            inbox, self._inbox = self._inbox, []
            ticks = 0
            for m in inbox:  # in arrival order (see `_inbox`)
                if m is None:
                    core.tick()
                    ticks += 1
                else:
                    core.step(m)
            if ticks and core.role == Role.LEADER:
                promote_caught_up_learner(core, self.storage.members)
            if ticks and self.storage.compaction_hold is not None:
                self._snapshots.age(core, ticks)
        if self._admin:
            admin, self._admin = self._admin, []
            for fn in admin:
                fn(core)
        if self._pending:
            self._propose_pending(core)

    def _propose_pending(self, core: RaftCore) -> None:
        pending = [p for p in self._pending if not p[1].cancelled()]  # cancelled: dropped
        for _, fut in pending:
            fut.in_log = True  # proposed or failed below: no longer cancellable
        if core.role != Role.LEADER:
            self._pending = []
            err = NotLeader("not the leader", leader_hint=core.lead)
            for _, fut in pending:
                fail_future(fut, err)
            return
        datas: list[bytes] = []
        batches: list[CommandBatch] = []
        groups: list[list[Fut]] = []
        now_ms = self._stamp_ms()
        while pending:
            count = take_count(pending)
            taken, pending = pending[:count], pending[count:]
            batch = CommandBatch(now_ms, [cmd for cmd, _ in taken])
            try:
                datas.append(encode_batch(batch))
            except Exception as e:  # an unencodable command: fail its batch, keep going
                log.exception("cannot encode a command batch")
                for _, fut in taken:
                    fail_future(fut, Unavailable(f"cannot encode command: {e}"))
                continue
            groups.append([fut for _, fut in taken])
            batches.append(batch)
        self._pending = []
        if not datas:
            return
        try:
            indexes = core.propose_batch(datas)
        except (CoreNotLeader, ProposalDropped) as e:
            hint = (e.leader_hint or "") if isinstance(e, CoreNotLeader) else core.lead_transferee
            err = NotLeader(f"proposal refused: {e}", leader_hint=hint)
            for futs in groups:
                for f in futs:
                    fail_future(f, err)
            return
        term = core.term
        if stages.observer is not None:
            stages.observer.proposed([cmd for batch in batches for cmd in batch.commands])
        for index, futs, batch in zip(indexes, groups, batches, strict=True):
            self.add_proposal(index, Proposal(term, futs, batch=batch))

    async def _handle_ready(self, core: RaftCore, rd: Ready) -> None:
        """One Ready: persist (segment log, one fdatasync) → send → apply (one LMDB txn) →
        conf changes → resolve → reads → advance."""
        job = _Job(rd.snapshot, rd.entries, rd.hard_state, rd.committed_entries, None, must_sync=rd.must_sync)
        if self._admission.log_pressure():
            job.compact_floor = compact_floor(core, self.node_id)
        messages = rd.messages
        if job.snapshot or job.entries or job.hard_state or job.committed:
            job.own_snapshot = self._snapshots.take_own()
            job.deferred = self._defers_apply(core, rd, job)
            if not job.deferred:
                await self._drain_applies()  # this write's LMDB part follows theirs
            else:
                job.on_applied = lambda: self._deferred_applied(core, job)
            self._answer_early(job)
            early, messages = write_overlap.split_early(  # durable: no write runs now
                core, rd, self.storage.hard_state, self.storage.last_index())
            if early:  # replicated while this node persists them (`write_overlap.split_early`)
                self.transport.send(early)
            self._send_after_log(job, rd, messages)
            await self._write_off_loop(job)
            if job.sent_after_log:
                messages = []
        if job.admitted:
            self.identity = self.identity.ungated()
            core.allow_voting(True)
            log.info("node %s: the cluster admitted store %s; it takes part in elections again",
                     self.node_id, self.identity.store_id)
        if messages:
            self.transport.send(messages)
        removed = conf_changed = False
        for e in rd.committed_entries:
            if e.type == EntryType.CONF_CHANGE:
                conf_changed = True
                cc = codec.decode_conf_change(e.data)
                core.apply_conf_change(cc)
                if cc.node_id == self.node_id:
                    # the last change about this node counts: a replaced member catching
                    # up applies its old removal, then its new admission
                    removed = cc.type == ConfChangeType.REMOVE_NODE
                    if not removed and self._removed:
                        self._removed = False
                        log.info("node %s is a member again", self.node_id)
        if job.members is not None or rd.snapshot is not None:
            self._sync_peers()
        if conf_changed or rd.snapshot is not None or job.cluster_id_changed:
            self._refresh_door()
        if rd.soft_state is not None:
            self._lead = rd.soft_state.lead  # the hint of the errors below
        if rd.snapshot is not None:
            self._fail_proposals_upto(rd.snapshot.meta.index, "a snapshot from the leader replaced "
                                      "this node's log before the proposal's fate was known here")
        if not job.deferred:
            self._resolve_committed(rd.committed_entries, job.results)
            if job.results and core.role == Role.LEADER:
                self._release_ended_leases(job.results)
        if rd.soft_state is not None:  # after resolving what this Ready applied
            self._on_soft_state(rd.soft_state.lead, rd.soft_state.role)
        if rd.read_states:
            self._reads.confirmed(rd.read_states)
        core.advance(rd)
        if self._reads.applying:
            self._reads.serve(self.applied_index)
        if (rd.committed_entries or rd.snapshot is not None) and not job.deferred:
            self._after_apply(core, rd.committed_entries, rd.snapshot is not None)
        if rd.committed_entries or rd.snapshot is not None:
            self._snapshots.record_due(core, pressure=self._admission.log_pressure())
        if removed:
            log.info("node %s was removed from the cluster", self.node_id)
            self._removed = True
            self._on_soft_state(core.lead, core.role)

    def _after_apply(self, core: RaftCore, committed: list[Entry], snapshot: bool) -> None:
        """Loop, once entries (or a snapshot) are applied and committed to LMDB: wake the
        apply listeners, let the start's pages go, reschedule the lease tick."""
        self._notify_applied()
        if self._release_after is not None and (snapshot or (
                committed and committed[-1].index >= self._release_after)):
            self._release_start_pages()  # the entries, not the state (ahead of them at a restart)
        if core.role == Role.LEADER:
            self._schedule_lease_tick()

    def _defers_apply(self, core: RaftCore, rd: Ready, job: _Job) -> bool:
        """May this Ready's LMDB part (hard state, apply, answers) run on the apply thread
        while the loop goes on to the next Ready (etcd applies in another goroutine)? Only
        when nothing the loop or the next Ready depends on waits for it: no snapshot to
        install or record, no new term or vote (durable before any message), no role or
        leader change, no membership change committed (applied to the core after the
        write), no store admission, no compaction due, no segment file to let go (both
        need a durable commit), no storage alarm, no stage observer. Otherwise the write
        waits for the deferred applies (`_drain_applies`) and runs whole, as one."""
        if not self.cfg.apply_thread or stages.observer is not None:
            return False
        if (job.snapshot is not None or job.own_snapshot is not None or rd.soft_state is not None
                or job.compact_floor is not None or self.identity.voting_gated):
            return False
        hs, durable = job.hard_state, self.storage.hard_state
        if hs is not None and (hs.term != durable.term or hs.vote != durable.vote):
            return False
        if any(e.type == EntryType.CONF_CHANGE for e in job.committed):
            return False
        if self._admission.alarms or self.storage.droppable():
            return False
        st = self.storage
        return st.snapshot_meta().index - self.cfg.keep_entries < st.first_index()

    async def _drain_applies(self) -> None:
        """Return once every deferred apply handed to the apply thread has committed and
        its loop part (`_deferred_applied`) ran (at once when none can be: `apply_thread`
        off, every write awaited whole). Applies stalled for want of space are retried
        here until they commit (`_replay_stalled`)."""
        if self.cfg.apply_thread:
            await self._applier.call(_nothing, None)
            if self._stalled:
                await self._replay_stalled()

    def _apply_deferred(self, job: _Job, t0: float) -> None:
        """Apply thread: a deferred Ready's LMDB part (`_commit_state`), then its loop part.
        A failure for want of space is handed back to the loop: the job and every one
        posted after it wait in `_stalled`, in log order, none applied, until the loop
        (which raises the alarm, and may grow the map between two tries) replays them
        (`_replay_stalled`); the apply thread meanwhile takes other jobs (`inspect`). Any
        other failure fails the node (`_run` raises it)."""
        if self._apply_error is not None:
            return
        if self._stalled:  # behind an apply that failed: in log order, after it
            self._stalled.append((job, t0))
            return
        try:
            self._commit_state(job, t0, None, admits=False, new_vote=False)
        except Exception as e:
            self._apply_failed(job, t0, e)
            return
        self._applied_on_loop(job)

    def _apply_failed(self, job: _Job, t0: float, err: Exception) -> None:
        """Apply thread: `job`'s LMDB commit failed (the store rebuilt its memory: nothing
        of it is applied). For want of space it waits in `_stalled`, at its head; otherwise
        the node fails. Either way the loop is woken."""
        if self.gauge is None or self._stopping or not self.gauge.write_failed(err):
            log.error("node %s: a deferred apply failed", self.node_id, exc_info=err)
            self._apply_error = err
        else:
            self._stalled.insert(0, (job, t0))
        loop = self._loop
        assert loop is not None
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._wake.set)

    def _applied_on_loop(self, job: _Job) -> None:
        """Apply thread: `job` committed; its loop part runs there (`_deferred_applied`)."""
        if job.on_applied is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(job.on_applied)

    def _commit_stalled(self, _: object) -> None:
        """Apply thread: commit the stalled applies in log order, each once; raises the
        first failure (that job and those after it stay stalled)."""
        while self._stalled:
            job, t0 = self._stalled[0]
            self._commit_state(job, t0, None, admits=False, new_vote=False)
            del self._stalled[0]
            self._applied_on_loop(job)

    async def _replay_stalled(self) -> None:
        """Loop: deferred applies stalled for want of space (`_apply_failed`): take up the
        NOSPACE alarm (growth refused), then try them again, in order, as `_write_off_loop`
        retries a whole write, until they commit (which lifts the alarm); meanwhile
        heartbeats are answered. Any other failure, or a failure while stopping, raises."""
        gauge = self.gauge
        assert gauge is not None
        ack_term = self._ack_term
        self._ack_term = ack_term or self.storage.hard_state.term  # deferred: no new term or vote
        delay_s, max_delay_s = 0.05, self.cfg.nospace_retry_max_ms / 1000
        try:
            while self._stalled:
                self._refresh_alarms()
                if delay_s < max_delay_s and gauge.alarms:  # the first tries only
                    log.warning("node %s: a deferred apply failed for want of space (%s); retrying "
                                "until space is freed", self.node_id, gauge.alarms[-1].message)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, max_delay_s)
                while not gauge.worth_retrying() and not self._stopping:
                    await asyncio.sleep(delay_s)  # the disk is still full: no rebuild for nothing
                try:
                    await self._applier.call(self._commit_stalled, None)
                except Exception as e:
                    if self._stopping or not gauge.write_failed(e):
                        raise
        finally:
            self._ack_term = ack_term
            self._admission.written()

    def _deferred_applied(self, core: RaftCore, job: _Job) -> None:
        """Loop: a deferred apply committed; what `_handle_ready` does after an apply."""
        if job.cluster_id_changed:
            self._refresh_door()
        self._resolve_committed(job.committed, job.results)
        if job.results and core.role == Role.LEADER:
            self._release_ended_leases(job.results)
        if self._reads.applying:
            self._reads.serve(self.applied_index)
        if job.committed:
            self._after_apply(core, job.committed, False)

    def _send_after_log(self, job: _Job, rd: Ready, messages: list[Message]) -> None:
        """Let the writer send this Ready's messages as soon as its entries are durable in
        the segment log (one fdatasync), before the state machine's LMDB commit: a
        follower acknowledges an append once it holds it, not once it applied what it
        learnt committed. Only when nothing else they may depend on waits for that commit:
        no snapshot to install, no new term or vote, and not the Ready that changes this
        node's role or leader (`write_overlap.split_early`: a new leader takes requests
        once its Ready is done)."""
        if not messages or rd.snapshot is not None or rd.soft_state is not None:
            return
        hs, durable = rd.hard_state, self.storage.hard_state
        if hs is not None and (hs.term != durable.term or hs.vote != durable.vote):
            return
        loop = asyncio.get_running_loop()
        send = self.transport.send

        def after_log() -> None:
            if job.sent_after_log:
                return  # a retried write
            job.sent_after_log = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(send, messages)

        job.after_log = after_log

    def _answer_early(self, job: _Job) -> None:
        """Let the writer answer the proposals of committed entries as soon as it has
        applied them in memory, before the apply's LMDB commit (`_write_txn`): every
        committed entry is durable on a quorum, and this node's copy is durable before
        the apply runs (in an earlier write, or in this one's segment-log fdatasync: a
        lone voter commits at append), so a crash re-applies them from the log with the
        same results. Not with a snapshot, nor from a conf change on (answered once
        applied to the core, after the write). The readers' view of the applied state is
        published first, so whoever hears an answer reads what it tells; the direct
        readers of LMDB (`StateStore.wait_committed`: the digest, backups, `get_message`)
        wait for the commit."""
        if not job.committed or job.snapshot is not None or not self._proposals:
            return
        n = 0
        for e in job.committed:
            if e.type == EntryType.CONF_CHANGE:
                break  # a conf change is answered once applied to the core too (after the write)
            n += 1
        if not n:
            return
        job.durable_committed = n
        loop = asyncio.get_running_loop()

        def answer(committed: list[Entry], results: list[list[object]]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._resolve_committed, committed, results)

        job.answer = answer

    async def _write_off_loop(self, job: _Job) -> None:
        """`_write` on the writer thread (a deferred Ready: its log part, then its LMDB
        part handed to the apply thread) or, for a Ready written whole, on the apply
        thread (every LMDB write transaction runs there); meanwhile heartbeats are
        answered at once."""
        thread = self._writer if job.deferred else self._applier
        self._ack_term = self.storage.hard_state.term  # durable: no other write is running
        try:
            delay_s, max_delay_s = 0.05, self.cfg.nospace_retry_max_ms / 1000
            while True:
                try:
                    await thread.call(self._write, job)
                    if stages.observer is not None:
                        stages.observer.back_on_loop(id(job))
                    break
                except Exception as e:
                    if self.gauge is None or self._stopping or not self.gauge.write_failed(e):
                        raise
                # for want of space: nothing of the write was kept (one aborted txn; the
                # store rebuilt its memory), so reload the log's view and try the same
                # Ready again until space is freed (meanwhile heartbeats are answered)
                await thread.call(_reload_log, self.storage)
                self._refresh_alarms()
                if delay_s < max_delay_s:  # the first tries only: no log line every 2 s
                    log.warning("node %s: write failed for want of space (%s); retrying until "
                                "space is freed", self.node_id, self.gauge.alarms[-1].message)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, max_delay_s)
                while not self.gauge.worth_retrying() and not self._stopping:
                    await asyncio.sleep(delay_s)  # the disk is still full: no rebuild for nothing
        finally:
            self._ack_term = 0
            self._admission.written()

    def _write(self, job: _Job) -> None:
        """The Ready's durable part and the apply (`_write_txn`); a deferred Ready's log
        part only, its LMDB part handed to the apply thread (`_apply_deferred`)."""
        if self._reload_due or (self.state.applied_index < self._applied_upto and self._batches_commits()):
            # a held write's commit failed (`_state_lost`, `_commit_held_now`): what it
            # recorded of the log (compaction point, hard state) is gone from LMDB too
            _reload_log(self.storage)
            self._reload_due = False
        if job.deferred:
            t0 = time.perf_counter()
            self._append_log(job)
            if not job.apply_posted:  # a write retried after a failed append posts once
                job.apply_posted = True
                self._applier.post(lambda: self._apply_deferred(job, t0))
            return
        if stages.observer is not None:
            self._observe_write(job, stages.observer)
            return
        self._write_txn(job)

    def _observe_write(self, job: _Job, observer: stages.StageObserver) -> None:
        """`_write_txn` between the observer's `write_started` and `write_ended`."""
        commands = [cmd for e in job.committed
                    if (p := self._proposals.by_index.get(e.index)) is not None and p.batch is not None
                    for cmd in p.batch.commands]
        observer.write_started(id(job), commands)
        self._write_txn(job)
        notes = ["RaftSnapshot"] * (job.own_snapshot is not None) + ["RaftCompact"] * bool(job.compacted)
        observer.write_ended(id(job), notes)

    def _write_txn(self, job: _Job) -> None:
        """The Ready's durable part, then the apply: (1) a snapshot installed in a durable
        LMDB commit, then the segment log reset after it; (2) the entries appended to the
        segment log with ONE fdatasync, after which the Ready's messages may leave
        (`_send_after_log`); (3) the hard state, the apply, this node's snapshot meta and
        the compaction point in one LMDB commit, durable only when `_must_be_durable`
        says so (one sync otherwise). A crash after (2) re-applies the entries from the
        log at restart (the state machine is deterministic)."""
        t0 = time.perf_counter()
        st = self.storage
        installed: dict[str, MemberAddrs] | None = None
        cluster_id = self.state.cluster_id
        hs = job.hard_state
        new_vote = hs is not None and (hs.term != st.hard_state.term or hs.vote != st.hard_state.vote)
        if job.snapshot is not None:
            with self.state.write(durable=True) as txn:
                installed = install_snapshot_data(self.state, txn, job.snapshot.data,
                                                  job.snapshot.meta.index)
                st.apply_snapshot(txn, job.snapshot)
                st.set_members(txn, installed)
                if hs is not None:
                    st.set_hard_state(txn, hs)
            st.after_commit(True)
        self._append_log(job)
        admits = self.identity.voting_gated and self._admits_this_store(installed, job.entries)
        self._commit_state(job, t0, cluster_id, admits=admits, new_vote=new_vote)

    def _append_log(self, job: _Job) -> None:
        """Step (2) of `_write_txn`: the entries appended to the segment log with ONE
        fdatasync, then the Ready's messages may leave (`_send_after_log`)."""
        if job.entries:
            self.storage.append(job.entries)
            self.storage.sync()
        if job.after_log is not None:
            job.after_log()

    def _commit_state(self, job: _Job, t0: float, cluster_id: str | None, *, admits: bool,
                      new_vote: bool) -> None:
        """Step (3) of `_write_txn`: the hard state, the apply (its answers before the
        commit, `_answer_early`), this node's snapshot meta and the compaction point in
        one LMDB commit, durable only when needed (`_must_be_durable`). `cluster_id`: the
        state's before the write (None: as it is now).

        No LMDB transaction at all when the write has nothing for LMDB: no hard state, no
        committed entry, no snapshot, no compaction due, nothing that must be durable
        there (a leader's Ready that only appends its next entry, one per call when calls
        come one at a time; its commit comes in the next Ready). The gauge then counts the
        segment log's growth without reading the tables (`StorageGauge.measure_log`), and
        the write is observed with no LMDB commit (no `doq_fsync_seconds` sample)."""
        st = self.storage
        hs = job.hard_state
        if cluster_id is None:
            cluster_id = self.state.cluster_id
        durable = new_vote or admits or self._must_be_durable(job)
        compact_to, per_write = self._compaction(job)
        job.refill = self._refill(job)
        if job.flush and not job.refill:  # the held write's commit, nothing else
            t1 = time.perf_counter()
            self._flushing = True  # observed below, as every write (not in `_held_committed`)
            try:
                committed = self.state.commit_held()  # its gauge: `_held_committed`
            finally:
                self._flushing = False
            self._held_entries = self._held_bytes = 0
            self._written(t0, t1 if committed else None, durable=False, committed=False)  # observed as every write
            return
        if (not durable and hs is None and not job.committed and job.snapshot is None
                and compact_to < st.first_index() and self.state.cluster_id == cluster_id
                and not job.refill and (self.gauge is None or self.gauge.measure_log(st.log_bytes()))):
            self._written(t0, None, durable=False, committed=not self.state.held)
            return
        hold = None if durable or not self._batches_commits() else (
            lambda: self._holds(job, cluster_id))
        with self.state.write(durable=durable, hold=hold) as txn:  # then publishes the readers' view
            if admits:
                store_identity.save(txn, self._store_db, self.identity.ungated())
                job.admitted = True
            if hs is not None:
                st.set_hard_state(txn, hs)
            if job.committed or job.refill:
                job.results = self._apply(txn, job)
                if self._on_applied is not None:
                    self._on_applied(sum(len(r) for r in job.results))
                if job.answer is not None:  # before the commit (see `_answer_early`)
                    self.state.publish_applied()  # what the answers tell, readers see
                    n = job.durable_committed
                    job.answer(job.committed[:n], job.results[:n])
            if job.own_snapshot is not None:
                st.create_snapshot(txn, Snapshot(job.own_snapshot))
                compact_to, per_write = self._compaction(job)
            if compact_to >= st.first_index():  # a few entries per write: never one large txn
                job.compacted = st.compact(txn, compact_to, per_write)
            if self.state.cluster_id != cluster_id:
                # peers that have not applied this yet still send the old id: keep answering to it
                st.add_peer_cluster_id(txn, cluster_id)
                job.cluster_id_changed = True
            if self.gauge is not None:
                # only an apply (or a snapshot installed just before) changes the state's tables
                self.gauge.measure(txn, log_bytes=st.log_bytes(),
                                   state_changed=bool(job.committed) or job.snapshot is not None)
            t1 = time.perf_counter()
        self._applied_upto = max(self._applied_upto, self.state.applied_index)
        if self.state.held:
            self._written(t0, None, durable=False, committed=False)  # no LMDB commit (yet)
            return
        self._held_entries = self._held_bytes = 0
        self._written(t0, t1, durable=durable)

    # -- the batched commit ------------------------------------------------------------------
    def _batches_commits(self) -> bool:
        """Do writes hold their LMDB transaction open across Readies (`hold_commit_ms`)?
        Only with the apply thread off: every write is then whole, on the apply thread."""
        return self.cfg.hold_commit_ms > 0 and not self.cfg.apply_thread

    def _holds(self, job: _Job, cluster_id: str) -> bool:
        """Apply thread, as a write that need not be durable ends: may its transaction stay
        open (held, `StateStore.write(hold=...)`) for the next writes to continue? Not with
        a snapshot installed or recorded, a cluster id changed, an admission, while
        stopping, nor once the held write reached `hold_commit_entries` applied entries or
        `hold_commit_bytes` of their data (the loop's timer commits it after
        `hold_commit_ms`: `_schedule_flush`)."""
        self._held_entries += len(job.committed)
        self._held_bytes += sum(len(e.data) for e in job.committed)
        return (not job.flush and job.snapshot is None and job.own_snapshot is None and not job.admitted
                and self.state.cluster_id == cluster_id and not self._stopping
                and self._held_entries < self.cfg.hold_commit_entries
                and self._held_bytes < self.cfg.hold_commit_bytes)

    def _refill(self, job: _Job) -> list[Entry]:
        """Apply thread: the entries applied in a held write whose commit failed (memory was
        rebuilt from LMDB, its applied index back), which this write applies again before
        its own, from the log (their answers were given; the machine is deterministic).
        Empty when nothing was lost."""
        hi = self._applied_upto
        if job.committed:
            hi = min(hi, job.committed[0].index - 1)
        lo = self.state.applied_index + 1
        if lo > hi:
            return []
        if lo < self.storage.first_index():  # never: compaction stays behind a durable snapshot
            raise RuntimeError(f"the log was compacted past the state's applied index {lo - 1}")
        return self.storage.entries(lo, hi + 1, 1 << 62)

    def _held_committed(self, commit_s: float) -> None:
        """Apply thread (`StateStore.on_held_committed`): the held write was committed by
        `commit_held` (the flush, a stop, a direct reader's wait): its count starts again,
        and the storage limits are judged on what LMDB now holds. A commit other than the
        flush write's (which `_written` observes) is observed here: one `doq_commit_seconds`
        and one `doq_fsync_seconds` sample of `commit_s`."""
        self._held_entries = self._held_bytes = 0
        if self.gauge is not None:
            self.gauge.committed()
        if self._on_commit and not self._flushing:
            self._on_commit(commit_s, commit_s)

    def _state_lost(self) -> None:
        """Apply thread (`StateStore.on_lost`, before anything else runs here): a failed
        commit (or write) lost the held write's applies and what it recorded of the log (a
        compaction point, a hard state). The log's view is reloaded from LMDB before the next
        write (`_reload_due`), so none drops a segment file past LMDB's compaction point, and the loop
        applies the lost entries again (`_refill`); until then the readers of memory
        answer `Unavailable` (`StateStore.check_current`).

        The reload itself waits for the next write (`_write` does it first thing, on this
        thread, while the loop waits for that write under the Ready lock): here the loop
        may be reading the log (`core.ready()`, a follower's catch-up), and a reload closes
        and reopens its segment files. Every write that could drop a segment file runs
        through `_write`, so none runs on the stale view."""
        self._held_entries = self._held_bytes = 0
        self._reload_due = True
        loop = self._loop
        if loop is not None and not self._stopping:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(self._ask_refill)

    def _want_commit(self) -> None:
        """Any thread: a direct reader of LMDB waits for the held write
        (`StateStore.wait_committed`): the apply thread commits it next."""
        with contextlib.suppress(RuntimeError):  # shut down: nothing is held any more
            self._applier.post(self._commit_held_now)

    def _commit_held_now(self) -> None:
        """Apply thread: commit the held write, if any. If that (or a commit a reader made,
        `StateStore.wait_committed`) failed, memory was rebuilt and lost what it applied: the
        log's view is reloaded and the loop applies those entries again (`_state_lost`;
        checked here again)."""
        try:  # not a write of the node's: not observed (`_written`)
            self.state.commit_held()
        except Exception:
            log.warning("node %s: the held write's commit failed; its entries are applied again",
                        self.node_id, exc_info=True)
        if self.state.applied_index < self._applied_upto and not self._stopping:
            self._held_entries = self._held_bytes = 0
            self._reload_due = True  # before the next write (`_write`), as a failed write's retry
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._ask_refill)

    def _ask_refill(self) -> None:
        """Loop: apply again what a failed commit of the held write lost (`_run`)."""
        self._refill_due = True
        self._wake.set()

    def _end_held(self, _: object) -> None:
        """Apply thread, at stop: commit the held write; abort it if the node failed."""
        if self._failed is not None or self._apply_error is not None:
            self.state.abort_held()
        else:
            self.state.commit_held()

    def _schedule_flush(self) -> None:
        """Loop, after a Ready: a held write commits at most `hold_commit_ms` later."""
        if self._flush_handle is None and self.state.held and self._loop is not None:
            self._flush_handle = self._loop.call_later(self.cfg.hold_commit_ms / 1000, self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        """Loop: `hold_commit_ms` after a write was held: `_run` makes a flush write."""
        self._flush_handle = None
        self._flush_due = True
        self._wake.set()

    def _compaction(self, job: _Job) -> tuple[int, int]:
        """Up to which index this write compacts the log (nothing if below its first
        index), and at most how many entries: `keep_entries` behind the snapshot, or under
        log pressure (`job.compact_floor`) only what the followers need."""
        snap_index = self.storage.snapshot_meta().index
        if job.compact_floor is None:
            return snap_index - self.cfg.keep_entries, self.cfg.compact_entries_per_write
        return min(snap_index, job.compact_floor), self.cfg.compact_entries_under_alarm

    def _written(self, t0: float, t1: float | None, *, durable: bool, committed: bool = True) -> None:
        """After a write (begun at `t0`) and its LMDB commit (begun at `t1`; None: the
        write had nothing for LMDB, see `_commit_state`): let go of what a durable commit
        frees, re-judge the storage limits (`committed`: not for a held write, whose
        commit may still fail for want of space: `_held_committed` does it then), observe
        the write."""
        self.storage.after_commit(durable)
        if self.gauge is not None and committed:
            self.gauge.committed()
        if self._on_commit:  # every durable write, also one that only appends or votes
            t2 = time.perf_counter()
            self._on_commit(t2 - t0, None if t1 is None else t2 - t1)

    def _must_be_durable(self, job: _Job) -> bool:
        """Must the LMDB commit of this write be durable when it returns (both syncs), or
        may an OS crash undo it (`StateStore.write(durable=False)`: one sync, the store
        stays whole)? The entries are durable in the segment log before it, so only what
        lives in LMDB alone counts: this node's own snapshot meta (the log is compacted
        behind it), a membership change applied (the member addresses), a segment file
        that the moved compaction point lets go (`WalLogStorage.after_commit` deletes it
        only after a durable commit). A new term or vote (`_write_txn`) and a store's
        admission are durable too. An OS crash that undoes the rest makes the node
        re-apply the same entries from its log at restart, with the same results."""
        if job.own_snapshot is not None:
            return True
        if any(e.type == EntryType.CONF_CHANGE for e in job.committed):
            return True
        return self.storage.droppable()

    def _admits_this_store(self, installed: dict[str, MemberAddrs] | None, entries: list[Entry]) -> bool:
        """Does this write give the node the conf change that admitted its store (a
        snapshot whose members list it with its store id, or the entry itself)? By log
        matching it then holds the leader's log up to its admission."""
        sid = self.identity.store_id
        mine = installed.get(self.node_id) if installed is not None else None
        if mine is not None and mine.store_id == sid:
            return True
        for e in entries:
            if e.type == EntryType.CONF_CHANGE:
                cc = codec.decode_conf_change(e.data)
                if cc.node_id == self.node_id and cc.type != ConfChangeType.REMOVE_NODE:
                    addrs = decode_addrs(cc.context)
                    if addrs is not None and addrs.store_id == sid:
                        return True
        return False

    def _apply(self, txn: lmdb.Transaction, job: _Job) -> list[list[object]]:
        """Apply the committed entries. An entry this node proposed in the term it was
        committed in is applied from the `CommandBatch` it encodes (decoding the data
        would give an equal batch: the codec round-trips exactly)."""
        items: list[tuple[int, bytes | CommandBatch]] = []
        props = self._proposals.by_index  # read only here (the loop changes it between Readies)
        members: dict[str, MemberAddrs] | None = None
        for e in (*job.refill, *job.committed):
            if e.type == EntryType.CONF_CHANGE:
                items.append((e.index, b""))  # advances the applied index only
                if e.index <= self.state.applied_index:
                    continue  # re-applied after a restart: members already persisted
                cc = codec.decode_conf_change(e.data)
                if members is None:
                    members = dict(self.storage.members)
                if cc.type == ConfChangeType.REMOVE_NODE:
                    members.pop(cc.node_id, None)
                else:
                    addrs = decode_addrs(cc.context)
                    if addrs is not None:
                        members[cc.node_id] = addrs
            else:
                p = props.get(e.index)
                batch = p.batch if p is not None and p.term == e.term else None
                items.append((e.index, batch if batch is not None else e.data))
        results = self.state.apply_entries(txn, items)
        if members is not None:
            self.storage.set_members(txn, members)
            job.members = members
        return results[len(job.refill):]  # the refill's were answered before

    # -- results -----------------------------------------------------------------------------
    def _resolve_committed(self, committed: list[Entry], results: list[list[object]]) -> None:
        """Give the proposals these entries carried their results (`ProposalBook`)."""
        if self._proposals:
            self._proposals.resolve_committed(committed, results, self._lead)
        if stages.observer is not None:
            stages.observer.resolved(results)

    def _release_ended_leases(self, results: list[list[object]]) -> None:
        """Leader: release what dequeues that committed after their lease ended leased
        (`late_dequeues`); stops at the first release not taken (the leases end by
        themselves)."""
        for nack in late_dequeues.releases(results, self._clock_ms):
            try:
                fut = self.propose_nowait(nack)
            except DoqError:
                return
            fut.add_done_callback(ignore_result)

    def _fail_proposals_upto(self, index: int | None, why: str) -> None:
        """`ProposalBook.fail_upto` with this node's leader hint."""
        self._proposals.fail_upto(index, why, self._lead)

    def _give_up_orphans(self) -> None:
        """`admin_timeout_ms` after a step-down: proposals whose entries this node (still
        not the leader) has not seen committed or replaced fail with `OutcomeUnknown`."""
        self._orphan_handle = None
        if self._role != Role.LEADER and self._proposals:
            self._fail_proposals_upto(None, "leadership changed before the proposal committed; "
                                            "it may still be applied")

    def _fail_all(self, err: DoqError) -> None:
        """Stopping or failed: commands not yet in the log fail with `err` (never applied);
        those in the log with `OutcomeUnknown` (another member may still commit them)."""
        pending, self._pending = self._pending, []
        for _, fut in pending:
            fail_future(fut, err)
        self._fail_proposals_upto(None, f"{err.message}; the proposal may still be applied")
        self._reads.fail_all(err)

    def _on_soft_state(self, lead: str, role: Role) -> None:
        was_leader = self._role == Role.LEADER
        self._lead = lead
        if lead != self._announced_lead:
            self._announced_lead = lead
            self._lead_changed.set()
            self._lead_changed = asyncio.Event()
        self._role = role
        if was_leader and role != Role.LEADER:
            if self._lease_handle:
                self._lease_handle.cancel()
                self._lease_handle = None
            # the proposals in the log wait: as a follower this node learns whether their
            # entries commit (their results) or are replaced (NotLeader: not applied); after
            # admin_timeout_ms without knowing, they fail OutcomeUnknown
            if self._proposals and self._orphan_handle is None:
                self._orphan_handle = asyncio.get_running_loop().call_later(
                    self.cfg.admin_timeout_ms / 1000, self._give_up_orphans)
            err = NotLeader("leadership lost", leader_hint=lead)
            pending, self._pending = self._pending, []
            for _, fut in pending:
                fail_future(fut, err)
        elif role == Role.LEADER and not was_leader:
            self._schedule_lease_tick()

    # -- peers and membership ----------------------------------------------------------------
    def _sync_peers(self) -> None:
        """Point the transport at every member whose address this node knows: the
        replicated address map (as of the applied index) and the join answer's peers.

        Not the core's conf state: after a restart it is the snapshot's until the
        committed conf changes are re-applied, and a follower must reach every member at
        once (it may have to elect a leader with them)."""
        if self.node_id in self.storage.members:
            self._peers = {}  # the replicated map now includes us: it is the whole truth
        known = {**self._peers, **self.storage.members}
        known.pop(self.node_id, None)
        for nid, a in known.items():
            self.transport.set_peer(nid, a.raft_addr)
        for nid in self._peers_set - set(known):
            self.transport.remove_peer(nid)
        self._peers_set = set(known)

    # -- time and snapshots ------------------------------------------------------------------
    def _schedule_lease_tick(self) -> None:
        """Leader only: propose a Tick when replicated time must move."""
        if self._lease_handle:
            self._lease_handle.cancel()
            self._lease_handle = None
        due_ms = self.state.next_due_ms()
        if due_ms is None or self._stopping or self._role != Role.LEADER:
            return
        delay_s = max(0.0, (due_ms - self._clock_ms()) / 1000) + 0.001
        self._lease_handle = asyncio.get_running_loop().call_later(delay_s, self._propose_tick)

    def _propose_tick(self) -> None:
        self._lease_handle = None
        if self._stopping or self._role != Role.LEADER:
            return
        fut = ProposalFuture(loop=asyncio.get_running_loop())
        fut.add_done_callback(ignore_result)
        self._pending.append((Tick(), fut))
        self._wake.set()



def _nothing(_: object) -> None:
    """A job that only marks a place in a thread's queue (`RaftNode._drain_applies`)."""


def _reload_log(storage: WalLogStorage) -> None:
    storage.reload()


def _raise_if_error(result: object) -> None:
    """A proposal's result that is a `DoqError` (the machine's or the store's refusal) is raised."""
    if isinstance(result, DoqError):
        raise result
