"""Plain data types of the Raft core: entries, messages, states, snapshots, errors.

Everything here is a slotted dataclass or an IntEnum so the driver can encode it
trivially (see :mod:`doq.raft.codec`). Node ids are non-empty strings; ``NONE`` ("")
means "no node".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

NONE = ""
"""The empty node id: no leader known, no vote cast."""


class EntryType(IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1


class MessageType(IntEnum):
    APP = 1
    APP_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5
    PRE_VOTE_RESP = 6
    SNAP = 7
    HEARTBEAT = 8
    HEARTBEAT_RESP = 9
    TIMEOUT_NOW = 10
    READ_INDEX = 11
    READ_INDEX_RESP = 12
    SNAP_RESP = 13


class Role(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
    PRE_CANDIDATE = 3


class ConfChangeType(IntEnum):
    ADD_NODE = 0
    """Add a voter, or promote an existing learner to voter."""
    ADD_LEARNER = 1
    REMOVE_NODE = 2


@dataclass(slots=True, frozen=True)
class Entry:
    """One log entry. ``data`` of a CONF_CHANGE entry is an encoded :class:`ConfChange`."""

    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def size(self) -> int:
        return len(self.data) + 24


@dataclass(slots=True, frozen=True)
class HardState:
    """What must be durable before any message of the same Ready is sent."""

    term: int = 0
    vote: str = NONE
    commit: int = 0


@dataclass(slots=True, frozen=True)
class SoftState:
    """Volatile state the driver may want to observe (who leads, our role)."""

    lead: str = NONE
    role: Role = Role.FOLLOWER


@dataclass(slots=True, frozen=True)
class ConfState:
    """Cluster membership: voters and learners, each a sorted tuple of node ids."""

    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()

    def changed(self, cc: ConfChange) -> ConfState:
        """The membership after the committed change ``cc`` (idempotent: applying a change
        again, or the changes already in a snapshot's conf state again in order, gives the
        same membership)."""
        voters = set(self.voters)
        learners = set(self.learners)
        nid = cc.node_id
        if cc.type == ConfChangeType.ADD_NODE:
            learners.discard(nid)
            voters.add(nid)
        elif cc.type == ConfChangeType.ADD_LEARNER:
            if nid not in voters:
                learners.add(nid)
        else:
            voters.discard(nid)
            learners.discard(nid)
        return ConfState(tuple(sorted(voters)), tuple(sorted(learners)))


@dataclass(slots=True, frozen=True)
class ConfChange:
    """A single-server membership change, proposed via ``RaftCore.propose_conf_change``.

    ``context`` is opaque to the core and travels with the entry to every member (the
    driver puts the member's addresses there)."""

    type: ConfChangeType
    node_id: str
    context: bytes = b""


@dataclass(slots=True, frozen=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(slots=True, frozen=True)
class Snapshot:
    """An application snapshot covering the log up to ``meta.index`` (inclusive)."""

    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    data: bytes = b""

    def is_empty(self) -> bool:
        return self.meta.index == 0


@dataclass(slots=True)
class Message:
    """A message between peers. Fields not used by a type keep their defaults.

    APP: ``index``/``log_term`` are the previous entry, ``entries`` the new ones,
    ``commit`` the leader's commit. APP_RESP: ``index`` is the last matching index, or
    on ``reject`` the rejected previous index with ``reject_hint``/``log_term`` as the
    conflict hint. VOTE/PRE_VOTE: ``index``/``log_term`` are the candidate's last entry.
    SNAP: one chunk ``data`` at ``offset`` of the snapshot ``snapshot``; ``done`` marks the
    last chunk. HEARTBEAT(_RESP)/READ_INDEX(_RESP): ``context`` carries the read context.
    """

    type: MessageType
    to: str
    frm: str
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""
    snapshot: SnapshotMeta | None = None
    data: bytes = b""
    offset: int = 0
    done: bool = False


@dataclass(slots=True, frozen=True)
class ReadState:
    """A linearizable read may be served once the local applied index >= ``index``."""

    index: int
    context: bytes


@dataclass(slots=True)
class Ready:
    """Work the driver must do, in this order (see docs/raft.md, "Ready contract").

    1. ``snapshot`` (if any): persist it and install it in the state machine;
    2. ``entries`` and ``hard_state`` (if any): persist atomically (fsync if ``must_sync``,
       which is set whenever entries, a snapshot, the term or the vote are to be persisted);
    3. ``messages``: send (only after 1 and 2 are durable);
    4. ``committed_entries``: apply in order (conf changes via ``apply_conf_change``);
    5. call ``RaftCore.advance(ready)``.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed_entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    must_sync: bool = False


class RaftError(Exception):
    """Base class of errors raised by the Raft core."""


class NotLeader(RaftError):
    """This node is not the leader; ``leader_hint`` is the known leader or None."""

    def __init__(self, leader_hint: str | None) -> None:
        super().__init__(f"not leader (leader hint: {leader_hint})")
        self.leader_hint = leader_hint


class ProposalDropped(RaftError):
    """The leader refused the proposal (transfer in progress, conf change pending...)."""


class CompactedError(RaftError):
    """The requested index is behind the storage's snapshot."""


class UnavailableError(RaftError):
    """The requested index is beyond the storage's last index."""


class SnapshotTemporarilyUnavailable(RaftError):
    """The storage produces its snapshot's data on demand and it is not ready yet (as
    etcd-raft's ErrSnapshotTemporarilyUnavailable): the leader sends nothing to that
    follower now and tries again on a later heartbeat response."""


class InvariantError(RaftError):
    """An internal invariant broke (e.g. a committed entry would be overwritten)."""
