"""Replicated commands of the queue state machine.

A log entry's data is one encoded `CommandBatch`: the leader's `now_ms` stamp plus the
commands proposed together (group commit). Every node applies the batch in order with
`QueueMachine.apply(index, batch)`; results are only used on the node that proposed.

The restore commands (`RestoreChunk`, `RestoreCommit`, `RestoreAbort`) are the exception:
an online restore through the log proposes each alone in its entry, and the state store
applies such an entry itself (staging, then replacing the whole state), never the queue
machine (which refuses them as unknown commands).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from doq.queues.model import QueueSettings
from doq.queues.redrive import CancelRedrive, RedriveCommand, StartRedrive

__all__ = ["CancelRedrive", "StartRedrive"]  # the redrive commands live in doq.queues.redrive


@dataclass(frozen=True, slots=True)
class CreateQueue:
    """Create a queue. `max_queues` (0: no limit) is the proposer's `--max-queues`, carried
    in the command so every replica applies the same limit: a new queue is refused with
    LimitReached(QUEUE_LIMIT_REACHED) while that many queues exist."""

    name: str
    type: str  # "delayed" | "fair"
    settings: QueueSettings
    max_queues: int = 0


@dataclass(frozen=True, slots=True)
class UpdateQueue:
    name: str
    settings: QueueSettings


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    name: str


@dataclass(frozen=True, slots=True)
class PurgeQueue:
    name: str


@dataclass(slots=True)
class EnqueueItem:
    """One message to enqueue (not frozen: built per message on the hot path; never mutated)."""

    content: bytes
    group: str = ""
    priority: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    dedup_id: str = ""
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Enqueue many messages into one queue. Result: list[EnqueueResult | DoqError]."""

    queue: str
    items: list[EnqueueItem]


@dataclass(frozen=True, slots=True)
class EnqueueColumns:
    """Enqueue many messages into one queue, given column by column: message i is
    `contents[i]`; every other column is empty (each message takes the field's default:
    "", 0, {}) or holds one entry per message. Same rules per message as `Enqueue`; a
    column of another length refuses the command. Result: `EnqueueColumnsResult`."""

    queue: str
    contents: list[bytes]
    groups: list[str] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    dedup_ids: list[str] = field(default_factory=list)
    delays_ms: list[int] = field(default_factory=list)

    def to_items(self) -> list[EnqueueItem]:
        """The same messages one object each (the general path)."""
        n = len(self.contents)
        g = self.groups or [""] * n
        p = self.priorities or [0] * n
        md = self.metadata or [{}] * n
        d = self.dedup_ids or [""] * n
        dl = self.delays_ms or [0] * n
        return [EnqueueItem(*row) for row in zip(self.contents, g, p, md, d, dl, strict=True)]


@dataclass(frozen=True, slots=True)
class Dequeue:
    """Lease (or, with ack, remove) up to max_messages deliverable messages.

    Result: list[MessageView] (possibly empty), content filled by the apply loop.
    """

    queue: str
    max_messages: int = 1
    ack: bool = False
    visibility_timeout_ms: int = 0  # 0 = queue setting
    seed: int = 0
    """u64 the leader draws at random (`secrets`) for this command: the delivered leases'
    ids derive from it (`doq.queues.leaseids`), so another consumer cannot guess them.
    0 (entries written before seeds existed): sequential lease ids."""


@dataclass(frozen=True, slots=True)
class Ack:
    """Ack many in-flight messages. lease_ids[i] == 0 means "any lease". Result: list[None | DoqError]."""

    queue: str
    ids: list[int]
    lease_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Nack:
    """Return an in-flight message to the queue. Result: None.

    A plain nack counts the delivery: the message comes back after `delay_ms` (with
    `priority` if set), or is dead-lettered after its `max_attempts`-th delivery.
    `release=True` undoes the delivery instead, as if it had never happened: its attempt
    is not counted, it is ready at once at its old place and never dead-lettered
    (`delay_ms` must be 0 and `priority` None). Consumers release what they prefetched but
    did not hand to the application.
    """

    queue: str
    id: int
    lease_id: int = 0
    delay_ms: int = 0
    priority: int | None = None
    release: bool = False


