"""Pure Raft core (etcd-raft style): no I/O, no clock; see docs/raft.md."""

from doq.raft.config import KNOWN_BUGS, RaftConfig
from doq.raft.core import CAMPAIGN_TRANSFER, RaftCore
from doq.raft.progress import Progress, ProgressState
from doq.raft.storage import MemoryStorage, RaftLogStorage
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
    RaftError,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SnapshotTemporarilyUnavailable,
    SoftState,
    UnavailableError,
)

__all__ = [
    "CAMPAIGN_TRANSFER", "KNOWN_BUGS", "NONE", "CompactedError", "ConfChange",
    "ConfChangeType", "ConfState", "Entry", "EntryType", "HardState", "InvariantError",
    "MemoryStorage", "Message", "MessageType", "NotLeader", "Progress", "ProgressState",
    "ProposalDropped", "RaftConfig", "RaftCore", "RaftError", "RaftLogStorage", "Ready",
    "ReadState", "Role", "Snapshot", "SnapshotMeta",
    "SnapshotTemporarilyUnavailable", "SoftState", "UnavailableError",
]
