"""Typed results of the doq client, and builders of request messages.

Results are small frozen dataclasses, except `Message`, a thin typed view over the
protobuf message or over a `MessageRow` of a columns frame (no copying; messages are the
hot path of consumers).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as PbMessage

from doq_client.errors import DoqClientError, InvalidArgument, from_pb_error, invalid_argument
from doq_proto.v1 import doq_pb2 as pb

Content = bytes | str
P = TypeVar("P", bound=PbMessage)

# The server's reason for a bad value of these fields (other fields: INVALID_ARGUMENT).
_FIELD_REASONS = {
    "priority": "INVALID_PRIORITY",
    "id": "INVALID_ID",
    "ids": "INVALID_ID",
    "ack_ids": "INVALID_ID",
    "delay_ms": "INVALID_DELAY",
    "visibility_timeout_ms": "INVALID_TIMEOUT",
    "max_messages": "INVALID_MAX",
    "wait_ms": "INVALID_WAIT",
}
_RANGES = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
}


def build(cls: type[P], **fields: Any) -> P:
    """`cls(**fields)`; a value protobuf refuses as out of range (a priority beyond int64,
    a negative id or delay_ms, ...) raises the client's `InvalidArgument` instead of a bare
    `ValueError`, with the reason the server gives for that field. Nothing is sent."""
    try:
        return cls(**fields)
    except ValueError:
        raise _out_of_range(cls, fields) from None


def _refuses(cls: type[PbMessage], name: str, value: Any) -> bool:
    try:
        cls(**{name: value})
    except ValueError:
        return True
    return False


def _out_of_range(cls: type[PbMessage], fields: dict[str, Any]) -> InvalidArgument:
    """The error naming the field of `fields` that `cls` refuses (error path only)."""
    name, value = next(((k, v) for k, v in fields.items() if _refuses(cls, k, v)), next(iter(fields.items())))
    fd = cls.DESCRIPTOR.fields_by_name.get(name)
    bounds = _RANGES.get(fd.type) if fd is not None else None
    what = f"each of {name}" if isinstance(value, (list, tuple)) else name
    reason = "INVALID_SETTINGS" if cls is pb.QueueSettings else _FIELD_REASONS.get(name, "INVALID_ARGUMENT")
    if bounds is None:  # not an integer field (e.g. a str that is not valid UTF-8)
        return invalid_argument(f"invalid {what}: {value!r}", reason)
    return invalid_argument(f"{what} must be an integer within {bounds[0]}..{bounds[1]}, not {value!r}", reason)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Per-queue settings; 0 / "" mean the server default (see the .proto comments)."""

    visibility_timeout_ms: int = 0
    max_attempts: int = 0
    dead_letter_queue: str = ""
    max_unacked_per_group: int = 0
    dedup_window_ms: int = 0
    default_group_weight: int = 0  # fair queues: a group's turns per round unless its own (0 = 1)
    default_group_max_per_second: int = 0  # fair queues: a group's rate unless its own (0 = no limit)

    def to_pb(self) -> pb.QueueSettings:
        return build(
            pb.QueueSettings,
            visibility_timeout_ms=self.visibility_timeout_ms,
            max_attempts=self.max_attempts,
            dead_letter_queue=self.dead_letter_queue,
            max_unacked_per_group=self.max_unacked_per_group,
            dedup_window_ms=self.dedup_window_ms,
            default_group_weight=self.default_group_weight,
            default_group_max_per_second=self.default_group_max_per_second,
        )

    @classmethod
    def from_pb(cls, s: pb.QueueSettings) -> QueueSettings:
        return cls(
            s.visibility_timeout_ms,
            s.max_attempts,
            s.dead_letter_queue,
            s.max_unacked_per_group,
            s.dedup_window_ms,
            s.default_group_weight,
            s.default_group_max_per_second,
        )


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A fair queue's group: backlog (`ready`), `in_flight`, and the `weight` (turns per
    round) and `max_per_second` (0 = no limit) in effect: its own if `overridden`, else
    the queue's defaults. `throttled`: over its rate now (skipped until it refills)."""

    group: str
    ready: int = 0
    in_flight: int = 0
    weight: int = 1
    max_per_second: int = 0
    throttled: bool = False
    overridden: bool = False

    @classmethod
    def from_pb(cls, g: pb.GroupInfo) -> GroupInfo:
        return cls(g.group, g.ready, g.in_flight, g.weight, g.max_per_second, g.throttled, g.overridden)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of a queue at the time of the call."""

    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0
    total: int = 0

    @classmethod
    def from_pb(cls, s: pb.QueueStats) -> QueueStats:
        return cls(s.ready, s.delayed, s.in_flight, s.dead, s.total)


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue: name, type ("delayed" | "fair"), settings and counts."""

    name: str
    type: str
    settings: QueueSettings = field(default_factory=QueueSettings)
    stats: QueueStats = field(default_factory=QueueStats)

    @classmethod
    def from_pb(cls, q: pb.Queue) -> Queue:
        return cls(q.name, q.type, QueueSettings.from_pb(q.settings), QueueStats.from_pb(q.stats))


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """A stored message's id; `duplicate` when a dedup_id matched an earlier enqueue."""

    id: int
    duplicate: bool = False
    group: str = ""
    priority: int = 0
    deliver_at_ms: int = 0

    @classmethod
    def from_pb(cls, r: pb.EnqueueResponse) -> EnqueueResult:
        return cls(r.id, r.duplicate, r.group, r.priority, r.deliver_at_ms)


