"""Request and response models of the HTTP gateway (they define the OpenAPI document).

Requests are parsed with `Model.model_validate_json` (strict types, unknown fields
rejected). Responses are declared with these models for the document but encoded by the
small `*_json` functions below (no per-request pydantic validation on the hot paths).

Ids (message ids, lease ids) are unsigned 64-bit integers: responses carry them as JSON
strings so JavaScript keeps their precision; requests accept a string of digits or a
JSON integer.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import to_json

from doq.errors import DoqError, InvalidArgument
from doq.queues import limits as L
from doq.queues.commands import EnqueueItem
from doq.queues.model import EnqueueResult, GroupStats, MessageView, QueueInfo, QueueSettings
from doq.service.limits import Limits

UINT64_MAX = 2**64 - 1
ID_PATTERN = r"^[0-9]{1,20}$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # standard, padded
NO_NUL = "^[^\\u0000]*$"  # JSON Schema: a string without NUL (groups and dedup ids)
PATH_ID_PATTERN = r"^0*[1-9][0-9]{0,19}$"  # a message id in a path: not 0 (ids start at 1)
# Bounds come from doq.queues.limits (enforced by the service and the machine): the models
# only declare them, so the document and the answers cannot disagree.
MAX_BATCH = L.MAX_BATCH_MESSAGES
MAX_WAIT_MS = L.MAX_WAIT_MS
_LIMITS = Limits()  # the defaults a node runs with (per-byte bounds; max_length counts characters)


def _coerce_id(value: object) -> int:
    """Accept a JSON integer or a string of digits within 1..2^64-1."""
    if isinstance(value, bool):
        raise ValueError("an id is a string of digits or an integer, not a boolean")
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit() or len(value) > 20:
            raise ValueError("an id is a string of 1-20 digits")
        value = int(value)
    if not isinstance(value, int):
        raise ValueError("an id is a string of digits or an integer")
    if not 0 < value <= UINT64_MAX:
        raise ValueError("an id is within 1..18446744073709551615")
    return value


_ID_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": r"^0*[1-9][0-9]{0,19}$", "maxLength": 20},
        {"type": "integer", "minimum": 1, "maximum": UINT64_MAX},
    ],
    "description": "A message or lease id: a string of digits (preferred) or an integer.",
    "examples": ["123"],
}
IdIn = Annotated[int, BeforeValidator(_coerce_id), WithJsonSchema(_ID_SCHEMA)]
IdOut = Annotated[str, Field(pattern=ID_PATTERN, description="An unsigned 64-bit id as a string of digits.", examples=["123"])]
LeaseIdOut = Annotated[
    str, Field(pattern=ID_PATTERN, description="The lease id of the current delivery (\"0\" when not leased).")
]

Priority = Annotated[
    int,
    Field(
        ge=L.PRIORITY_MIN, le=L.PRIORITY_MAX,
        description="Signed 64-bit. Delayed queues deliver lower values first; a Unix timestamp "
        "(seconds) in the future delays delivery until then. Within a fair-queue group, lower first.",
        examples=[60],
    ),
]
# Documented here, enforced by the service (reason INVALID_QUEUE_NAME, like path names).
QueueName = Annotated[
    str,
    Field(
        description=f"{L.QUEUE_NAME_RULE}.",
        examples=["user_indexing_queue"],
        json_schema_extra={"pattern": L.QUEUE_NAME_PATTERN, "minLength": 1, "maxLength": L.MAX_QUEUE_NAME_CHARS},
    ),
]
ContentEncoding = Literal["text", "base64"]


class _In(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


SUCCESS = Field(True, description="Always true in a 2xx answer (errors are problem+json).")

_QUEUE_EXAMPLE: dict[str, Any] = {
    "name": "user_indexing_queue", "type": "delayed",
    "settings": {"visibility_timeout_ms": 0, "max_attempts": 0, "dead_letter_queue": "",
                 "max_unacked_per_group": 0, "dedup_window_ms": 0,
                 "default_group_weight": 0, "default_group_max_per_second": 0},
    "stats": {"ready": 1, "delayed": 0, "in_flight": 0, "dead": 0, "total": 1},
}
_MESSAGE_EXAMPLE: dict[str, Any] = {
    "id": "123", "queue_name": "user_indexing_queue", "content": "{\"user_id\": 1}", "content_encoding": "text",
    "group": "default", "priority": 60, "metadata": {}, "attempts": 1, "deliver_at_ms": 0,
    "lease_expires_at_ms": 1700000030000, "enqueued_at_ms": 1700000000000, "state": "in_flight",
    "lease_id": "7", "dedup_id": "",
}
_PROBLEM_EXAMPLE: dict[str, Any] = {
    "type": "urn:doq:problem:NOT_IN_FLIGHT", "title": "Conflict", "status": 409,
    "detail": "message 124 is not in flight", "reason": "NOT_IN_FLIGHT", "retryable": False, "leader_hint": "",
}


# -- queues ---------------------------------------------------------------------------------
class QueueSettingsModel(_In):
    """Per-queue settings; 0 / "" select the documented default."""

    visibility_timeout_ms: int = Field(
        0, ge=0, le=L.MAX_VISIBILITY_TIMEOUT_MS,
        description="Lease length of a dequeued message (0 = 30000 ms).",
    )
    max_attempts: int = Field(
        0, ge=0, le=L.MAX_ATTEMPTS,
        description="Deliveries before a message is dead-lettered (0 = unlimited).",
    )
    dead_letter_queue: str = Field(
        "", max_length=L.MAX_QUEUE_NAME_CHARS, json_schema_extra={"pattern": f"^$|{L.QUEUE_NAME_PATTERN}"},
        description="Queue receiving messages past max_attempts (\"\" = dropped).",
    )
    max_unacked_per_group: int = Field(
        0, ge=0, le=L.MAX_UNACKED_PER_GROUP, description="Fair queues: in-flight limit per group (0 = none)."
    )
    dedup_window_ms: int = Field(
        0, ge=0, le=L.MAX_DEDUP_WINDOW_MS, description="How long a dedup_id is remembered (0 = 300000 ms)."
    )
    default_group_weight: int = Field(
        0, ge=0, le=L.MAX_GROUP_WEIGHT,
        description="Fair queues: a group's deliveries per turn of the round-robin unless it has its own (0 = 1).",
    )
    default_group_max_per_second: int = Field(
        0, ge=0, le=L.MAX_GROUP_RATE,
        description="Fair queues: a group's deliveries per second unless it has its own (0 = no limit).",
    )

    def to_domain(self) -> QueueSettings:
        return QueueSettings(
            visibility_timeout_ms=self.visibility_timeout_ms,
            max_attempts=self.max_attempts,
            dead_letter_queue=self.dead_letter_queue,
            max_unacked_per_group=self.max_unacked_per_group,
            dedup_window_ms=self.dedup_window_ms,
            default_group_weight=self.default_group_weight,
            default_group_max_per_second=self.default_group_max_per_second,
        )


class CreateQueueBody(_In):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "user_indexing_queue", "type": "delayed"}]}
    )
    name: QueueName
    type: Literal["delayed", "fair"] = Field(
        "delayed", description="delayed: by priority (and time); fair: round-robin across groups."
    )
    settings: QueueSettingsModel | None = None


class UpdateQueueBody(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"settings": {"visibility_timeout_ms": 60000}}]})
    settings: QueueSettingsModel


class QueueStatsModel(_Out):
    ready: int = Field(description="Deliverable now.")
    delayed: int = Field(description="Waiting for their delivery time.")
    in_flight: int = Field(description="Leased to a consumer, not yet acked.")
    dead: int = Field(description="Moved to the dead-letter queue.")
    total: int = Field(description="ready + delayed + in_flight.")


class QueueSettingsOut(_Out):
    """The queue's settings as stored (0 / "" = the documented default)."""

    visibility_timeout_ms: int = Field(description="Lease length of a dequeued message (0 = 30000 ms).")
    max_attempts: int = Field(description="Deliveries before a message is dead-lettered (0 = unlimited).")
    dead_letter_queue: str = Field(description="Queue receiving messages past max_attempts (\"\" = dropped).")
    max_unacked_per_group: int = Field(description="Fair queues: in-flight limit per group (0 = none).")
    dedup_window_ms: int = Field(description="How long a dedup_id is remembered (0 = 300000 ms).")
    default_group_weight: int = Field(description="Fair queues: a group's turns per round unless it has "
                                                  "its own (0 = 1).")
    default_group_max_per_second: int = Field(description="Fair queues: a group's deliveries per second unless "
                                                          "it has its own (0 = no limit).")