@dataclass(frozen=True, slots=True)
class Touch:
    """Extend a lease; result is the new lease_expires_at_ms."""

    queue: str
    id: int
    lease_id: int = 0
    visibility_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class UpdatePriority:
    """Change a message's priority; result is the MessageView (without content)."""

    queue: str
    id: int
    priority: int


@dataclass(frozen=True, slots=True)
class DeleteMessage:
    """Remove a message. Result: None.

    `holder_only` (a caller that may not delete others' deliveries): an in-flight message
    is deleted only with its current `lease_id` (FailedPrecondition MESSAGE_IN_FLIGHT
    without one). A `lease_id` (either way) must be the current delivery's (StaleLease
    otherwise, also when the message is no longer in flight). Neither (an admin, entries
    written before leases were checked): any state."""

    queue: str
    id: int
    lease_id: int = 0
    holder_only: bool = False


@dataclass(frozen=True, slots=True)
class Tick:
    """No-op carrier of time: applying it expires due leases and releases due delays."""


@dataclass(frozen=True, slots=True)
class RestoreChunk:
    """Piece `seq` (0, 1, ...) of the online restore `restore_id`: staged in the replicated
    state, not applied, until its `RestoreCommit`. `payload` is opaque here (records
    encoded by `doq.storage.chunks`). Result: None, or a `DoqError` if the chunk is out of
    order (the staging is then broken and its commit fails)."""

    restore_id: bytes
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class RestoreCommit:
    """Replace the (empty) state by the `chunk_count` staged chunks of `restore_id`
    (`record_count` records in all) at once, or fail, and discard the staging either way.
    Later writes get versions above `to_version` (the restored chain's); the state adopts
    `cluster_id` (the chain's; "" keeps the state's). Result: a
    `doq.storage.state.RestoreOutcome`, or a `DoqError` (nothing restored)."""

    restore_id: bytes
    chunk_count: int
    record_count: int
    to_version: int
    cluster_id: str = ""


@dataclass(frozen=True, slots=True)
class RestoreAbort:
    """Discard the staging of `restore_id` (if it is the one staged). Result: None."""

    restore_id: bytes


@dataclass(frozen=True, slots=True)
class CreateKey:
    """Add a client key (`doq.queues.apikeys`): its id, the SHA-256 of its secret (the
    secret itself is never in the log) and its scopes; created at the batch's `now_ms`.
    Result: the `KeyRecord`, or a `DoqError` (bad id, hash or scope; the id exists)."""

    id: str
    secret_hash: bytes
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RevokeKey:
    """Remove a client key. Result: the removed `KeyRecord`, or `KeyNotFound`."""

    id: str


RestoreCommand = RestoreChunk | RestoreCommit | RestoreAbort


@dataclass(frozen=True, slots=True)
class CreateJoinToken:
    """A join token (doq/queues/join_tokens.py): `token_id` (16 bytes), the SHA-256 of its
    secret, usable until `expires_ms` of replicated time. Result: None."""

    token_id: bytes
    secret_hash: bytes
    expires_ms: int


@dataclass(frozen=True, slots=True)
class UseJoinToken:
    """Spend a join token for `node_id`. Result: None, or FailedPrecondition
    (INVALID_JOIN_TOKEN) if it is unknown, used, expired or the hash differs."""

    token_id: bytes
    secret_hash: bytes
    node_id: str

@dataclass(frozen=True, slots=True)
class SetGroupPolicy:
    """Override a fair queue's defaults for one group (`doq.queues.group_policy`):
    `weight` 1..MAX_GROUP_WEIGHT (0: back to the queue's default), `max_per_second`
    0 (no limit)..MAX_GROUP_RATE (-1: back to the queue's default); None leaves that one
    as it is. Result: the group's `GroupStats` after the command; FailedPrecondition
    (NOT_FAIR_QUEUE) on a delayed queue."""

    queue: str
    group: str
    weight: int | None = None
    max_per_second: int | None = None


Command = (
    CreateQueue | UpdateQueue | DeleteQueue | PurgeQueue | Enqueue | EnqueueColumns | Dequeue | Ack | Nack
    | Touch | UpdatePriority | DeleteMessage | Tick | RestoreChunk | RestoreCommit | RestoreAbort
    | CreateKey | RevokeKey | CreateJoinToken | UseJoinToken | SetGroupPolicy
    | RedriveCommand
)


@dataclass(frozen=True, slots=True)
class CommandBatch:
    now_ms: int
    commands: list[Command]
