"""A simulated node: a RaftCore over MemoryStorage ("the disk"), a toy state machine,
and the Ready loop a real driver runs (persist, send, apply, advance, compact)."""

from __future__ import annotations

import random
from dataclasses import replace
from hashlib import blake2b
from typing import Protocol

from doq.raft import codec
from doq.raft.config import RaftConfig
from doq.raft.core import RaftCore
from doq.raft.storage import MemoryStorage
from doq.raft.types import (
    ConfChangeType,
    Entry,
    EntryType,
    Message,
    MessageType,
    ReadState,
    Ready,
    Snapshot,
    SoftState,
)
from tools.sim.queues import QueueReplica

ZERO_HASH = bytes(16)
LEADER_MESSAGES = frozenset({MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP})


class ToyStateMachine:
    """Hash chain over every applied entry; snapshot = (index, hash). With `queues` (the
    queue workload, tools.sim.queues) it also applies the queue state machine, folds its
    digest into the chain and carries its records in the snapshot."""

    __slots__ = ("index", "hash", "count", "queues")

    def __init__(self, index: int = 0, hash_: bytes = ZERO_HASH, queues: QueueReplica | None = None) -> None:
        self.index = index
        self.hash = hash_
        self.count = 0
        self.queues = queues

    def apply(self, e: Entry) -> None:
        h = blake2b(self.hash, digest_size=16)
        h.update(e.index.to_bytes(8, "big"))
        h.update(e.term.to_bytes(8, "big"))
        h.update(e.data)
        if self.queues is not None:
            self.queues.apply(e.index, e.data)
            h.update(self.queues.digest())
        self.hash = h.digest()
        self.index = e.index
        self.count += 1

    def snapshot(self) -> bytes:
        out = self.index.to_bytes(8, "big") + self.hash
        return out + self.queues.dump() if self.queues is not None else out

    @classmethod
    def restore(cls, snap: Snapshot, queues: bool = False) -> ToyStateMachine:
        if not snap.data:  # the bootstrap snapshot: empty state
            return cls(snap.meta.index, ZERO_HASH, QueueReplica() if queues else None)
        return cls(int.from_bytes(snap.data[:8], "big"), snap.data[8:24],
                   QueueReplica(snap.data[24:]) if queues else None)


class Observer(Protocol):
    """Hooks the invariant checker uses (all called synchronously)."""

    def on_soft_state(self, node: SimNode, ss: SoftState) -> None: ...
    def on_persist(self, node: SimNode, entries: list[Entry]) -> None: ...
    def on_install_snapshot(self, node: SimNode, snap: Snapshot) -> None: ...
    def on_commit(self, node: SimNode, commit: int) -> None: ...
    def on_apply(self, node: SimNode, e: Entry, sm_hash: bytes) -> None: ...
    def on_read_state(self, node: SimNode, rs: ReadState) -> None: ...
    def on_removed(self, node: SimNode) -> None: ...
    def on_leader_message(self, node: SimNode, term: int) -> None: ...


class SimNode:
    """One node. ``storage`` survives crashes; ``core`` and ``sm`` do not."""

    def __init__(
        self,
        config: RaftConfig,
        storage: MemoryStorage,
        seed: int,
        observer: Observer | None = None,
        snapshot_every: int = 0,
        keep_entries: int = 0,
        queues: bool = False,
    ) -> None:
        self.id = config.id
        self.queues = queues
        self.config = config
        self.storage = storage
        self.observer = observer
        self.snapshot_every = snapshot_every
        self.keep_entries = keep_entries
        self._rng = random.Random(seed)
        self.core: RaftCore | None = None
        self.sm = ToyStateMachine()
        self.removed = False
        self.last_ready: Ready | None = None
        self.start()

    @property
    def alive(self) -> bool:
        return self.core is not None

    def start(self) -> None:
        """(Re)start from what is persisted: hard state, stable entries, snapshot."""
        self.core = RaftCore(self.config, self.storage, random.Random(self._rng.getrandbits(64)))
        self.sm = ToyStateMachine.restore(self.storage.snapshot(), self.queues)

    def crash(self) -> None:
        """Lose everything not persisted (the core, its unstable log, the state machine)."""
        self.core = None

    def set_bugs(self, bugs: frozenset[str]) -> None:
        self.config = replace(self.config, bugs=bugs)

    def handle_ready(self) -> list[Message]:
        """Run one Ready through persist → send (returned) → apply → advance."""
        core = self.core
        assert core is not None
        rd = core.ready()
        obs = self.observer
        if rd.soft_state is not None and obs:
            obs.on_soft_state(self, rd.soft_state)
        if rd.snapshot is not None:
            self.storage.apply_snapshot(rd.snapshot)
            self.sm = ToyStateMachine.restore(rd.snapshot, self.queues)
            if obs:
                obs.on_install_snapshot(self, rd.snapshot)
        if rd.entries:
            self.storage.append(rd.entries)
            if obs:
                obs.on_persist(self, rd.entries)
        if rd.hard_state is not None:
            self.storage.set_hard_state(rd.hard_state)
            if obs:
                obs.on_commit(self, rd.hard_state.commit)
        removed = False
        for e in rd.committed_entries:
            if e.type == EntryType.CONF_CHANGE:
                cc = codec.decode_conf_change(e.data)
                core.apply_conf_change(cc)
                if cc.type == ConfChangeType.REMOVE_NODE and cc.node_id == self.id:
                    removed = True
            if e.index <= self.sm.index:
                continue
            self.sm.apply(e)
            if obs:
                obs.on_apply(self, e, self.sm.hash)
        if obs:
            sent_as_leader = 0
            for m in rd.messages:
                if m.type in LEADER_MESSAGES and m.term != sent_as_leader:
                    sent_as_leader = m.term
                    obs.on_leader_message(self, m.term)
            for rs in rd.read_states:
                obs.on_read_state(self, rs)
        core.advance(rd)
        self.last_ready = rd
        if self.snapshot_every and self.sm.index - self.storage.first_index() >= self.snapshot_every:
            self.compact()
        if removed:
            self.removed = True
            if obs:
                obs.on_removed(self)
        return rd.messages

    def compact(self) -> None:
        """Snapshot the state machine at the applied index and compact the log."""
        core = self.core
        assert core is not None
        applied = core.log.applied
        if applied <= self.storage.snapshot().meta.index:
            return
        self.storage.create_snapshot(core.make_snapshot(applied, self.sm.snapshot()))
        self.storage.compact(max(self.storage.first_index() - 1, applied - self.keep_entries))