class QueueModel(_Out):
    """A queue: its type, settings and message counts."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_QUEUE_EXAMPLE]})
    name: str = Field(description="The queue name.", examples=["user_indexing_queue"])
    type: Literal["delayed", "fair"] = Field(description="delayed: by priority (and time); fair: round-robin by group.")
    settings: QueueSettingsOut
    stats: QueueStatsModel


class QueueResult(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"success": True, "queue": _QUEUE_EXAMPLE}]})
    success: bool = SUCCESS
    queue: QueueModel = Field(description="The queue after the change.")


class QueueList(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"queues": [_QUEUE_EXAMPLE], "next_page_token": None}]})
    queues: list[QueueModel] = Field(description="A page of queues, by name.")
    next_page_token: str | None = Field(
        description="Pass as `page_token` for the next page; null on the last page.")


class Success(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"success": True}]})
    success: bool = SUCCESS


class PurgeResult(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"success": True, "purged": 42}]})
    success: bool = SUCCESS
    purged: int = Field(description="Messages removed.")


# -- messages -------------------------------------------------------------------------------
class EnqueueBody(_In):
    """One message. `content` is UTF-8 text (e.g. a JSON document as a string) unless
    `content_encoding` is "base64"."""

    model_config = ConfigDict(json_schema_extra={
        "examples": [{"content": "{\"user_id\": 1}", "group": "default", "priority": 60}],
        # content_encoding base64: the content must be base64 (else 400 INVALID_CONTENT)
        "if": {"properties": {"content_encoding": {"const": "base64"}}, "required": ["content_encoding"]},
        "then": {"properties": {"content": {"pattern": BASE64_PATTERN}}},
    })
    content: str = Field(description="The payload: UTF-8 text, or base64 with content_encoding=base64.")
    content_encoding: ContentEncoding = Field("text", description="How `content` is encoded.")
    group: str = Field("", max_length=_LIMITS.max_group_bytes, json_schema_extra={"pattern": NO_NUL},
                       description="Fair queues: the round-robin group (no NUL character).")
    priority: Priority = 0
    metadata: dict[str, str] = Field(default_factory=dict, description="Small string attributes.")
    dedup_id: str = Field(
        "", max_length=_LIMITS.max_dedup_id_bytes, json_schema_extra={"pattern": NO_NUL},
        description="Idempotency key: a retry within the dedup window returns the original id (no NUL character).",
    )
    delay_ms: int = Field(0, ge=0, le=L.MAX_DELAY_MS, description="Deliver no sooner than this from now.")

    def to_item(self) -> EnqueueItem:
        if self.content_encoding == "base64":
            try:
                raw = base64.b64decode(self.content, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArgument("content is not valid base64", reason="INVALID_CONTENT") from None
        else:
            try:
                raw = self.content.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgument("content is not valid UTF-8 text", reason="INVALID_CONTENT") from None
        return EnqueueItem(raw, self.group, self.priority, self.metadata, self.dedup_id, self.delay_ms)


class EnqueueBatchBody(_In):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"messages": [{"content": "a", "priority": 1}, {"content": "b"}]}]}
    )
    messages: list[EnqueueBody] = Field(
        min_length=1, max_length=MAX_BATCH,
        description=f"1-{MAX_BATCH} messages, enqueued in one commit, all or nothing: one invalid message refuses the batch.",
    )


class EnqueueResultModel(_Out):
    """The enqueued message (durable when this is answered)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "success": True, "id": "123", "queue_name": "user_indexing_queue", "duplicate": False,
        "group": "default", "priority": 60, "deliver_at_ms": 0,
    }]})
    success: bool = SUCCESS
    id: IdOut
    queue_name: str = Field(description="The queue it was enqueued to.")
    duplicate: bool = Field(description="true: dedup_id was seen; `id` is the original message's.")
    group: str = Field(description="The message's group (\"\" if none).")
    priority: int = Field(description="The message's priority.")
    deliver_at_ms: int = Field(description="Not deliverable before this Unix time (ms); 0 = now.")


