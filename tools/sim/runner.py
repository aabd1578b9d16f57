"""The seeded deterministic simulation: a cluster of SimNodes on a faulty Network
under a random workload and random faults, checked after every step.

One step is one unit of virtual time: deliver due messages, tick the nodes whose tick
falls due, maybe inject a fault or a client request, then let nodes (randomly, so a
crash can catch them with unpersisted work) run their Ready. Everything derives from
the seed, so a seed replays exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from hashlib import blake2b

from doq.raft import codec
from doq.raft.config import KNOWN_BUGS, RaftConfig
from doq.raft.storage import MemoryStorage
from doq.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    EntryType,
    MessageType,
    RaftError,
    Role,
)
from tools.sim.checker import Checker
from tools.sim.network import Faults, Network
from tools.sim.node import SimNode
from tools.sim.queue_load import QueueLoad, replay_violations
from tools.sim.queues import QueueWorkload


@dataclass(slots=True)
class SimOptions:
    """Shape of a run. ``steps`` fault-injection steps (virtual time units) are followed
    by up to ``heal_steps`` of healing; ``p_*`` are per-step probabilities, tuples are
    per-seed choices. Network fault rates are drawn from the seed (see Simulation)."""

    nodes: int = 5
    steps: int = 3000
    bug: str | None = None
    heal_steps: int = 4000
    tick_every: int = 4
    election_tick: int = 10
    p_propose: float = 0.15
    p_read: float = 0.02
    p_partition: float = 0.004
    p_crash: float = 0.003
    p_conf: float = 0.003
    p_transfer: float = 0.002
    p_crash_after_vote: float = 0.5
    p_ready_now: float = 0.7
    p_kill_new_leader: tuple[float, ...] = (0.0, 0.5, 0.9)
    """Per-seed choice: chance that a freshly elected leader is soon crashed or isolated."""
    p_isolate_on_commit: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6)
    """Per-seed choice: chance that a leader is isolated right as it advances its commit."""
    broadcast_commit: tuple[bool, ...] = (True, False)
    """Per-seed choice (drawn apart from the run's stream: a seed that draws True replays
    as before): `RaftConfig.broadcast_commit`, False as doq's node runs it."""
    queues: bool = False
    """The queue workload (tools.sim.queues): proposals are queue commands (redrives
    included) applied by the real queue state machine, checked for conservation."""

    def __post_init__(self) -> None:
        if self.bug is not None and self.bug not in KNOWN_BUGS:
            raise ValueError(f"unknown bug {self.bug!r}; known: {sorted(KNOWN_BUGS)}")
        if self.nodes < 1:
            raise ValueError("need at least one node")


@dataclass(slots=True)
class SimResult:
    """Outcome of one seed; ``steps`` counts all virtual time units, healing included."""

    seed: int
    steps: int
    violations: list[str] = field(default_factory=list)
    trace_hash: str = ""
    proposals: int = 0
    acked: int = 0
    reads: int = 0
    elections: int = 0
    crashes: int = 0
    conf_changes: int = 0
    redrive_moved: int = 0  # the queue workload: messages the last redrive moved


