"""Conversions between domain types and the doq.v1 protobuf messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from doq_proto.v1 import doq_pb2 as pb

from doq.errors import DoqError, InvalidArgument, status_of
from doq.node import stages
from doq.queues.commands import EnqueueColumns, EnqueueItem
from doq.queues.model import (
    EnqueueColumnsResult,
    EnqueueResult,
    GroupStats,
    MessageView,
    QueueInfo,
    QueueSettings,
)
from doq.service.sessions import NackItem, Settlement, StreamOpen


def settings_from_pb(s: pb.QueueSettings) -> QueueSettings:
    return QueueSettings(
        visibility_timeout_ms=s.visibility_timeout_ms,
        max_attempts=s.max_attempts,
        dead_letter_queue=s.dead_letter_queue,
        max_unacked_per_group=s.max_unacked_per_group,
        dedup_window_ms=s.dedup_window_ms,
        default_group_weight=s.default_group_weight,
        default_group_max_per_second=s.default_group_max_per_second,
    )


def group_to_pb(g: GroupStats) -> pb.GroupInfo:
    return pb.GroupInfo(group=g.group, ready=g.ready, in_flight=g.in_flight, weight=g.weight,
                        max_per_second=g.max_per_second, throttled=g.throttled, overridden=g.overridden)


def queue_to_pb(q: QueueInfo) -> pb.Queue:
    s, st = q.settings, q.stats
    return pb.Queue(
        name=q.name,
        type=q.type.value,
        settings=pb.QueueSettings(
            visibility_timeout_ms=s.visibility_timeout_ms,
            max_attempts=s.max_attempts,
            dead_letter_queue=s.dead_letter_queue,
            max_unacked_per_group=s.max_unacked_per_group,
            dedup_window_ms=s.dedup_window_ms,
            default_group_weight=s.default_group_weight,
            default_group_max_per_second=s.default_group_max_per_second,
        ),
        stats=pb.QueueStats(
            ready=st.ready, delayed=st.delayed, in_flight=st.in_flight, dead=st.dead, total=st.total
        ),
    )


def item_from_pb(r: pb.EnqueueRequest) -> EnqueueItem:
    md = r.metadata
    return EnqueueItem(r.content, r.group, r.priority, dict(md) if md else {}, r.dedup_id, r.delay_ms)


def request_from_pb(r: pb.EnqueueRequest) -> tuple[str, EnqueueItem]:
    """One message of an EnqueueStream: its queue and the message."""
    md = r.metadata
    return r.queue_name, EnqueueItem(r.content, r.group, r.priority, dict(md) if md else {}, r.dedup_id, r.delay_ms)


def frame_from_pb(r: pb.EnqueueBatchRequest) -> list[tuple[str, EnqueueItem]] | EnqueueColumns:
    """A frame of EnqueueBatch(Stream): its messages or its columns (not both:
    INVALID_COLUMNS)."""
    if r.HasField("columns"):
        if r.messages:
            raise InvalidArgument("a frame carries messages or columns, not both", reason="INVALID_COLUMNS")
        return columns_from_pb(r.columns)
    return [request_from_pb(m) for m in r.messages]


def stream_open_from_pb(r: pb.DequeueStreamRequest) -> StreamOpen:
    """The first request of a dequeue stream."""
    return StreamOpen(r.queue_name, r.ack, r.prefetch, r.max_batch, r.visibility_timeout_ms, r.auto_credit,
                      r.columns)


def settlement_from_pb(r: pb.DequeueStreamRequest) -> Settlement:
    """A later request of a dequeue stream (its acks, nacks and credits)."""
    return Settlement(
        list(r.ack_ids), list(r.ack_lease_ids),
        [NackItem(n.id, n.lease_id, n.delay_ms, n.priority if n.HasField("priority") else None, n.release)
         for n in r.nacks] if r.nacks else [],
        r.credits,
    )


def columns_from_pb(cols: pb.EnqueueColumns) -> EnqueueColumns:
    """The command of a columnar frame (each column copied out in one call)."""
    if stages.observer is not None:
        stages.observer.frame_received(cols.contents)
    return EnqueueColumns(
        cols.queue_name,
        list(cols.contents),
        list(cols.groups),
        list(cols.priorities),
        [dict(m.entries) for m in cols.metadata],
        list(cols.dedup_ids),
        list(cols.delays_ms),
    )


def enqueue_columns_to_pb(res: EnqueueColumnsResult | DoqError) -> tuple[pb.EnqueueBatchResponse, int]:
    """The response to a columnar frame, and how many of its messages were newly enqueued."""
    out = pb.EnqueueBatchResponse()
    if isinstance(res, DoqError):
        out.error.CopyFrom(error_to_pb(res))
        return out, 0
    out.ids.extend(res.ids)
    if res.duplicates:
        out.duplicates.extend(res.duplicates)
    if res.deliver_at_ms:
        out.deliver_at_ms.extend(res.deliver_at_ms)
    for pos in sorted(res.errors):
        out.error_positions.append(pos)
        out.errors.append(error_to_pb(res.errors[pos]))
    return out, len(res.ids) - len(res.duplicates) - len(res.errors)


def message_to_pb(m: MessageView) -> pb.Message:
    return _rare_fields(pb.Message(
        id=m.id, queue_name=m.queue_name, content=m.content, attempts=m.attempts,
        enqueued_at_ms=m.enqueued_at_ms, state=m.state._value_, lease_id=m.lease_id,
        lease_expires_at_ms=m.lease_expires_at_ms, dedup_id=m.dedup_id), m)


def add_messages(out: Any, msgs: Sequence[MessageView]) -> None:
    """Append `msgs` to a repeated `Message` field, each built in place by one call
    (building them apart and passing the list to a constructor copies each: ~4x the cost;
    an enum's `value` is a property: `_value_` is the same string at a tenth of the cost)."""
    if stages.observer is not None:
        stages.observer.frame_built(msgs)
    add = out.add
    for m in msgs:
        r = add(id=m.id, queue_name=m.queue_name, content=m.content, attempts=m.attempts,
                enqueued_at_ms=m.enqueued_at_ms, state=m.state._value_, lease_id=m.lease_id,
                lease_expires_at_ms=m.lease_expires_at_ms, dedup_id=m.dedup_id)
        if m.group or m.priority or m.metadata or m.deliver_at_ms:
            _rare_fields(r, m)


def add_columns(out: Any, msgs: Sequence[MessageView]) -> None:
    """Fill a `MessageColumns` with `msgs` (delivered messages of one queue): one C call
    per column, the optional columns only when a message sets the field."""
    if not msgs:
        return
    if stages.observer is not None:
        stages.observer.frame_built(msgs)
    out.queue_name = msgs[0].queue_name
    out.ids.extend([m.id for m in msgs])
    out.contents.extend([m.content for m in msgs])
    out.lease_ids.extend([m.lease_id for m in msgs])
    out.attempts.extend([m.attempts for m in msgs])
    out.lease_expires_at_ms.extend([m.lease_expires_at_ms for m in msgs])
    out.enqueued_at_ms.extend([m.enqueued_at_ms for m in msgs])
    for column, values in (
        (out.dedup_ids, [m.dedup_id for m in msgs]),
        (out.groups, [m.group for m in msgs]),
        (out.priorities, [m.priority for m in msgs]),
        (out.deliver_at_ms, [m.deliver_at_ms for m in msgs]),
    ):
        if any(values):
            column.extend(values)
    if any(m.metadata for m in msgs):
        for m in msgs:
            out.metadata.add().entries.update(m.metadata)


def _rare_fields(r: pb.Message, m: MessageView) -> pb.Message:
    """Set the fields most messages leave at their default, only when set."""
    if m.group:
        r.group = m.group
    if m.priority:
        r.priority = m.priority
    if m.metadata:
        r.metadata.update(m.metadata)
    if m.deliver_at_ms:
        r.deliver_at_ms = m.deliver_at_ms
    return r


def grpc_code(err: DoqError) -> grpc.StatusCode:
    return grpc.StatusCode[status_of(err).grpc_code]


def error_to_pb(err: DoqError) -> pb.Error:
    return pb.Error(
        code=grpc_code(err).value[0],
        reason=err.reason,
        message=err.message,
        retryable=err.retryable,
        leader_hint=err.leader_hint,
    )


def enqueue_result_to_pb(res: EnqueueResult | DoqError) -> pb.EnqueueResponse:
    if isinstance(res, DoqError):
        return pb.EnqueueResponse(success=False, error=error_to_pb(res))
    r = pb.EnqueueResponse(success=True, id=res.id)
    # Only non-default fields are set: each setter is a Python call on the hot path, and an
    # unset proto3 field reads as its default anyway.
    if res.duplicate:
        r.duplicate = True
    if res.group:
        r.group = res.group
    if res.priority:
        r.priority = res.priority
    if res.deliver_at_ms:
        r.deliver_at_ms = res.deliver_at_ms
    return r


def enqueue_batch_to_pb(results: Sequence[EnqueueResult | DoqError]) -> tuple[pb.EnqueueBatchResponse, int]:
    """The response to a batch, and how many of its messages were newly enqueued (not
    duplicates, not failed). Items are added in place, not built and then copied."""
    out = pb.EnqueueBatchResponse()
    add = out.results.add
    fresh = 0
    for res in results:
        if isinstance(res, DoqError):
            add(success=False, error=error_to_pb(res))
        elif res.duplicate or res.group or res.priority or res.deliver_at_ms:
            add(success=True, id=res.id, duplicate=res.duplicate, group=res.group,
                priority=res.priority, deliver_at_ms=res.deliver_at_ms)
            fresh += not res.duplicate
        else:
            add(success=True, id=res.id)
            fresh += 1
    return out, fresh
