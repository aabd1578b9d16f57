"""`StorageAdmission`: which proposals a node takes while storage runs short.

The policy of `doq.node.alarms` applied to one node's proposals. The alarms that count are
this node's own (its `StorageGauge`) and, on a leader, those its members reported in their
recent frames (the transport carries them): while any is on, a command that grows the
state (`grows_state`) is refused with `StorageFull`; near the limit (less headroom than
twice the reserve) the growth admitted since the last write is counted too (twice each
command's content: the log entry and the record), and the command that would pass the
limit turns the alarm on. Under log pressure (an alarm here, or a log above an eighth of
the limit) the driver compacts the log at once, down to `compact_floor`.

Runs on the node's event loop (`admit`, `refresh`, `written`); the gauge's own
measurements run on the writer thread (`doq.node.alarms`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from doq.node.alarms import Alarm, StorageGauge, grows_state, refusal
from doq.node.transport_base import RaftTransport
from doq.queues.commands import Command, Enqueue, EnqueueColumns, RestoreChunk
from doq.raft.core import RaftCore
from doq.raft.types import Role

log = logging.getLogger(__name__)


class StorageAdmission:
    """The storage alarms of one node and the refusals they make (see the module doc).
    `gauge` None: this node measures nothing and refuses nothing. `leading`: the core
    while this node leads (else None): its members' reports count then. `fresh_s`: how
    recent a member's report must be to count (an election timeout)."""

    def __init__(self, gauge: StorageGauge | None, transport: RaftTransport,
                 leading: Callable[[], RaftCore | None], fresh_s: float) -> None:
        self.gauge = gauge
        self.transport = transport
        self.leading = leading
        self.fresh_s = fresh_s
        self.alarms: tuple[Alarm, ...] = ()  # replaced whole by `refresh`
        self._admitted_bytes = 0  # growth admitted since the last write, counted near the limit

    def admit(self, command: Command) -> None:
        """Raise `StorageFull` for a command that grows the state while an alarm is on,
        or that would take the store past its limit. Call only with a gauge."""
        if not grows_state(command):
            return
        if self.alarms:
            raise refusal(self.alarms)
        gauge = self.gauge
        assert gauge is not None
        headroom = gauge.headroom_bytes
        if headroom < 2 * gauge.reserve_bytes:  # near the limit only: no cost otherwise
            self._admitted_bytes += 2 * content_bytes(command)
            if self._admitted_bytes >= headroom:  # it would pass the limit: the alarm goes on
                gauge.refused_near_limit()
                self.refresh()
                raise refusal(self.alarms)

    def refresh(self) -> None:
        """Recompute the alarms: this node's gauge and, while it leads, the alarms its
        members reported within `fresh_s` (a member silent for longer takes no entries
        meanwhile); tell the peers ours. Logs when they change."""
        gauge = self.gauge
        if gauge is None:
            return
        own = gauge.alarms
        self.transport.set_local_alarms([(a.reason, a.message) for a in own])
        alarms = list(own)
        leading = self.leading()
        if leading is not None:
            members = set(leading.voters) | set(leading.learners)
            for nid, reported in sorted(self.transport.peer_alarms(self.fresh_s).items()):
                if nid in members:
                    alarms.extend(Alarm(nid, reason, msg) for reason, msg in reported)
        alarms_t = tuple(alarms)
        if [(a.node_id, a.reason) for a in alarms_t] != [(a.node_id, a.reason) for a in self.alarms]:
            if alarms_t:
                log.warning("storage alarms on: %s", "; ".join(f"{a.node_id}: {a.reason}: {a.message}"
                                                                for a in alarms_t))
            else:
                log.info("storage alarms cleared: writes that grow the state are taken again")
        self.alarms = alarms_t

    def written(self) -> None:
        """A write ended (measured by the gauge): count admitted growth afresh, refresh."""
        if self.gauge is not None:
            self._admitted_bytes = 0
            self.refresh()

    def log_pressure(self) -> bool:
        """Compact the log at once (not every `snapshot_every` entries): a storage alarm
        is on here, or the log holds more than an eighth of the store's limit."""
        gauge = self.gauge
        return gauge is not None and (bool(gauge.alarms) or gauge.log_bytes > gauge.max_data_bytes // 8)


def compact_floor(core: RaftCore, node_id: str) -> int:
    """Under log pressure, the log may be discarded up to here: a follower keeps no
    entries for others; a leader keeps those its recently active followers still need
    (the others will get a snapshot)."""
    if core.role != Role.LEADER:
        return core.log.applied
    floor = core.log.applied
    for nid, pr in core.prs.items():
        if nid != node_id and pr.recent_active:
            floor = min(floor, pr.match)
    return floor


def content_bytes(command: Command) -> int:
    """About what a command adds to the store (its messages' contents, 64 B per record)."""
    if isinstance(command, Enqueue):
        return sum(len(i.content) + 64 for i in command.items)
    if isinstance(command, EnqueueColumns):
        return sum(len(c) + 64 for c in command.contents)
    if isinstance(command, RestoreChunk):
        return len(command.payload)
    return 64