@dataclass(frozen=True, slots=True)
class AckResult:
    """Outcome of one id of `ack_batch`: `error` is None when it was acked."""

    id: int
    error: DoqClientError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class MessageRow(NamedTuple):
    """One message of a frame received in columns (`doq.v1.MessageColumns`): the fields of
    `doq.v1.Message`, built for a whole frame by C calls (no protobuf object per message)."""

    id: int
    queue_name: str
    content: bytes
    group: str
    priority: int
    metadata: Mapping[str, str]
    attempts: int
    deliver_at_ms: int
    lease_expires_at_ms: int
    enqueued_at_ms: int
    state: str
    lease_id: int
    dedup_id: str

    def to_pb(self) -> pb.Message:
        return pb.Message(**{**self._asdict(), "metadata": dict(self.metadata)})


_new_row = functools.partial(tuple.__new__, MessageRow)
_NO_METADATA: Mapping[str, str] = MappingProxyType({})


def rows_from_columns(cols: pb.MessageColumns) -> list[MessageRow]:
    """The messages of a columns frame, in order. Raises ValueError if a column is
    neither empty nor one entry per message."""
    n = len(cols.ids)

    def col(values: Any, default: Any) -> Any:
        return values if len(values) else repeat(default, n)

    metadata = [MappingProxyType(dict(m.entries)) for m in cols.metadata] if len(cols.metadata) else None
    return list(map(_new_row, zip(
        cols.ids, repeat(cols.queue_name, n), cols.contents, col(cols.groups, ""),
        col(cols.priorities, 0), metadata if metadata is not None else repeat(_NO_METADATA, n),
        cols.attempts, col(cols.deliver_at_ms, 0), cols.lease_expires_at_ms, cols.enqueued_at_ms,
        repeat("in_flight", n), cols.lease_ids, col(cols.dedup_ids, ""), strict=True,
    )))


