"""RaftCore: the pure Raft state machine (messages and ticks in, a Ready out).

No I/O, no clock, no threads; randomness only from the injected ``random.Random``.
See docs/raft.md for the Ready contract the driver must follow.
"""

from __future__ import annotations

import random

from doq.raft import codec
from doq.raft.config import RaftConfig
from doq.raft.log import RaftLog
from doq.raft.progress import (
    Progress,
    ProgressState,
    has_quorum,
    quorum_index,
    vote_result,
)
from doq.raft.readonly import ReadOnly
from doq.raft.storage import RaftLogStorage
from doq.raft.types import (
    NONE,
    CompactedError,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    InvariantError,
    Message,
    MessageType,
    NotLeader,
    ProposalDropped,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SnapshotTemporarilyUnavailable,
    SoftState,
)

CAMPAIGN_TRANSFER = b"transfer"
"""Context of a VOTE sent after TimeoutNow: voters grant it despite a live leader."""

MT = MessageType


class RaftCore:
    """One Raft node. Drive it with :meth:`tick`, :meth:`step` and the proposal
    methods; collect work with :meth:`has_ready`/:meth:`ready`, perform it, then call
    :meth:`advance`. Never call :meth:`ready` twice without :meth:`advance` between.
    """

    def __init__(self, config: RaftConfig, storage: RaftLogStorage, rng: random.Random) -> None:
        self.cfg = config
        self.id = config.id
        self.rng = rng
        self.log = RaftLog(storage, config.max_committed_bytes)
        hs, cs = storage.initial_state()
        self.term = hs.term
        self.vote = hs.vote
        self.voters: tuple[str, ...] = tuple(sorted(cs.voters))
        self.learners: tuple[str, ...] = tuple(sorted(cs.learners))
        if hs.commit:
            self.log.commit_to(hs.commit)
        if config.applied > self.log.applied:  # the application holds these already
            self.log.applied_to(config.applied)
        self.role = Role.FOLLOWER
        self.lead = NONE
        self.prs: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.read_only = ReadOnly()
        self.pending_reads: list[tuple[bytes, str]] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = config.election_tick
        self.lead_transferee = NONE
        self.pending_conf_index = 0
        self._snap_buf: tuple[SnapshotMeta, bytearray] | None = None
        self._need_bcast = False
        self._prev_hs = hs
        self._prev_ss = SoftState(NONE, Role.FOLLOWER)
        self._ready_out = False
        # the driver's node-local decision (see `allow_voting`); True in a plain cluster
        self.voting_allowed = True
        self._commit_any_term = "commit-old-term" in config.bugs
        self._skip_prev_check = "skip-prev-check" in config.bugs
        self._no_persist_vote = "no-persist-vote" in config.bugs
        self._become_follower(self.term, NONE)

    # ------------------------------------------------------------------ inspection
    def conf_state(self) -> ConfState:
        return ConfState(self.voters, self.learners)

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.role)

    def hard_state(self) -> HardState:
        vote = self.vote
        if self._no_persist_vote:  # deliberate bug: a new vote never reaches the disk
            vote = self._prev_hs.vote if self._prev_hs.term == self.term else NONE
        return HardState(self.term, vote, self.log.committed)

    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def promotable(self) -> bool:
        return self.id in self.voters

    def allow_voting(self, allowed: bool) -> None:
        """Whether this node may take part in elections. While False it refuses every vote
        and pre-vote request and never campaigns (not even on TimeoutNow): the driver sets
        it for a node whose log cannot be trusted to hold what it once acknowledged (it
        came back with an empty store) until the leader has re-admitted it under its new
        store and it holds the leader's log up to that point (docs/raft.md, "A member
        that lost its disk"). It is not persisted here: the driver restores it at start."""
        self.voting_allowed = allowed

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        """Advance the logical clock by one tick."""
        if self.role == Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()

    def campaign(self) -> None:
        """Start an election now, as if the election timer had fired (PreVote first)."""
        self._hup(transfer=False)

    def propose(self, data: bytes) -> int:
        """Append a normal entry; returns its index. Raises NotLeader/ProposalDropped."""
        return self.propose_batch([data])[0]

    def propose_batch(self, datas: list[bytes]) -> list[int]:
        """Append several normal entries at once (one MsgApp per follower carries them)."""
        self._check_can_propose()
        first = self.log.last_index() + 1
        ents = [Entry(self.term, first + i, EntryType.NORMAL, d) for i, d in enumerate(datas)]
        self._append_entries(ents)
        return [e.index for e in ents]

    def propose_conf_change(self, cc: ConfChange) -> int:
        """Propose a single-server membership change; returns the entry index.

        Refused (ProposalDropped) while another conf change is unapplied, before the
        leader has applied an entry of its term, for a learner promotion before the
        learner has caught up with the commit index, or if it would leave no voter.
        """
        self._check_can_propose()
        if self.pending_conf_index > self.log.applied:
            raise ProposalDropped("a configuration change is still pending")
        nid = cc.node_id
        if cc.type == ConfChangeType.ADD_NODE:
            if nid in self.voters:
                raise ProposalDropped(f"{nid} is already a voter")
            pr = self.prs.get(nid)
            if nid in self.learners and (pr is None or pr.match < self.log.committed):
                raise ProposalDropped(f"learner {nid} has not caught up")
        elif cc.type == ConfChangeType.ADD_LEARNER:
            if nid in self.voters or nid in self.learners:
                raise ProposalDropped(f"{nid} is already a member")
        else:
            if nid not in self.voters and nid not in self.learners:
                raise ProposalDropped(f"{nid} is not a member")
            if self.voters == (nid,):
                raise ProposalDropped("cannot remove the last voter")
        index = self.log.last_index() + 1
        self._append_entries(
            [Entry(self.term, index, EntryType.CONF_CHANGE, codec.encode_conf_change(cc))]
        )
        self.pending_conf_index = index
        return index

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed conf change (called by the driver while applying entries,
        also when re-applying after a restart: it is idempotent). Returns the new
        conf state. A leader that removes itself steps down."""
        cs = self.conf_state().changed(cc)
        self.voters, self.learners = cs.voters, cs.learners
        voters = set(cs.voters)
        if self.role == Role.LEADER:
            self._sync_progress()
            if self.id not in voters:
                self._become_follower(self.term, NONE)
            else:
                if self.lead_transferee and self.lead_transferee not in voters:
                    self.lead_transferee = NONE
                if self._maybe_commit():
                    self._bcast_append()
        return self.conf_state()

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to voter ``target``: proposals are refused until it is done or
        an election timeout passes; once ``target`` has caught up it gets TimeoutNow."""
        if self.role != Role.LEADER:
            raise NotLeader(self.lead or None)
        if target not in self.voters:
            raise ProposalDropped(f"{target} is not a voter")
        if target == self.id or target == self.lead_transferee:
            return
        self.election_elapsed = 0
        self.lead_transferee = target
        if self.prs[target].match == self.log.last_index():
            self._send(Message(MT.TIMEOUT_NOW, to=target, frm=self.id))
        else:
            self._send_append(target)

    def read_index(self, context: bytes) -> None:
        """Request a linearizable read; a ReadState with the same (unique) ``context``
        appears in a later Ready. Serve the read once applied >= ReadState.index.
        Raises NotLeader if no leader is known."""
        if self.role == Role.LEADER:
            if not self._committed_in_term():
                self.pending_reads.append((context, self.id))
            else:
                self._handle_read_index(context, self.id)
        elif self.lead != NONE:
            self._send(Message(MT.READ_INDEX, to=self.lead, frm=self.id, context=context))
        else:
            raise NotLeader(None)

    def make_snapshot(self, index: int, data: bytes) -> Snapshot:
        """Describe the application's snapshot ``data`` taken at applied ``index`` (must be
        the current applied index, so the conf state is exact). The driver then persists
        it (``create_snapshot``) and may compact the log up to ``index``; the leader
        sends it to followers that fall behind the compacted log."""
        if index != self.log.applied:
            raise ValueError(f"snapshot index {index} != applied {self.log.applied}")
        meta = SnapshotMeta(index, self.log.term(index), self.conf_state())
        return Snapshot(meta, data)

    def snapshot_needed(self) -> bool:
        """Whether this node, as leader, is sending a follower a snapshot or has a follower
        that answered recently (``recent_active``) behind the log's first index (it needs
        one). Always False on a follower or candidate."""
        if self.role != Role.LEADER:
            return False
        first = self.log.first_index()
        for pid, pr in self.prs.items():
            if pid != self.id and (pr.state == ProgressState.SNAPSHOT
                                   or (pr.recent_active and pr.next < first)):
                return True
        return False

    # ------------------------------------------------------------------ Ready
    def has_ready(self) -> bool:
        if self._need_bcast or self.msgs or self.read_states:
            return True
        if self.soft_state() != self._prev_ss or self.hard_state() != self._prev_hs:
            return True
        u = self.log.unstable
        return bool(u.entries) or u.snapshot is not None or self.log.has_next_committed()

    def ready(self) -> Ready:
        """Collect pending work. Messages and read states are handed over (moved)."""
        if self._ready_out:
            raise InvariantError("ready() called again before advance()")
        self._flush()
        rd = Ready()
        ss = self.soft_state()
        if ss != self._prev_ss:
            rd.soft_state = ss
            self._prev_ss = ss
        hs = self.hard_state()
        if hs != self._prev_hs:
            rd.hard_state = hs
        rd.entries = self.log.unstable_entries()
        rd.snapshot = self.log.unstable.snapshot
        rd.committed_entries = self.log.next_committed()
        rd.messages, self.msgs = self.msgs, []
        rd.read_states, self.read_states = self.read_states, []
        # a received snapshot is acknowledged in this very Ready: it must be durable too
        rd.must_sync = bool(rd.entries) or rd.snapshot is not None or (
            hs.term != self._prev_hs.term or hs.vote != self._prev_hs.vote
        )
        self._ready_out = True
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver finished ``rd`` (persisted, sent, applied)."""
        self._ready_out = False
        if rd.hard_state is not None:
            self._prev_hs = rd.hard_state
        if rd.snapshot is not None:
            self.log.stable_snap_to(rd.snapshot.meta.index)
            self.log.applied = max(self.log.applied, rd.snapshot.meta.index)
        if rd.entries:
            e = rd.entries[-1]
            self.log.stable_to(e.index, e.term)
        if rd.committed_entries:
            self.log.applied_to(rd.committed_entries[-1].index)

    # ------------------------------------------------------------------ step
    def step(self, m: Message) -> None:
        """Process one message from a peer (messages addressed to another node are ignored)."""
        if m.to != self.id:
            return
        if m.term > self.term:
            if m.type in (MT.VOTE, MT.PRE_VOTE):
                force = m.context == CAMPAIGN_TRANSFER
                in_lease = (
                    self.cfg.check_quorum
                    and self.lead != NONE
                    and self.election_elapsed < self.cfg.election_tick
                )
                if not force and in_lease:
                    return  # we heard from a leader recently: ignore disruptive votes
            if m.type == MT.PRE_VOTE or (m.type == MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change our term
            elif m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, NONE)
        elif m.term < self.term:
            if m.type in (MT.HEARTBEAT, MT.APP) and (self.cfg.check_quorum or self.cfg.pre_vote):
                # tell a stale leader about the newer term so it steps down
                self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id))
            elif m.type == MT.PRE_VOTE:
                self._send(Message(MT.PRE_VOTE_RESP, to=m.frm, frm=self.id, reject=True))
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(m)
            return
        if self.role == Role.LEADER:
            self._step_leader(m)
        elif self.role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _handle_vote_request(self, m: Message) -> None:
        resp = MT.VOTE_RESP if m.type == MT.VOTE else MT.PRE_VOTE_RESP
        can_vote = self.voting_allowed and (
            self.vote == m.frm
            or (self.vote == NONE and self.lead == NONE)
            or (m.type == MT.PRE_VOTE and m.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            self._send(Message(resp, to=m.frm, frm=self.id, term=m.term))
            if m.type == MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(Message(resp, to=m.frm, frm=self.id, reject=True))

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MT.APP:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append(m)
        elif t == MT.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_heartbeat(m)
        elif t == MT.SNAP:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif t == MT.TIMEOUT_NOW:
            self._hup(transfer=True)
        elif t == MT.READ_INDEX:
            if self.lead != NONE:
                self._send(Message(MT.READ_INDEX, to=self.lead, frm=m.frm, context=m.context))
        elif t == MT.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.context))

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in (MT.APP, MT.HEARTBEAT, MT.SNAP):
            self._become_follower(m.term, m.frm)
            self._step_follower(m)
        elif (t == MT.VOTE_RESP and self.role == Role.CANDIDATE) or (
            t == MT.PRE_VOTE_RESP and self.role == Role.PRE_CANDIDATE
        ):
            self.votes.setdefault(m.frm, not m.reject)
            res = vote_result(self.voters, self.votes)
            if res is True:
                if self.role == Role.PRE_CANDIDATE:
                    self._campaign(pre=False, transfer=False)
                else:
                    self._become_leader()
            elif res is False:
                self._become_follower(self.term, NONE)

    def _step_leader(self, m: Message) -> None:
        pr = self.prs.get(m.frm)
        t = m.type
        if t == MT.READ_INDEX:
            if not self._committed_in_term():
                self.pending_reads.append((m.context, m.frm))
            else:
                self._handle_read_index(m.context, m.frm)
            return
        if pr is None:
            return
        if t == MT.APP_RESP:
            pr.recent_active = True
            self._handle_app_resp(m, pr)
        elif t == MT.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state == ProgressState.REPLICATE and pr.inflights.full():
                pr.inflights.free_first_one()  # let one more MsgApp out
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            elif m.frm == self.lead_transferee:
                # again: a target that has not applied its own promotion yet (it learns
                # the commit with these heartbeats) ignored the first TimeoutNow
                self._send(Message(MT.TIMEOUT_NOW, to=m.frm, frm=self.id))
            if m.context:
                acks = self.read_only.recv_ack(m.frm, m.context)
                if acks is not None and has_quorum(self.voters, acks):
                    for rs in self.read_only.advance(m.context):
                        self._respond_read(rs.context, rs.frm, rs.index)
        elif t == MT.SNAP_RESP:
            pr.recent_active = True
            if pr.state == ProgressState.SNAPSHOT:
                pr.snapshot_failed()  # a chunk went missing; retry on the next heartbeat
                pr.probe_sent = True

    def _handle_app_resp(self, m: Message, pr: Progress) -> None:
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, hint):
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        old_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state == ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        prev_commit = self.log.committed
        if self._maybe_commit() and (
            self.cfg.broadcast_commit or prev_commit < self.pending_conf_index <= self.log.committed
        ):
            # the lazy commit (broadcast_commit False) still sends a conf change's commit
            # at once: membership takes effect when applied, and a follower that has not
            # learnt it would count votes in the old configuration if this leader died
            self._bcast_append()
        elif old_paused:
            self._send_append(m.frm)
        while self._send_append(m.frm, send_if_empty=False):
            pass
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self._send(Message(MT.TIMEOUT_NOW, to=m.frm, frm=self.id))

    # ------------------------------------------------------------------ follower side
    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, index=self.log.committed))
            return
        last_new = self.log.maybe_append(
            m.index, m.log_term, m.commit, m.entries, self._skip_prev_check
        )
        if last_new is not None:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, index=last_new))
            return
        hint_index = min(m.index, self.log.last_index())
        hint_index, hint_term = self.log.find_conflict_by_term(hint_index, m.log_term)
        self._send(
            Message(
                MT.APP_RESP, to=m.frm, frm=self.id, index=m.index, reject=True,
                reject_hint=hint_index, log_term=hint_term,
            )
        )

    def _handle_heartbeat(self, m: Message) -> None:
        # A heartbeat's commit is min(the leader's match for us, its commit): past our last
        # index only if we lost entries we once acknowledged (an emptied store). Nothing
        # past our log can be committed here; the leader repairs it, or replaces us.
        if m.commit <= self.log.last_index():
            self.log.commit_to(m.commit)
        self._send(Message(MT.HEARTBEAT_RESP, to=m.frm, frm=self.id, context=m.context))

    def _handle_snapshot(self, m: Message) -> None:
        meta = m.snapshot
        if meta is None:
            return
        if m.offset == 0:
            self._snap_buf = (meta, bytearray())
        buf = self._snap_buf
        if buf is None or buf[0] != meta or m.offset != len(buf[1]):
            if buf is None or buf[0] != meta or m.offset > len(buf[1]):
                self._send(Message(MT.SNAP_RESP, to=m.frm, frm=self.id, reject=True))
            return  # a duplicate chunk, or a lost one: the leader retries from scratch
        buf[1].extend(m.data)
        if not m.done:
            return
        self._snap_buf = None
        snap = Snapshot(meta, bytes(buf[1]))
        if self._restore(snap):
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, index=self.log.last_index()))
        else:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self.id, index=self.log.committed))

    def _restore(self, snap: Snapshot) -> bool:
        meta = snap.meta
        if meta.index <= self.log.committed:
            return False
        cs = meta.conf_state
        # A node may receive a snapshot taken before it was added: it learns its own
        # membership from the entries that follow.
        if self.log.match_term(meta.index, meta.term):
            self.log.commit_to(meta.index)  # we already have it: fast-forward the commit
            return False
        self.log.restore(snap)
        self.voters = tuple(sorted(cs.voters))
        self.learners = tuple(sorted(cs.learners))
        return True

    # ------------------------------------------------------------------ leader side
    def _check_can_propose(self) -> None:
        if self.role != Role.LEADER:
            raise NotLeader(self.lead or None)
        if self.lead_transferee != NONE:
            raise ProposalDropped("leadership transfer in progress")
        if self.id not in self.prs:
            raise ProposalDropped("this node was removed from the cluster")

    def _append_entries(self, ents: list[Entry]) -> None:
        last = self.log.append(ents)
        self.prs[self.id].maybe_update(last)
        self._maybe_commit()
        self._need_bcast = True

    def _maybe_commit(self) -> bool:
        matches = [self.prs[v].match for v in self.voters if v in self.prs]
        if len(matches) != len(self.voters):
            return False
        mci = quorum_index(matches)
        if not self.log.maybe_commit(mci, self.term, self._commit_any_term):
            return False
        if self.pending_reads and self._committed_in_term():
            pending, self.pending_reads = self.pending_reads, []
            for ctx, frm in pending:
                self._handle_read_index(ctx, frm)
        return True

    def _committed_in_term(self) -> bool:
        return self.log.term(self.log.committed) == self.term

    def _flush(self) -> None:
        if self._need_bcast:
            self._need_bcast = False
            if self.role == Role.LEADER:
                self._bcast_append()

    def _bcast_append(self) -> None:
        self._need_bcast = False
        for pid in self.prs:
            if pid != self.id:
                self._send_append(pid)

    def _send_append(self, to: str, send_if_empty: bool = True) -> bool:
        pr = self.prs[to]
        if pr.is_paused():
            return False
        prev_index = pr.next - 1
        log = self.log
        if prev_index < log.first_index() - 1:
            return self._send_snapshot(to, pr)
        prev_term = log.term(prev_index)
        try:
            ents = log.entries_from(pr.next, self.cfg.max_msg_bytes, self.cfg.max_entries_per_msg)
        except CompactedError:
            return self._send_snapshot(to, pr)
        if not ents and not send_if_empty:
            return False
        self._send(
            Message(
                MT.APP, to=to, frm=self.id, index=prev_index, log_term=prev_term,
                entries=tuple(ents), commit=log.committed,
            )
        )
        if pr.state == ProgressState.REPLICATE:
            if ents:
                last = ents[-1].index
                pr.optimistic_update(last)
                pr.inflights.add(last)
        elif pr.state == ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: str, pr: Progress) -> bool:
        if not pr.recent_active:
            return False
        try:
            snap = self.log.snapshot()
        except SnapshotTemporarilyUnavailable:
            return False  # being produced: retried on a later heartbeat response
        if snap.is_empty():
            raise InvariantError("log compacted but no snapshot available")
        size = self.cfg.snapshot_chunk_bytes
        data = snap.data
        offsets = list(range(0, len(data), size)) or [0]
        for off in offsets:
            self._send(
                Message(
                    MT.SNAP, to=to, frm=self.id, snapshot=snap.meta,
                    data=data[off : off + size], offset=off, done=off == offsets[-1],
                )
            )
        pr.become_snapshot(snap.meta.index)
        return True

    def _bcast_heartbeat(self) -> None:
        ctx = self.read_only.last_pending_context()
        for pid, pr in self.prs.items():
            if pid != self.id:
                commit = min(pr.match, self.log.committed)
                self._send(Message(MT.HEARTBEAT, to=pid, frm=self.id, commit=commit, context=ctx))

    def _handle_read_index(self, ctx: bytes, frm: str) -> None:
        if self.voters == (self.id,):
            self._respond_read(ctx, frm, self.log.committed)
            return
        if self.read_only.add_request(self.log.committed, ctx, frm):
            acks = self.read_only.recv_ack(self.id, ctx)
            if acks is not None and has_quorum(self.voters, acks):
                for rs in self.read_only.advance(ctx):
                    self._respond_read(rs.context, rs.frm, rs.index)
                return
        self._bcast_heartbeat()

    def _respond_read(self, ctx: bytes, frm: str, index: int) -> None:
        if frm in (NONE, self.id):
            self.read_states.append(ReadState(index, ctx))
        else:
            self._send(Message(MT.READ_INDEX_RESP, to=frm, frm=self.id, index=index, context=ctx))

    def _sync_progress(self) -> None:
        members = self.voters + self.learners
        for pid in list(self.prs):
            if pid not in members:
                del self.prs[pid]
        for pid in members:
            pr = self.prs.get(pid)
            if pr is None:
                pr = Progress(self.log.last_index() + 1, self.cfg.max_inflight_msgs, False)
                self.prs[pid] = pr
            pr.is_learner = pid in self.learners

    # ------------------------------------------------------------------ timers
    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.promotable() and self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self._hup(transfer=False)

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, NONE)
                return
            self.lead_transferee = NONE
        for pr in self.prs.values():
            if pr.state == ProgressState.SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks >= self.cfg.election_tick:
                    pr.snapshot_failed()
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def _quorum_active(self) -> bool:
        active = {self.id}
        for pid, pr in self.prs.items():
            if pid != self.id:
                if pr.recent_active:
                    active.add(pid)
                pr.recent_active = False
        return has_quorum(self.voters, active)

    # ------------------------------------------------------------------ elections
    def _hup(self, transfer: bool) -> None:
        if self.role == Role.LEADER or not self.promotable() or not self.voting_allowed:
            return
        if self._has_unapplied_conf_change():
            return
        self._campaign(pre=self.cfg.pre_vote and not transfer, transfer=transfer)

    def _has_unapplied_conf_change(self) -> bool:
        lo = max(self.log.applied + 1, self.log.first_index())
        hi = self.log.committed + 1
        if lo >= hi:
            return False
        try:  # not the entries themselves: at a restart these are every entry since the snapshot
            return self.log.has_conf_change(lo, hi)
        except CompactedError:
            return False

    def _campaign(self, pre: bool, transfer: bool) -> None:
        if pre:
            self.role = Role.PRE_CANDIDATE
            self.votes = {}
            self.lead = NONE
            term = self.term + 1
            mtype = MT.PRE_VOTE
        else:
            self._reset(self.term + 1)
            self.vote = self.id
            self.role = Role.CANDIDATE
            term = self.term
            mtype = MT.VOTE
        self.votes[self.id] = True
        if vote_result(self.voters, self.votes) is True:
            if pre:
                self._campaign(pre=False, transfer=transfer)
            else:
                self._become_leader()
            return
        ctx = CAMPAIGN_TRANSFER if transfer else b""
        last = self.log.last_index()
        last_term = self.log.last_term()
        for v in self.voters:
            if v != self.id:
                self._send(
                    Message(mtype, to=v, frm=self.id, term=term, index=last,
                            log_term=last_term, context=ctx)
                )

    def _become_follower(self, term: int, lead: str) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.lead = self.id
        self._sync_progress()
        me = self.prs.get(self.id)
        if me is not None:
            me.match = self.log.last_index()
            me.become_replicate()
            me.recent_active = True
        # a conf change may not be proposed before an entry of this term is applied
        self.pending_conf_index = self.log.last_index()
        self._append_entries([Entry(self.term, self.log.last_index() + 1)])
        self._bcast_append()

    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        et = self.cfg.election_tick
        self.randomized_election_timeout = et + self.rng.randrange(et)
        self.lead_transferee = NONE
        self.votes = {}
        self.prs = {}
        self.read_only.reset()
        self.pending_reads = []
        self._need_bcast = False

    def _send(self, m: Message) -> None:
        if m.term == 0:
            m.term = self.term
        self.msgs.append(m)
