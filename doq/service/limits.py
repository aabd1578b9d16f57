"""Input validation shared by every adapter (gRPC and HTTP call the facade), checked
before anything is proposed. The bounds themselves are defined once, in
`doq.queues.limits` (the state machine enforces the same ones)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from doq.errors import InvalidArgument, TooLarge
from doq.queues import limits as L
from doq.queues.commands import EnqueueItem
from doq.queues.model import QueueSettings, QueueType

DEFAULT_MAX_STREAM_PREFETCH = 100_000
DEFAULT_MAX_STREAM_PENDING_ACKS = 10_000
DEFAULT_MAX_QUEUES = 10_000
BODY_SLACK = 64 * 1024
BATCH_BODY_MIN = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """A node's request and stream limits: the one settings object of bounds, held by the
    facade's door (`doq.service.door.Door.limits`) and built from `doq serve`'s settings.
    `max_batch_messages` and `max_wait_ms` must not exceed the bounds of
    doq.queues.limits, which the state machine enforces.

    Per stream (what the node holds for one client):
    - `max_stream_prefetch`: the largest `prefetch` of a dequeue stream, and the most free
      credits it may hold (explicit credits beyond it: INVALID_ARGUMENT);
    - `max_batch_messages`: also the largest `max_batch` of a dequeue stream and the most
      acks plus nacks in one of its requests;
    - `max_stream_pending_acks`: acks, nacks and releases of a dequeue stream proposed and
      not yet committed; at the bound the node stops reading the stream (gRPC flow
      control holds the client) until commits bring it under;
    - `stream_window_messages` / `stream_window_frames`: requests of an EnqueueStream /
      EnqueueBatchStream proposed and not yet answered; at the bound the node stops
      reading the stream.
    - `stream_admitted_queues`: queue names a producer stream remembers as admitted by
      the door (`doq.service.door.AdmittedQueues`: emptied when full, then each name is
      admitted again), so a stream naming ever new queues holds bounded memory.

    Of the state: `max_queues`, the most queues; a `CreateQueue` carries it, so the state
    machine of every replica refuses the same creations (the leader's setting applies).

    Per connection and request: the HTTP server's own settings (uvicorn's connection count
    and keep-alive, the header and read bounds of `doq.service.http.protocol`) and the
    largest request body / gRPC message (`body_limits`).
    """

    max_message_bytes: int = 1024 * 1024
    max_metadata_bytes: int = 16 * 1024
    max_metadata_entries: int = 64
    max_group_bytes: int = 256
    max_dedup_id_bytes: int = 256
    max_batch_messages: int = L.MAX_BATCH_MESSAGES
    max_wait_ms: int = L.MAX_WAIT_MS
    max_stream_prefetch: int = DEFAULT_MAX_STREAM_PREFETCH
    max_stream_pending_acks: int = DEFAULT_MAX_STREAM_PENDING_ACKS
    stream_window_messages: int = 8192
    stream_window_frames: int = 64
    stream_admitted_queues: int = 1024
    # -- connections (HTTP) and whole requests (HTTP and gRPC) --
    max_connections: int = 1000  # HTTP connections (past it: 503); gRPC connections (past it: closed)
    max_calls: int = 4096  # gRPC calls in progress, streams and long polls included (past it: RESOURCE_EXHAUSTED)
    max_calls_per_key: int = 1024  # of them, calls of one client key (doq.auth.grpc_door.KeyCalls)
    max_header_bytes: int = 64 * 1024  # request line and headers; past it 431, connection closed
    max_headers: int = 100
    read_timeout_ms: int = 30_000  # a request's headers or body idle this long: connection closed
    keep_alive_ms: int = 5_000  # an idle keep-alive connection is closed after this
    max_restore_bytes: int = 4 << 30  # POST /db/restore upload (spooled to disk), at most
    # -- the state --
    max_queues: int = DEFAULT_MAX_QUEUES  # carried in CreateQueue (0: no limit): the proposer's applies

    def body_limits(self) -> tuple[int, int]:
        """(single-message body limit, batch body limit) in bytes. A single message may
        arrive base64-encoded (4/3 of its size) plus its JSON envelope; a batch gets at
        least 16 MiB. The batch limit is also the largest gRPC request a node receives."""
        single = self.max_message_bytes * 4 // 3 + BODY_SLACK
        return single, max(BATCH_BODY_MIN, 4 * self.max_message_bytes)


def check_queue_name(name: str, what: str = "queue name") -> str:
    """`name` if it is a valid queue name as a whole (a trailing newline is not valid)."""
    if not L.is_queue_name(name):
        raise InvalidArgument(f"invalid {what} {name!r}: {L.QUEUE_NAME_RULE}", reason="INVALID_QUEUE_NAME")
    return name


def check_queue_type(type_: str) -> QueueType:
    try:
        return QueueType(type_ or "delayed")
    except ValueError:
        raise InvalidArgument(
            f"invalid queue type {type_!r}: expected 'delayed' or 'fair'", reason="INVALID_QUEUE_TYPE"
        ) from None


def check_settings(s: QueueSettings) -> QueueSettings:
    for what, value, hi in (
        ("visibility_timeout_ms", s.visibility_timeout_ms, L.MAX_VISIBILITY_TIMEOUT_MS),
        ("max_attempts", s.max_attempts, L.MAX_ATTEMPTS),
        ("max_unacked_per_group", s.max_unacked_per_group, L.MAX_UNACKED_PER_GROUP),
        ("dedup_window_ms", s.dedup_window_ms, L.MAX_DEDUP_WINDOW_MS),
        ("default_group_weight", s.default_group_weight, L.MAX_GROUP_WEIGHT),
        ("default_group_max_per_second", s.default_group_max_per_second, L.MAX_GROUP_RATE),
    ):
        if not 0 <= value <= hi:
            raise InvalidArgument(f"{what} must be within 0..{hi}", reason="INVALID_SETTINGS")
    if s.dead_letter_queue:
        check_queue_name(s.dead_letter_queue, "dead_letter_queue")
    return s


def check_group_policy(group: str, weight: int | None, max_per_second: int | None, reset: bool,
                       limits: Limits) -> None:
    """A group override: a group name as messages carry it ("" is the default group), a
    weight 1..MAX_GROUP_WEIGHT and a rate 0..MAX_GROUP_RATE (None: unchanged), at least one
    of them (neither: nothing changes), or `reset` alone."""
    if group:
        check_label(group, "group", limits.max_group_bytes, "INVALID_GROUP")
    elif not isinstance(group, str):
        raise InvalidArgument("group must be a string", reason="INVALID_GROUP")
    if reset:
        if weight is not None or max_per_second is not None:
            raise InvalidArgument("a reset takes no weight and no max_per_second", reason="INVALID_GROUP_POLICY")
        return
    if weight is not None and (type(weight) is not int or not 1 <= weight <= L.MAX_GROUP_WEIGHT):
        raise InvalidArgument(f"weight must be an integer within 1..{L.MAX_GROUP_WEIGHT}",
                              reason="INVALID_GROUP_POLICY")
    if max_per_second is not None and (type(max_per_second) is not int
                                       or not 0 <= max_per_second <= L.MAX_GROUP_RATE):
        raise InvalidArgument(f"max_per_second must be an integer within 0..{L.MAX_GROUP_RATE} (0: no limit)",
                              reason="INVALID_GROUP_POLICY")


def check_id(id_: int) -> int:
    if not isinstance(id_, int) or not 0 < id_ < 2**64:
        raise InvalidArgument(f"invalid message id {id_!r}", reason="INVALID_ID")
    return id_


def check_lease_ids(ids: Sequence[int], lease_ids: Sequence[int]) -> None:
    """An ack names its leases with no lease_ids at all or one per id (0 = any lease)."""
    if lease_ids and len(lease_ids) != len(ids):
        raise InvalidArgument(
            f"lease_ids must be empty or as long as ids ({len(lease_ids)} for {len(ids)} ids)",
            reason="INVALID_LEASE_IDS",
        )


def check_priority(priority: int) -> int:
    if not isinstance(priority, int) or not L.PRIORITY_MIN <= priority <= L.PRIORITY_MAX:
        raise InvalidArgument("priority must be a signed 64-bit integer", reason="INVALID_PRIORITY")
    return priority


def check_delay_ms(delay_ms: int, what: str = "delay_ms") -> int:
    if not isinstance(delay_ms, int) or not 0 <= delay_ms <= L.MAX_DELAY_MS:
        raise InvalidArgument(f"{what} must be within 0..{L.MAX_DELAY_MS}", reason="INVALID_DELAY")
    return delay_ms


def check_visibility_timeout_ms(ms: int) -> int:
    if not isinstance(ms, int) or not 0 <= ms <= L.MAX_VISIBILITY_TIMEOUT_MS:
        raise InvalidArgument(
            f"visibility_timeout_ms must be within 0..{L.MAX_VISIBILITY_TIMEOUT_MS}", reason="INVALID_TIMEOUT"
        )
    return ms


def check_label(value: str, what: str, max_bytes: int, reason: str) -> str:
    """A group or dedup id: at most `max_bytes` of UTF-8, no NUL character (names and ids
    are compared and shown as text; content and metadata may hold any character)."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode text (a lone surrogate)", reason=reason) from None
    if size > max_bytes:
        raise InvalidArgument(f"{what} is longer than {max_bytes} bytes", reason=reason)
    if "\x00" in value:
        raise InvalidArgument(f"{what} contains a NUL character (U+0000)", reason=reason)
    return value


