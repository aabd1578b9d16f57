"""A synchronous, deterministic in-memory cluster for scenario tests.

Messages go through one FIFO queue; nothing happens unless the test ticks, proposes or
calls :meth:`Cluster.stabilize`. Every node runs the real Ready loop of
:class:`~tools.sim.node.SimNode`, and the invariant :class:`~tools.sim.checker.Checker`
observes all of them, so every scenario also checks the Raft safety properties.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from doq.raft import codec
from doq.raft.config import RaftConfig
from doq.raft.core import RaftCore
from doq.raft.storage import MemoryStorage
from doq.raft.types import ConfChange, ConfChangeType, EntryType, Message, Role
from tools.sim.checker import Checker
from tools.sim.node import SimNode

MessageFilter = Callable[[Message], bool]
"""Return False to drop a message."""


class Cluster:
    def __init__(
        self,
        ids: Iterable[str] = ("a", "b", "c"),
        *,
        seed: int = 0,
        snapshot_every: int = 0,
        **config: object,
    ) -> None:
        self.ids = tuple(ids)
        self.config = config
        self.seed = seed
        self.snapshot_every = snapshot_every
        self.checker = Checker()
        self.nodes: dict[str, SimNode] = {}
        self.queue: deque[Message] = deque()
        self.blocked: set[tuple[str, str]] = set()
        self.filters: list[MessageFilter] = []
        self.delivered: list[Message] = []
        for nid in self.ids:
            self.add_node(nid, MemoryStorage(voters=self.ids))

    # -- nodes -----------------------------------------------------------------------
    def add_node(self, nid: str, storage: MemoryStorage | None = None) -> SimNode:
        """Start a node (a new one with empty storage unless ``storage`` is given)."""
        cfg = RaftConfig(id=nid, **self.config)  # type: ignore[arg-type]
        node = SimNode(
            cfg, storage or MemoryStorage(), self.seed * 1000 + len(self.nodes), self.checker,
            snapshot_every=self.snapshot_every,
        )
        self.nodes[nid] = node
        return node

    def add_learner(self, leader: str, nid: str) -> SimNode:
        """Start a fresh node and make it a learner through ``leader`` (stabilized)."""
        node = self.add_node(nid)
        self.core(leader).propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, nid))
        self.stabilize()
        return node

    def core(self, nid: str) -> RaftCore:
        core = self.nodes[nid].core
        assert core is not None, f"{nid} is down"
        return core

    def crash(self, nid: str) -> None:
        """Crash ``nid``: whatever it has not persisted (not yet run through Ready) is lost."""
        self.nodes[nid].crash()

    def restart(self, nid: str) -> None:
        self.nodes[nid].start()

    def leader(self) -> str | None:
        """The live leader of the highest term, if any."""
        best: tuple[int, str] | None = None
        for nid, n in self.nodes.items():
            if n.core is not None and n.core.role == Role.LEADER:
                if best is None or n.core.term > best[0]:
                    best = (n.core.term, nid)
        return best[1] if best else None

    def log_data(self, nid: str) -> list[bytes]:
        """Data of the normal, non-empty entries in ``nid``'s persisted log."""
        st = self.nodes[nid].storage
        if st.last_index() < st.first_index():
            return []
        ents = st.entries(st.first_index(), st.last_index() + 1, 1 << 62)
        return [e.data for e in ents if e.type == EntryType.NORMAL and e.data]

    # -- network ---------------------------------------------------------------------
    def isolate(self, nid: str) -> None:
        for other in self.nodes:
            if other != nid:
                self.blocked.add((nid, other))
                self.blocked.add((other, nid))

    def partition(self, *groups: Iterable[str]) -> None:
        gs = [set(g) for g in groups]
        for i, g in enumerate(gs):
            for h in gs[i + 1 :]:
                for a in g:
                    for b in h:
                        self.blocked.add((a, b))
                        self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()
        self.filters.clear()

    # -- driving ---------------------------------------------------------------------
    def flush(self) -> None:
        """Run the Ready loop of every live node; queue the messages they send."""
        for n in self.nodes.values():
            if n.core is not None and n.core.has_ready():
                self.queue.extend(n.handle_ready())

    def stabilize(self, max_messages: int = 100_000) -> int:
        """Deliver messages until none is left; returns how many were delivered."""
        count = 0
        self.flush()
        while self.queue:
            m = self.queue.popleft()
            dst = self.nodes.get(m.to)
            if (
                dst is None
                or dst.core is None
                or (m.frm, m.to) in self.blocked
                or not all(f(m) for f in self.filters)
            ):
                continue
            m = codec.decode_message(codec.encode_message(m))  # what the wire delivers
            self.delivered.append(m)
            dst.core.step(m)
            count += 1
            if count >= max_messages:
                raise RuntimeError("cluster did not stabilize")
            self.flush()
        return count

    def tick(self, n: int = 1, nodes: Iterable[str] | None = None) -> None:
        """Tick the given (default: all live) nodes ``n`` times, stabilizing after each."""
        ids = list(nodes) if nodes is not None else list(self.nodes)
        for _ in range(n):
            for nid in ids:
                node = self.nodes[nid]
                if node.core is not None:
                    node.core.tick()
            self.stabilize()

    def elect(self, nid: str) -> None:
        """Make ``nid`` campaign now and deliver everything."""
        self.core(nid).campaign()
        self.stabilize()
        assert self.core(nid).role == Role.LEADER, f"{nid} failed to become leader"

    def propose(self, nid: str, data: bytes) -> int:
        index = self.core(nid).propose(data)
        self.checker.proposed(nid, data)
        self.stabilize()
        return index