class MessageModel(_Out):
    """A message and its delivery state."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_MESSAGE_EXAMPLE]})
    id: IdOut
    queue_name: str = Field(description="The queue holding the message.")
    content: str = Field(description="UTF-8 text, or base64 when content_encoding is base64 (not valid UTF-8).")
    content_encoding: ContentEncoding = Field(description="text when the bytes are valid UTF-8, else base64.")
    group: str = Field(description="Fair queues: the round-robin group (\"\" if none).")
    priority: int = Field(description="Signed 64-bit priority (lower first).")
    metadata: dict[str, str] = Field(description="The string attributes given at enqueue.")
    attempts: int = Field(description="Deliveries so far.")
    deliver_at_ms: int = Field(description="Not deliverable before this Unix time (ms); 0 = now.")
    lease_expires_at_ms: int = Field(description="In flight until this Unix time (ms); 0 = not leased.")
    enqueued_at_ms: int = Field(description="When it was enqueued (Unix time, ms, the leader's clock).")
    state: Literal["ready", "delayed", "in_flight"] = Field(
        description="in_flight: leased to a consumer; delayed: waiting for deliver_at_ms; ready: deliverable."
    )
    lease_id: LeaseIdOut
    dedup_id: str = Field(description="The idempotency key given at enqueue (\"\" if none).")


class MessageList(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"messages": [_MESSAGE_EXAMPLE]}]})
    messages: list[MessageModel] = Field(description="The delivered messages (empty when none is deliverable).")


class PeekPage(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"messages": [_MESSAGE_EXAMPLE], "next_offset": 20}]})
    messages: list[MessageModel] = Field(description="The messages of this page, in the order they leave their state.")
    next_offset: int | None = Field(description="The offset of the next page; null on the last one.")


class GroupModel(_Out):
    group: str = Field(description="The group name.")
    ready: int = Field(description="Messages of the group ready to deliver (its backlog).")
    in_flight: int = Field(description="Messages of the group leased and not yet acked.")
    weight: int = Field(description="Deliveries per turn of the round-robin (its own, else the queue's default).")
    max_per_second: int = Field(description="Deliveries per second at most (its own, else the queue's default; "
                                            "0 = no limit).")
    throttled: bool = Field(description="Over its rate now: skipped (the others go on) until it may deliver again.")
    overridden: bool = Field(description="The group has its own weight or rate (PUT .../groups/{group}).")


_GROUP_EXAMPLE: dict[str, Any] = {"group": "tenant-a", "ready": 12, "in_flight": 2, "weight": 5,
                                  "max_per_second": 100, "throttled": False, "overridden": True}


def group_dict(g: GroupStats) -> dict[str, Any]:
    return {"group": g.group, "ready": g.ready, "in_flight": g.in_flight, "weight": g.weight,
            "max_per_second": g.max_per_second, "throttled": g.throttled, "overridden": g.overridden}


class GroupList(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"groups": [_GROUP_EXAMPLE], "total": 1, "next_offset": None}]})
    groups: list[GroupModel] = Field(description="Groups with a message ready or in flight, or a weight or "
                                                 "rate of their own, or a rate's bucket still refilling, by name.")
    total: int = Field(description="How many groups the queue has.")
    next_offset: int | None = Field(description="The offset of the next page; null on the last one.")


class RateSample(_Out):
    time_ms: int = Field(description="When the sample was taken (Unix ms, this node's clock).")
    enqueued: int = Field(description="Messages enqueued since the node loaded the queue (cumulative).")
    delivered: int = Field(description="Deliveries since then (cumulative).")
    acked: int = Field(description="Messages settled since then (cumulative).")


class RateHistoryModel(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"interval_ms": 5000, "samples": [{"time_ms": 1764165600000, "enqueued": 1200, "delivered": 1100, "acked": 1090},
                                          {"time_ms": 1764165605000, "enqueued": 1450, "delivered": 1390, "acked": 1385}]}]})
    interval_ms: int = Field(description="The time between two samples.")
    samples: list[RateSample] = Field(description="Oldest first; a rate is the difference of two samples over their time.")


class DequeueBody(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"max_messages": 10, "wait_ms": 1000}]})
    max_messages: int = Field(1, ge=1, le=MAX_BATCH, description=f"Deliver at most this many (1-{MAX_BATCH}).")
    ack: bool = Field(False, description="true: remove on delivery (at-most-once); false: lease.")
    wait_ms: int = Field(0, ge=0, le=MAX_WAIT_MS, description="Long poll: wait up to this long for a message.")
    visibility_timeout_ms: int = Field(0, ge=0, le=L.MAX_VISIBILITY_TIMEOUT_MS, description="0 = the queue's setting.")


class LeaseBody(_In):
    """Optional: the `lease_id` of the delivery being acked (409 STALE_LEASE if it was redelivered since)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"lease_id": "7"}]})
    lease_id: IdIn | None = Field(None, description="Only act if this is still the current delivery.")