def columns_pass(contents: Sequence[bytes], groups: Sequence[str], priorities: Sequence[int],
                 dedup_ids: Sequence[str], limits: Limits) -> bool:
    """Whether every message of these columns (metadata and delays empty) passes
    `check_item`, told by a few C-speed passes over each column: True only if so. False
    when it cannot tell (a value of another type, a long label): the caller then checks
    each message (`check_item`), which says which fail and why."""
    if contents and max(map(len, contents)) > limits.max_message_bytes:
        return False
    for labels, max_bytes in ((groups, limits.max_group_bytes), (dedup_ids, limits.max_dedup_id_bytes)):
        if not labels:
            continue
        try:
            joined = "".join(labels)
        except TypeError:  # not all text
            return False
        # <= 4 UTF-8 bytes a char: within bounds when the lengths pass; no NUL; encodable
        if max(map(len, labels)) * 4 > max_bytes or "\x00" in joined or not (joined.isascii() or _encodes(joined)):
            return False
    return not priorities or (set(map(type, priorities)) == {int}
                              and L.PRIORITY_MIN <= min(priorities) and max(priorities) <= L.PRIORITY_MAX)


def _encodes(text: str) -> bool:
    """Whether `text` is valid Unicode text (no lone surrogate): UTF-8 encodes it."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_item(item: EnqueueItem, limits: Limits) -> EnqueueItem:
    """Validate one message to enqueue; raises InvalidArgument / TooLarge."""
    if len(item.content) > limits.max_message_bytes:
        raise TooLarge(
            f"message content is {len(item.content)} bytes; the limit is {limits.max_message_bytes}",
            reason="MESSAGE_TOO_LARGE",
        )
    if item.group:
        check_label(item.group, "group", limits.max_group_bytes, "INVALID_GROUP")
    if item.dedup_id:
        check_label(item.dedup_id, "dedup_id", limits.max_dedup_id_bytes, "INVALID_DEDUP_ID")
    if item.metadata:
        if len(item.metadata) > limits.max_metadata_entries:
            raise InvalidArgument(
                f"metadata has more than {limits.max_metadata_entries} entries", reason="METADATA_TOO_LARGE"
            )
        try:
            size = sum(len(k.encode()) + len(v.encode()) for k, v in item.metadata.items())
        except UnicodeEncodeError:
            raise InvalidArgument("metadata is not valid Unicode text (a lone surrogate)",
                                  reason="INVALID_METADATA") from None
        if size > limits.max_metadata_bytes:
            raise InvalidArgument(
                f"metadata is {size} bytes; the limit is {limits.max_metadata_bytes}", reason="METADATA_TOO_LARGE"
            )
    check_priority(item.priority)
    check_delay_ms(item.delay_ms)
    return item