class Message:
    """A delivered or fetched message: a typed, read-only view over `doq.v1.Message` (`pb`),
    or over a `MessageRow` of a frame received in columns (`pb` is then built on first use).

    Pass `id` and `lease_id` to ack/nack/touch; `lease_id` changes with every delivery.
    """

    __slots__ = ("_m", "stream_tag")

    def __init__(self, msg: pb.Message | MessageRow, stream_tag: object | None = None) -> None:
        self._m = msg
        self.stream_tag = stream_tag  # the consumer stream that handed it out (None: none)

    @property
    def pb(self) -> pb.Message:
        """The message as a `doq.v1.Message`."""
        m = self._m
        if isinstance(m, MessageRow):
            m = self._m = m.to_pb()
        return m

    @property
    def id(self) -> int:
        return self._m.id

    @property
    def queue_name(self) -> str:
        return self._m.queue_name

    @property
    def content(self) -> bytes:
        return self._m.content

    @property
    def text(self) -> str:
        """`content` decoded as UTF-8."""
        return self._m.content.decode()

    @property
    def group(self) -> str:
        return self._m.group

    @property
    def priority(self) -> int:
        return self._m.priority

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._m.metadata)

    @property
    def attempts(self) -> int:
        return self._m.attempts

    @property
    def deliver_at_ms(self) -> int:
        return self._m.deliver_at_ms

    @property
    def lease_expires_at_ms(self) -> int:
        return self._m.lease_expires_at_ms

    @property
    def enqueued_at_ms(self) -> int:
        return self._m.enqueued_at_ms

    @property
    def state(self) -> str:
        """ "ready" | "delayed" | "in_flight"."""
        return self._m.state

    @property
    def lease_id(self) -> int:
        return self._m.lease_id

    @property
    def dedup_id(self) -> str:
        return self._m.dedup_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self.pb == other.pb

    def __hash__(self) -> int:
        m = self._m
        return hash((m.queue_name, m.id, m.lease_id))

    def __repr__(self) -> str:
        return (
            f"Message(id={self.id}, queue={self.queue_name!r}, state={self.state!r}, "
            f"priority={self.priority}, group={self.group!r}, attempts={self.attempts}, "
            f"content={self.content[:32]!r})"
        )


def to_bytes(content: Content) -> bytes:
    """Message content as bytes (str is encoded as UTF-8)."""
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise TypeError(f"content must be bytes or str, not {type(content).__name__}")


def enqueue_request(
    queue: str,
    content: Content,
    *,
    group: str = "",
    priority: int = 0,
    metadata: Mapping[str, str] | None = None,
    dedup_id: str = "",
    delay_ms: int = 0,
) -> pb.EnqueueRequest:
    """Build one `EnqueueRequest` (also usable in `enqueue_batch` and producers).

    Raises `InvalidArgument` for a value out of its field's range (e.g. priority).
    """
    return build(
        pb.EnqueueRequest,
        queue_name=queue,
        content=to_bytes(content),
        group=group,
        priority=priority,
        metadata=metadata or None,
        dedup_id=dedup_id,
        delay_ms=delay_ms,
    )


def nack_request(
    queue: str,
    id_: int,
    *,
    lease_id: int = 0,
    delay_ms: int = 0,
    priority: int | None = None,
    release: bool = False,
) -> pb.NackRequest:
    """Build one `NackRequest` (`release`: undo the delivery, see the .proto)."""
    if priority is None:
        return build(pb.NackRequest, queue_name=queue, id=id_, lease_id=lease_id,
                     delay_ms=delay_ms, release=release)
    return build(pb.NackRequest, queue_name=queue, id=id_, lease_id=lease_id, delay_ms=delay_ms,
                 priority=priority, release=release)


def enqueue_result(r: pb.EnqueueResponse) -> EnqueueResult:
    """An `EnqueueResult`, or raise the item's error."""
    if not r.success:
        raise from_pb_error(r.error)
    return EnqueueResult(r.id, r.duplicate, r.group, r.priority, r.deliver_at_ms)


def enqueue_outcome(r: pb.EnqueueResponse) -> EnqueueResult | DoqClientError:
    """An `EnqueueResult` or the item's error (for batches: its queue's failure)."""
    if not r.success:
        return from_pb_error(r.error)
    return EnqueueResult(r.id, r.duplicate, r.group, r.priority, r.deliver_at_ms)