def _lease_required(examples: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    """`json_schema_extra` of a body whose `lease_id` the server requires (LEASE_REQUIRED
    without it): the document says so (the model stays lenient so the answer keeps that reason)."""
    def extra(schema: dict[str, Any]) -> None:
        schema["examples"] = examples
        schema["required"] = ["lease_id", *schema.get("required", ())]
        schema["properties"]["lease_id"] = {**_ID_SCHEMA, "description": "The delivery's lease id (required)."}
    return extra


class TouchBody(LeaseBody):
    """The lease to extend (required) and the new visibility timeout from now."""

    model_config = ConfigDict(json_schema_extra=_lease_required([{"lease_id": "7", "visibility_timeout_ms": 60000}]))
    visibility_timeout_ms: int = Field(0, ge=0, le=L.MAX_VISIBILITY_TIMEOUT_MS, description="0 = the queue's setting.")


class NackBody(LeaseBody):
    """The lease to return (required), optionally a redelivery delay and a new priority."""

    model_config = ConfigDict(json_schema_extra=_lease_required([{"lease_id": "7", "delay_ms": 5000}]))
    delay_ms: int = Field(0, ge=0, le=L.MAX_DELAY_MS, description="Redeliver no sooner than this.")
    priority: Priority | None = Field(None, description="A new priority, if given.")
    release: bool = Field(
        False,
        description="true: undo the delivery as if it had not happened: the attempt is not counted, the "
        "message is ready at once at its old place and never dead-lettered (delay_ms must be 0 and "
        "priority absent, else 400 INVALID_RELEASE).",
    )


class TouchResult(_Out):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"success": True, "lease_expires_at_ms": 1700000060000}]}
    )
    success: bool = SUCCESS
    lease_expires_at_ms: int = Field(description="The lease now ends at this Unix time (ms).")


