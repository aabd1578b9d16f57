"""Raft safety invariants, checked incrementally as nodes persist, commit and apply.

- election safety: at most one leader per term;
- log matching: two logs holding an entry with the same (index, term) hold the same
  prefix (checked with a prefix hash per persisted entry);
- leader completeness: a new leader of term T holds every entry committed in terms < T;
- state machine safety: the same entry and the same state-machine hash at each applied
  index on every node;
- linearizable reads: a ReadState index covers every write acknowledged before the read;
- durability: every acknowledged proposal is applied by every live member at the end;
- with the queue workload (tools.sim.queues): the queue state's digest is part of the
  state-machine hash, and payloads are conserved (none lost, none twice).
"""

from __future__ import annotations

from hashlib import blake2b
from typing import TYPE_CHECKING

from doq.raft.types import Entry, ReadState, Role, Snapshot, SoftState
from tools.sim.queues import QueueCheck

if TYPE_CHECKING:
    from tools.sim.node import SimNode

BOOT_PREFIX = b"bootstrap-prefix"


class Checker:
    """Observer of every SimNode; collects violations (strings) instead of raising."""

    def __init__(self, max_violations: int = 20) -> None:
        self.violations: list[str] = []
        self.max_violations = max_violations
        self.leaders: dict[int, str] = {}
        self.prefix: dict[tuple[int, int], bytes] = {(1, 1): BOOT_PREFIX}
        self.node_prefix: dict[str, tuple[int, list[bytes]]] = {}
        self.commit_points: dict[int, tuple[int, int]] = {}
        self.applied: dict[int, tuple[int, bytes, bytes]] = {}
        self.proposer: dict[bytes, str] = {}
        self.acked: dict[bytes, int] = {}
        self.max_acked_index = 0
        self.read_floor: dict[bytes, int] = {}
        self.removed: set[str] = set()
        self.reads_ok = 0
        self.read_log: list[tuple[str, ReadState]] = []
        self.queue_check = QueueCheck()

    def violation(self, msg: str) -> None:
        if len(self.violations) < self.max_violations:
            self.violations.append(msg)

    # -- workload bookkeeping ----------------------------------------------------------
    def proposed(self, node: str, data: bytes) -> None:
        self.proposer[data] = node

    def read_requested(self, ctx: bytes) -> None:
        self.read_floor[ctx] = self.max_acked_index

    # -- observer hooks --------------------------------------------------------------
    def on_soft_state(self, node: SimNode, ss: SoftState) -> None:
        if ss.role != Role.LEADER:
            return
        core = node.core
        assert core is not None
        term = core.term
        other = self.leaders.setdefault(term, node.id)
        if other != node.id:
            self.violation(f"election safety: {other} and {node.id} both lead term {term}")
        best: tuple[int, int] | None = None
        for t, point in self.commit_points.items():
            if t < term and (best is None or point[0] > best[0]):
                best = point
        if best is None:
            return
        index, eterm = best
        if index >= core.log.first_index() and core.log.term(index) != eterm:
            self.violation(
                f"leader completeness: {node.id} leads term {term} without committed "
                f"entry {index}@{eterm} (has term {core.log.term(index)})"
            )

    def on_leader_message(self, node: SimNode, term: int) -> None:
        """``node`` sent APP/HEARTBEAT/SNAP in ``term``: only a leader of that term may."""
        other = self.leaders.setdefault(term, node.id)
        if other != node.id:
            self.violation(f"election safety: {other} and {node.id} both lead term {term}")

    def on_persist(self, node: SimNode, entries: list[Entry]) -> None:
        base, hashes = self.node_prefix.get(node.id, (1, [BOOT_PREFIX]))
        first = entries[0].index
        if first <= base:
            entries = [e for e in entries if e.index > base]
            if not entries:
                return
            first = entries[0].index
        if first - 1 > base + len(hashes) - 1:
            self.violation(f"log gap on {node.id}: persisting {first} after a hole")
            return
        del hashes[first - base :]
        prev = hashes[-1]
        prefix = self.prefix
        for e in entries:
            h = blake2b(prev, digest_size=12)
            h.update(e.term.to_bytes(8, "big"))
            h.update(e.data)
            prev = h.digest()
            hashes.append(prev)
            key = (e.index, e.term)
            known = prefix.setdefault(key, prev)
            if known != prev:
                self.violation(
                    f"log matching: {node.id} holds entry {e.index}@{e.term} "
                    "with a different prefix than another node"
                )
        self.node_prefix[node.id] = (base, hashes)

    def on_install_snapshot(self, node: SimNode, snap: Snapshot) -> None:
        m = snap.meta
        p = self.prefix.get((m.index, m.term))
        if p is None:
            self.violation(f"snapshot {m.index}@{m.term} on {node.id} of an unknown entry")
            p = b"unknown"
        self.node_prefix[node.id] = (m.index, [p])
        rec = self.applied.get(m.index)
        if rec is not None and snap.data and snap.data[8:24] != rec[2]:  # (then the queue records, if any)
            self.violation(f"state machine safety: snapshot {m.index} on {node.id} differs")

    def on_commit(self, node: SimNode, commit: int) -> None:
        core = node.core
        if core is None or core.role != Role.LEADER:
            return
        cur = self.commit_points.get(core.term)
        if cur is None or commit > cur[0]:
            self.commit_points[core.term] = (commit, core.log.term(commit))

    def on_apply(self, node: SimNode, e: Entry, sm_hash: bytes) -> None:
        if node.sm.queues is not None:
            self.queue_check.on_apply(e.index, node.sm.queues)
        rec = self.applied.setdefault(e.index, (e.term, e.data, sm_hash))
        if rec[0] != e.term or rec[1] != e.data:
            self.violation(
                f"state machine safety: {node.id} applied {e.index}@{e.term} but another "
                f"node applied {e.index}@{rec[0]}"
            )
        elif rec[2] != sm_hash:
            self.violation(f"state machine safety: {node.id} hash differs at {e.index}")
        if self.proposer.get(e.data) == node.id and e.data not in self.acked:
            self.acked[e.data] = e.index
            if e.index > self.max_acked_index:
                self.max_acked_index = e.index

    def on_read_state(self, node: SimNode, rs: ReadState) -> None:
        self.read_log.append((node.id, rs))
        floor = self.read_floor.pop(rs.context, None)
        if floor is None:
            return
        if rs.index < floor:
            self.violation(
                f"linearizability: read on {node.id} got index {rs.index} < acknowledged {floor}"
            )
        else:
            self.reads_ok += 1

    def on_removed(self, node: SimNode) -> None:
        self.removed.add(node.id)

    # -- final check -----------------------------------------------------------------
    def check_durability(self, live: list[SimNode]) -> None:
        """Every acknowledged proposal is applied (identically) by every live member."""
        for data, index in self.acked.items():
            rec = self.applied.get(index)
            if rec is None or rec[1] != data:
                self.violation(f"lost acknowledged proposal {data!r} at index {index}")
                continue
            for n in live:
                if n.sm.index < index:
                    self.violation(
                        f"durability: {n.id} applied up to {n.sm.index} < acked {index}"
                    )
                    return
