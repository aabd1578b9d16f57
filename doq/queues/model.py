"""Domain types of the queue state machine: settings, message views, counts.

Pure data (no I/O). The service facade returns these; adapters map them to protobuf/JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from doq.errors import DoqError

DEFAULT_VISIBILITY_TIMEOUT_MS = 30_000
DEFAULT_DEDUP_WINDOW_MS = 300_000


class QueueType(str, Enum):  # noqa: UP042 (str() stays the member name)
    DELAYED = "delayed"
    FAIR = "fair"


class MessageState(str, Enum):  # noqa: UP042
    READY = "ready"
    DELAYED = "delayed"
    IN_FLIGHT = "in_flight"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Per-queue settings; 0 / "" mean the documented default."""

    visibility_timeout_ms: int = 0
    max_attempts: int = 0  # 0 = unlimited deliveries
    dead_letter_queue: str = ""
    max_unacked_per_group: int = 0  # fair queues only; 0 = no limit
    dedup_window_ms: int = 0
    # fair queues only (doq.queues.group_policy): a group's turns per round (0 = 1) and its
    # deliveries per second (0 = no limit), unless the group overrides them
    default_group_weight: int = 0
    default_group_max_per_second: int = 0

    @property
    def effective_visibility_timeout_ms(self) -> int:
        return self.visibility_timeout_ms or DEFAULT_VISIBILITY_TIMEOUT_MS

    @property
    def effective_dedup_window_ms(self) -> int:
        return self.dedup_window_ms or DEFAULT_DEDUP_WINDOW_MS


@dataclass(frozen=True, slots=True)
class QueueStats:
    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0

    @property
    def total(self) -> int:
        return self.ready + self.delayed + self.in_flight


@dataclass(frozen=True, slots=True)
class QueueCounters:
    """Messages that went through a queue since this node loaded it (cumulative; not
    replicated state: in memory only, they start from 0 when the node starts). Rates are
    their differences over time; every node counts the same commands, so any node's rates
    are the cluster's."""

    enqueued: int = 0  # new messages (duplicates of a dedup id not counted)
    delivered: int = 0  # deliveries: leased, or removed at once by a dequeue with ack
    acked: int = 0  # settled: acked, or removed at once by a dequeue with ack


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One group of a fair queue: its backlog (ready to deliver), its messages in flight
    and its policy (weight, rate) in effect."""

    group: str
    ready: int
    in_flight: int
    weight: int = 1  # deliveries per turn of the round-robin (the override, else the queue's default)
    max_per_second: int = 0  # 0 = no limit (the override, else the queue's default)
    throttled: bool = False  # over its rate now: skipped until its bucket refills
    overridden: bool = False  # the group has its own weight or rate (PUT .../groups/{group})


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    type: QueueType
    settings: QueueSettings
    stats: QueueStats
    # not replicated state: a rebuilt replica starts from 0, so it never takes part in equality
    counters: QueueCounters = field(default=QueueCounters(), compare=False)


@dataclass(slots=True)
class MessageView:
    """A message as returned to clients. `content` is filled from storage by the apply loop."""

    id: int
    queue_name: str
    group: str
    priority: int
    attempts: int
    deliver_at_ms: int
    lease_expires_at_ms: int
    enqueued_at_ms: int
    state: MessageState
    lease_id: int = 0
    dedup_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    content: bytes = b""


class EnqueueColumnsResult:
    """Outcome of an `EnqueueColumns` command, column by column (built once per command).

    - `ids[i]`: message i's id (the original's for a duplicate), 0 if it failed;
    - `duplicates`: positions whose dedup_id was seen within the window (nothing stored);
    - `deliver_at_ms`: empty when every message is deliverable at once (the common case),
      else one entry per message (0 where deliverable at once, as in `EnqueueResult`);
    - `errors`: position -> the error of a message that failed alone.
    """

    __slots__ = ("ids", "duplicates", "deliver_at_ms", "errors")

    def __init__(self, ids: Sequence[int], duplicates: list[int] | None = None,
                 deliver_at_ms: list[int] | None = None,
                 errors: dict[int, DoqError] | None = None) -> None:
        self.ids = ids
        self.duplicates = duplicates or []
        self.deliver_at_ms = deliver_at_ms or []
        self.errors = errors or {}

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"EnqueueColumnsResult(ids={self.ids!r}, duplicates={self.duplicates!r}, "
                f"deliver_at_ms={self.deliver_at_ms!r}, errors={self.errors!r})")


@dataclass(slots=True)
class EnqueueResult:
    """Built per message on the hot path (not frozen: cheaper to construct); never mutated."""

    id: int
    duplicate: bool
    group: str
    priority: int
    deliver_at_ms: int