class PriorityBody(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"priority": 12}]})
    priority: Priority


class MessageResult(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "success": True, "message": {**_MESSAGE_EXAMPLE, "priority": 12, "content": ""}}]})
    success: bool = SUCCESS
    message: MessageModel = Field(description="The message after the change (content omitted: \"\").")


class AckBatchBody(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"ids": ["123", "124"], "lease_ids": ["7", "8"]}],
                                                 "required": ["ids", "lease_ids"]})
    ids: list[IdIn] = Field(min_length=1, max_length=MAX_BATCH, description=f"1-{MAX_BATCH} ids, acked in one commit.")
    lease_ids: list[IdIn] = Field(default_factory=list, max_length=MAX_BATCH,
                                  json_schema_extra={"minItems": 1},
                                  description="One per id: the lease id of its delivery (LEASE_REQUIRED without).")


# -- errors ---------------------------------------------------------------------------------
class FieldError(_Out):
    loc: list[str | int] = Field(description="Where: e.g. [\"body\", \"priority\"].")
    msg: str = Field(description="What is wrong.")
    type: str = Field(description="A machine-readable error type, e.g. int_type, missing, extra_forbidden.")


class Problem(_Out):
    """RFC 9457 problem details, with doq's stable reason, retryable flag and leader hint."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{
                "type": "urn:doq:problem:QUEUE_NOT_FOUND", "title": "Not found", "status": 404,
                "detail": "queue 'orders' does not exist", "reason": "QUEUE_NOT_FOUND",
                "retryable": False, "leader_hint": "",
            }]
        },
    )
    type: str = Field(description="urn:doq:problem:<reason>.")
    title: str = Field(description="A short summary of the status, e.g. Not found.")
    status: int = Field(description="The HTTP status code of the answer.")
    detail: str = Field(description="What went wrong, for a human.")
    reason: str = Field(description="Stable machine-readable reason, e.g. QUEUE_NOT_FOUND.")
    retryable: bool = Field(description="true: the same request may succeed later (503, 504, 429).")
    leader_hint: str = Field(description="Address of the leader when this node is not it, else \"\".")
    instance: str | None = Field(None, description="The request path.")
    errors: list[FieldError] | None = Field(None, description="Field errors of an invalid request.")


class BatchEnqueueItemResult(_Out):
    """One enqueued message of a batch (as EnqueueResultModel, without queue_name)."""

    success: bool = Field(description="true: enqueued (or a duplicate). A batch is all or nothing, so false "
                          "(with `error`) is not expected.")
    id: IdOut | None = None
    duplicate: bool | None = Field(None, description="true: dedup_id was seen; `id` is the original message's.")
    group: str | None = Field(None, description="The message's group.")
    priority: int | None = Field(None, description="The message's priority.")
    deliver_at_ms: int | None = Field(None, description="Not deliverable before this Unix time (ms); 0 = now.")
    error: Problem | None = None


class BatchEnqueueResult(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"results": [
        {"success": True, "id": "123", "duplicate": False, "group": "", "priority": 1, "deliver_at_ms": 0},
        {"success": True, "id": "124", "duplicate": False, "group": "", "priority": 0, "deliver_at_ms": 0},
    ]}]})
    results: list[BatchEnqueueItemResult] = Field(description="One per message, in order.")


class AckItemResult(_Out):
    id: IdOut
    success: bool = Field(description="true: acked; false: see `error` (e.g. 409 NOT_IN_FLIGHT, 404).")
    error: Problem | None = Field(None, description="Why this id was not acked.")


class AckBatchResult(_Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"results": [
        {"id": "123", "success": True}, {"id": "124", "success": False, "error": _PROBLEM_EXAMPLE},
    ]}]})
    results: list[AckItemResult] = Field(description="One per id, in order; each id is acked or fails alone.")


# -- encoders (hot paths: plain dicts -> JSON bytes) -------------------------------------------
def dumps(obj: Any) -> bytes:
    return to_json(obj)


def queue_dict(q: QueueInfo) -> dict[str, Any]:
    s, st = q.settings, q.stats
    return {
        "name": q.name,
        "type": q.type.value,
        "settings": {
            "visibility_timeout_ms": s.visibility_timeout_ms,
            "max_attempts": s.max_attempts,
            "dead_letter_queue": s.dead_letter_queue,
            "max_unacked_per_group": s.max_unacked_per_group,
            "dedup_window_ms": s.dedup_window_ms,
            "default_group_weight": s.default_group_weight,
            "default_group_max_per_second": s.default_group_max_per_second,
        },
        "stats": {
            "ready": st.ready, "delayed": st.delayed, "in_flight": st.in_flight,
            "dead": st.dead, "total": st.total,
        },
    }


def enqueue_dict(queue: str, r: EnqueueResult) -> dict[str, Any]:
    return {
        "success": True, "id": str(r.id), "queue_name": queue, "duplicate": r.duplicate,
        "group": r.group, "priority": r.priority, "deliver_at_ms": r.deliver_at_ms,
    }


def message_dict(m: MessageView) -> dict[str, Any]:
    raw = m.content
    try:
        content, enc = raw.decode("utf-8"), "text"
    except UnicodeDecodeError:
        content, enc = base64.b64encode(raw).decode("ascii"), "base64"
    return {
        "id": str(m.id), "queue_name": m.queue_name, "content": content, "content_encoding": enc,
        "group": m.group, "priority": m.priority, "metadata": m.metadata, "attempts": m.attempts,
        "deliver_at_ms": m.deliver_at_ms, "lease_expires_at_ms": m.lease_expires_at_ms,
        "enqueued_at_ms": m.enqueued_at_ms, "state": m.state.value, "lease_id": str(m.lease_id),
        "dedup_id": m.dedup_id,
    }


def item_error(err: DoqError) -> dict[str, Any]:
    """A problem object for one failed item of a batch (imported lazily to avoid a cycle)."""
    from doq.service.http.problems import problem_dict

    return problem_dict(err)