class Simulation:
    """One seeded run; call :meth:`run`."""

    def __init__(self, seed: int, opts: SimOptions) -> None:
        self.seed = seed
        self.opts = opts
        self.rng = random.Random(seed)
        self.now = 0
        self.checker = Checker()
        self.trace = blake2b(digest_size=16)
        rng = self.rng
        self.faults = Faults(
            drop=rng.choice([0.0, 0.02, 0.05, 0.15]),
            duplicate=rng.choice([0.0, 0.02, 0.05]),
            min_delay=1,
            max_delay=rng.choice([2, 6, 12, 25]),
        )
        self.net = Network(random.Random(rng.getrandbits(64)), self.faults)
        self.max_entries = rng.choice([1, 1, 1, 2, 64])
        self.p_kill = rng.choice(opts.p_kill_new_leader)
        self.kill_at: dict[str, int] = {}
        self.p_isolate_on_commit = rng.choice(opts.p_isolate_on_commit)
        self.bugs = frozenset({opts.bug}) if opts.bug else frozenset()
        self.broadcast_commit = random.Random(seed ^ 0xB0_CA57).choice(opts.broadcast_commit)
        self.nodes: dict[str, SimNode] = {}
        self.phase: dict[str, int] = {}
        self.retired: set[str] = set()
        self.restart_at: dict[str, int] = {}
        self.heal_at = -1
        self.next_id = opts.nodes + 1
        self.result = SimResult(seed, 0)
        self._pid = 0
        self.qwork = QueueWorkload()
        self._tick_proposed = -100
        # proposals are queue command batches, drawn from a stream of their own
        self.queue_load = QueueLoad(random.Random(seed ^ 0x5EED_0F_9E0E))
        ids = tuple(f"n{i}" for i in range(1, opts.nodes + 1))
        for nid in ids:
            self._add_node(nid, MemoryStorage(voters=ids))

    # -- setup ---------------------------------------------------------------------
    def _add_node(self, nid: str, storage: MemoryStorage) -> SimNode:
        cfg = RaftConfig(
            id=nid,
            election_tick=self.opts.election_tick,
            heartbeat_tick=1,
            max_inflight_msgs=4,
            max_entries_per_msg=self.max_entries,
            snapshot_chunk_bytes=8 if not self.opts.queues else 4096,  # queue state: kilobytes
            broadcast_commit=self.broadcast_commit,
            bugs=self.bugs,
        )
        node = SimNode(
            cfg, storage, self.rng.getrandbits(64), self.checker,
            snapshot_every=self.rng.choice([8, 30, 100]), keep_entries=self.rng.choice([0, 5]),
            queues=self.opts.queues,
        )
        self.nodes[nid] = node
        self.phase[nid] = self.rng.randrange(self.opts.tick_every)
        return node

    # -- helpers -------------------------------------------------------------------
    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.core is not None and n.id not in self.retired]

    def leaders(self) -> list[SimNode]:
        return [n for n in self.live() if n.core is not None and n.core.role == Role.LEADER]

    def leader(self) -> SimNode | None:
        """The live leader with the highest term, if any."""
        best: SimNode | None = None
        for n in self.leaders():
            assert n.core is not None
            if best is None or (best.core is not None and n.core.term > best.core.term):
                best = n
        return best

    def _trace(self, *parts: object) -> None:
        self.trace.update(repr(parts).encode())

    # -- the loop ------------------------------------------------------------------
    def run(self) -> SimResult:
        opts = self.opts
        try:
            for _ in range(opts.steps):
                self.step(faults=True)
                if self.checker.violations:
                    break
            if not self.checker.violations:
                self.heal_and_settle()
        except Exception as exc:  # noqa: BLE001 - an internal invariant broke: report it
            self.checker.violation(f"exception at t={self.now}: {type(exc).__name__}: {exc}")
        r = self.result
        r.steps = self.now
        r.violations = list(self.checker.violations)
        r.trace_hash = self.trace.hexdigest()
        r.acked = len(self.checker.acked)
        r.reads = self.checker.reads_ok
        return r

    def step(self, faults: bool) -> None:
        self.now += 1
        now = self.now
        nodes = self.nodes
        for m in self.net.due(now):
            n = nodes.get(m.to)
            if n is None or n.core is None or n.id in self.retired:
                continue
            self._trace(now, int(m.type), m.frm, m.to, m.term, m.index, len(m.entries))
            n.core.step(m)
        for nid, n in nodes.items():
            if n.core is not None and (now + self.phase[nid]) % self.opts.tick_every == 0:
                n.core.tick()
        for nid, t in list(self.restart_at.items()):
            if t <= now:
                del self.restart_at[nid]
                if nid not in self.retired:
                    nodes[nid].start()
                    self._trace(now, "restart", nid)
        if faults:
            self._random_faults()
            self._workload()
        self._run_readies(self.opts.p_ready_now if faults else 1.0, faults)

    def _run_readies(self, p_now: float, faults: bool) -> None:
        rng = self.rng
        for nid, n in list(self.nodes.items()):
            core = n.core
            if core is None or nid in self.retired or not core.has_ready():
                continue
            if p_now < 1.0 and rng.random() >= p_now:
                continue
            msgs = n.handle_ready()
            rd = n.last_ready
            if rd is not None and rd.soft_state is not None and rd.soft_state.role == Role.LEADER:
                self.result.elections += 1
                if faults and rng.random() < self.p_kill:
                    # at once (its first appends never leave) or mid-replication
                    delay = rng.randint(0, 3) if rng.random() < 0.5 else rng.randint(10, 80)
                    self.kill_at[nid] = self.now + delay
            granted_vote = False
            for m in msgs:
                self.net.send(self.now, m)
                if m.type == MessageType.VOTE_RESP and not m.reject:
                    granted_vote = True
            if rd is not None:
                self._note_conf_changes(rd.committed_entries)
            if (
                faults
                and rd is not None
                and rd.hard_state is not None
                and core.role == Role.LEADER
                and rng.random() < self.p_isolate_on_commit
            ):
                self.net.isolate(nid, self.now + rng.randint(20, 250))
                self._trace(self.now, "isolate-on-commit", nid)
            if faults and granted_vote and rng.random() < self.opts.p_crash_after_vote:
                self._crash(nid, self.rng.randint(1, 30))
        for rid in sorted(self.checker.removed - self.retired):
            self.retired.add(rid)
            self.nodes[rid].crash()
            self._trace(self.now, "retire", rid)

    def _note_conf_changes(self, entries: list[Entry]) -> None:
        for e in entries:
            if e.type == EntryType.CONF_CHANGE:
                cc = codec.decode_conf_change(e.data)
                if cc.type == ConfChangeType.REMOVE_NODE:
                    self.checker.removed.add(cc.node_id)

    # -- workload --------------------------------------------------------------------
    def _workload(self) -> None:
        rng = self.rng
        if self.opts.queues:
            self._due_tick()
        if rng.random() < self.opts.p_propose:
            leaders = self.leaders()
            if leaders:
                n = rng.choice(leaders)
                self._pid += 1
                data = self.qwork.batch(rng, self.now) if self.opts.queues else self.queue_load.batch(self._pid)
                assert n.core is not None
                try:
                    n.core.propose(data)
                except RaftError:
                    return
                self.checker.proposed(n.id, data)
                self.result.proposals += 1
                self._trace(self.now, "propose", n.id, data)
        if rng.random() < self.opts.p_read:
            live = self.live()
            if live:
                n = rng.choice(live)
                self._pid += 1
                ctx = b"r%d" % self._pid
                self.checker.read_requested(ctx)
                assert n.core is not None
                try:
                    n.core.read_index(ctx)
                except RaftError:
                    self.checker.read_floor.pop(ctx, None)

    def _due_tick(self) -> None:
        """The queue workload: the leader proposes a Tick when its applied state is due
        (a redrive step), at most every 5 steps."""
        lead = self.leader()
        if lead is None or lead.core is None or lead.sm.queues is None or self.now - self._tick_proposed < 5:
            return
        data = QueueWorkload.due(lead.sm.queues, self.now)
        if data is None:
            return
        try:
            lead.core.propose(data)
        except RaftError:
            return
        self._tick_proposed = self.now
        self.checker.proposed(lead.id, data)
        self._trace(self.now, "propose-tick", lead.id)

    # -- faults ----------------------------------------------------------------------
    def _random_faults(self) -> None:
        rng = self.rng
        opts = self.opts
        now = self.now
        self.net.expire_isolations(now)
        if self.heal_at >= 0 and now >= self.heal_at:
            self.net.heal()
            self.heal_at = -1
            self._trace(now, "heal")
        for nid, t in list(self.kill_at.items()):
            if t <= now:
                del self.kill_at[nid]
                n = self.nodes[nid]
                if n.core is None or n.core.role != Role.LEADER:
                    continue
                r = rng.random()
                if r < 0.4 and self.heal_at < 0:
                    buddy = rng.choice([i for i in self.nodes if i != nid])
                    self.net.partition([nid, buddy], [i for i in self.nodes if i not in (nid, buddy)])
                    self.heal_at = now + rng.randint(20, 250)
                    self._trace(now, "isolate-new-leader-with", nid, buddy)
                elif r < 0.8:
                    self.net.isolate(nid, now + rng.randint(20, 250))
                    self._trace(now, "isolate-new-leader", nid)
                else:
                    self._crash(nid, rng.randint(5, 150))
        if self.heal_at < 0 and rng.random() < opts.p_partition:
            self._partition()
        if rng.random() < opts.p_crash:
            live = self.live()
            if live:
                lead = self.leader()
                victim = lead if lead is not None and rng.random() < 0.5 else rng.choice(live)
                self._crash(victim.id, rng.randint(10, 300))
        if rng.random() < opts.p_conf:
            self._membership_change()
        if rng.random() < opts.p_transfer:
            lead = self.leader()
            if lead is not None and lead.core is not None:
                targets = [v for v in lead.core.voters if v != lead.id]
                if targets:
                    target = rng.choice(targets)
                    try:
                        lead.core.transfer_leadership(target)
                        self._trace(now, "transfer", lead.id, target)
                    except RaftError:
                        pass

    def _crash(self, nid: str, down_for: int) -> None:
        n = self.nodes[nid]
        if n.core is None:
            return
        n.crash()
        self.result.crashes += 1
        self.restart_at[nid] = self.now + down_for
        self._trace(self.now, "crash", nid)

    def _partition(self) -> None:
        rng = self.rng
        ids = [n.id for n in self.live()]
        if len(ids) < 2:
            return
        kind = rng.random()
        lead = self.leader()
        if kind < 0.4 and lead is not None:
            side = [lead.id]
            others = [i for i in ids if i != lead.id]
            if others and rng.random() < 0.5:
                side.append(rng.choice(others))
        elif kind < 0.8:
            side = rng.sample(ids, rng.randint(1, len(ids) - 1))
        else:
            for _ in range(rng.randint(1, len(ids))):
                a, b = rng.sample(ids, 2)
                self.net.block_one_way(a, b)
            self.heal_at = self.now + rng.randint(30, 300)
            self._trace(self.now, "oneway", sorted(self.net.blocked))
            return
        rest = [i for i in self.nodes if i not in side]
        self.net.partition(side, rest)
        self.heal_at = self.now + rng.randint(30, 400)
        self._trace(self.now, "partition", side)

    def _membership_change(self) -> None:
        lead = self.leader()
        if lead is None or lead.core is None:
            return
        core = lead.core
        rng = self.rng
        voters, learners = core.voters, core.learners
        n = self.opts.nodes
        try:
            if learners:
                core.propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, learners[0]))
                self._trace(self.now, "promote", learners[0])
            elif len(voters) < n:
                nid = f"n{self.next_id}"
                core.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, nid))
                self.next_id += 1
                self._add_node(nid, MemoryStorage())
                self._trace(self.now, "add", nid)
            elif len(voters) > max(2, n - 2):
                victim = rng.choice(voters)
                core.propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, victim))
                self._trace(self.now, "remove", victim)
            else:
                return
            self.result.conf_changes += 1
        except RaftError:
            pass

    # -- the end -------------------------------------------------------------------
    def heal_and_settle(self) -> None:
        """Heal the network, restart every crashed member, and require that every live
        member applies every acknowledged proposal (plus a final marker)."""
        self.net.heal()
        self.faults.drop = 0.0
        self.faults.duplicate = 0.0
        for nid in list(self.restart_at):
            self.restart_at[nid] = self.now + 1
        marker = b"final-marker"
        proposed_at = -1000
        for _ in range(self.opts.heal_steps):
            self.step(faults=False)
            if self.checker.violations:
                return
            lead = self.leader()
            if marker not in self.checker.acked:
                if lead is not None and lead.core is not None and self.now - proposed_at > 200:
                    try:
                        lead.core.propose(marker)
                        self.checker.proposed(lead.id, marker)
                        proposed_at = self.now
                    except RaftError:
                        pass
                continue
            if lead is None or lead.core is None:
                continue
            members = self._members(lead)
            if all(m.sm.index >= self.checker.max_acked_index for m in members):
                self.checker.check_durability(members)
                for m in members:
                    if m.sm.queues is not None:
                        for problem in self.checker.queue_check.problems(m.sm.queues):
                            self.checker.violation(f"{m.id}: {problem}")
                        self.result.redrive_moved = self.checker.queue_check.redrive_moves
                log = sorted((i, rec[1]) for i, rec in self.checker.applied.items())
                for v in replay_violations(log):
                    self.checker.violation(v)
                return
        lead = self.leader()
        state = {
            n.id: (n.core.role.name if n.core else "down", n.sm.index) for n in self.nodes.values()
        }
        self.checker.violation(
            f"no convergence after healing for {self.opts.heal_steps} steps "
            f"(marker acked={marker in self.checker.acked}, leader={lead.id if lead else None}, "
            f"max acked={self.checker.max_acked_index}, nodes={state})"
        )

    def _members(self, lead: SimNode) -> list[SimNode]:
        assert lead.core is not None
        ids = lead.core.voters + lead.core.learners
        return [self.nodes[i] for i in ids if i in self.nodes and i not in self.retired]


def run_seed(seed: int, opts: SimOptions) -> SimResult:
    return Simulation(seed, opts).run()
