"""The unary operations, transport-neutral: each builds a request and a result converter.

`DoqClient` (sync) and `AsyncDoqClient` (asyncio) call the same `Op`s, so their semantics
cannot drift apart. Requests are built with `types.build`: a value out of its field's range
raises `InvalidArgument` before anything is sent.

Each `Op` says whether it is *repeatable* (see `doq_client.retry`): sending it again after
an attempt whose outcome is unknown cannot apply it twice. Repeatable: reads; create and
update of a queue (same settings: no change); enqueues that carry a `dedup_id`; dequeue in
lease mode (what an unanswered attempt leased comes back when its lease ends);
update_priority; ack, ack_batch, nack and touch with lease ids; deletes. Not repeatable:
enqueues without a `dedup_id`, dequeue with `ack=True`, purge, and ack/nack with lease id 0
(any lease: a repeat could settle a later delivery to another consumer).
`gone`: the reasons that, answering a repeat, mean the first attempt did the work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from doq_client.errors import from_pb_error
from doq_client.types import (
    AckResult,
    Content,
    EnqueueResult,
    GroupInfo,
    Message,
    Queue,
    QueueSettings,
    build,
    enqueue_outcome,
    enqueue_request,
    enqueue_result,
    nack_request,
)
from doq_proto.v1 import doq_pb2 as pb

T = TypeVar("T")


_MESSAGE_GONE = frozenset({"MESSAGE_NOT_FOUND"})
_LEASE_GONE = frozenset({"MESSAGE_NOT_FOUND", "STALE_LEASE"})


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One unary call: stub method name, request, response converter, and its retry rules.

    `repeatable`: may be sent again after an outcome-unknown failure. `gone`: reasons that
    answer a repeat when an earlier attempt did the work (the call then returns None; only
    for calls that return None). `repeat`: applied to a repeat's result (ack_batch: items
    answered MESSAGE_NOT_FOUND were acked by an earlier attempt).
    """

    method: str
    request: Any
    convert: Callable[[Any], T]
    repeatable: bool = False
    gone: frozenset[str] = frozenset()
    repeat: Callable[[T], T] | None = None


def _queue(r: Any) -> Queue:
    return Queue.from_pb(r.queue)


def _true(_: Any) -> None:
    return None


def create_queue(name: str, type: str, settings: QueueSettings | None) -> Op[Queue]:
    req = pb.CreateQueueRequest(
        name=name, type=type, settings=(settings or QueueSettings()).to_pb()
    )
    return Op("CreateQueue", req, _queue, True)


def update_queue(name: str, settings: QueueSettings) -> Op[Queue]:
    return Op(
        "UpdateQueue", pb.UpdateQueueRequest(name=name, settings=settings.to_pb()), _queue, True
    )


def delete_queue(name: str) -> Op[None]:
    return Op(
        "DeleteQueue", pb.DeleteQueueRequest(name=name), _true, True, frozenset({"QUEUE_NOT_FOUND"})
    )


def get_queue(name: str) -> Op[Queue]:
    return Op("GetQueue", pb.GetQueueRequest(name=name), _queue, True)


def list_queues_page(page_token: str = "", max_results: int = 0) -> Op[tuple[list[Queue], str]]:
    """One page of queues by name (the node sends at most 1000): (queues, next page token,
    "" on the last page)."""
    return Op(
        "ListQueues", pb.ListQueuesRequest(page_token=page_token, max_results=max_results),
        lambda r: ([Queue.from_pb(q) for q in r.queues], r.next_page_token), True
    )


def set_group_policy(queue: str, group: str, weight: int | None, max_per_second: int | None,
                     reset: bool) -> Op[GroupInfo]:
    """A fair queue group's own weight and/or rate (None: unchanged), or `reset` to the
    queue's defaults. Setting the same values again changes nothing: repeatable."""
    fields: dict[str, Any] = {"queue_name": queue, "group": group, "reset": reset}
    if weight is not None:
        fields["weight"] = weight
    if max_per_second is not None:
        fields["max_per_second"] = max_per_second
    return Op("SetGroupPolicy", build(pb.SetGroupPolicyRequest, **fields),
              lambda r: GroupInfo.from_pb(r.group), True)


def list_groups(queue: str) -> Op[list[GroupInfo]]:
    return Op("ListGroups", pb.ListGroupsRequest(queue_name=queue),
              lambda r: [GroupInfo.from_pb(g) for g in r.groups], True)


def purge_queue(name: str) -> Op[int]:
    return Op("PurgeQueue", pb.PurgeQueueRequest(name=name), lambda r: int(r.purged))


def enqueue(
    queue: str,
    content: Content,
    group: str,
    priority: int,
    metadata: Mapping[str, str] | None,
    dedup_id: str,
    delay_ms: int,
) -> Op[EnqueueResult]:
    req = enqueue_request(
        queue,
        content,
        group=group,
        priority=priority,
        metadata=metadata,
        dedup_id=dedup_id,
        delay_ms=delay_ms,
    )
    return Op("Enqueue", req, enqueue_result, bool(dedup_id))


def enqueue_batch(requests: Iterable[pb.EnqueueRequest]) -> Op[list[EnqueueResult | Any]]:
    reqs = list(requests)
    idem = bool(reqs) and all(r.dedup_id for r in reqs)
    return Op(
        "EnqueueBatch",
        pb.EnqueueBatchRequest(messages=reqs),
        lambda r: [enqueue_outcome(x) for x in r.results],
        idem,
    )


def dequeue(
    queue: str, ack: bool, max_messages: int, wait_ms: int, visibility_timeout_ms: int
) -> Op[list[Message]]:
    req = build(
        pb.DequeueRequest,
        queue_name=queue,
        ack=ack,
        max_messages=max_messages,
        wait_ms=wait_ms,
        visibility_timeout_ms=visibility_timeout_ms,
    )
    return Op("Dequeue", req, lambda r: [Message(m) for m in r.messages], not ack)


def get(queue: str, id_: int) -> Op[Message]:
    return Op("Get", build(pb.GetRequest, queue_name=queue, id=id_), Message, True)


def peek(queue: str, state: str, offset: int, limit: int) -> Op[list[Message]]:
    req = build(pb.PeekRequest, queue_name=queue, state=state, offset=offset, limit=limit)
    return Op("Peek", req, lambda r: [Message(m) for m in r.messages], True)


def delete(queue: str, id_: int, lease_id: int = 0) -> Op[None]:
    return Op(
        "Delete", build(pb.DeleteRequest, queue_name=queue, id=id_, lease_id=lease_id), _true, True, _MESSAGE_GONE
    )


def ack(queue: str, id_: int, lease_id: int) -> Op[None]:
    req = build(pb.AckRequest, queue_name=queue, id=id_, lease_id=lease_id)
    return Op("Ack", req, _true, bool(lease_id), _MESSAGE_GONE)


def _ack_results(r: Any) -> list[AckResult]:
    return [AckResult(x.id, None if x.success else from_pb_error(x.error)) for x in r.results]


def _acked_before(results: list[AckResult]) -> list[AckResult]:
    return [
        AckResult(r.id, None) if r.error is not None and r.error.reason in _MESSAGE_GONE else r
        for r in results
    ]


def ack_batch(queue: str, ids: Sequence[int], lease_ids: Sequence[int]) -> Op[list[AckResult]]:
    req = build(pb.AckBatchRequest, queue_name=queue, ids=list(ids), lease_ids=list(lease_ids))
    leased = bool(req.lease_ids) and all(req.lease_ids)
    return Op("AckBatch", req, _ack_results, leased, repeat=_acked_before)


def nack(
    queue: str, id_: int, lease_id: int, delay_ms: int, priority: int | None, release: bool
) -> Op[None]:
    req = nack_request(
        queue, id_, lease_id=lease_id, delay_ms=delay_ms, priority=priority, release=release
    )
    return nack_pb(req)


def nack_pb(req: pb.NackRequest) -> Op[None]:
    """A built `NackRequest` (a consumer's settlement after a failover)."""
    return Op("Nack", req, _true, bool(req.lease_id), _LEASE_GONE)


def touch(queue: str, id_: int, lease_id: int, visibility_timeout_ms: int) -> Op[int]:
    req = build(
        pb.TouchRequest,
        queue_name=queue,
        id=id_,
        lease_id=lease_id,
        visibility_timeout_ms=visibility_timeout_ms,
    )
    return Op("Touch", req, lambda r: int(r.lease_expires_at_ms), bool(lease_id))


def update_priority(queue: str, id_: int, priority: int) -> Op[Message]:
    req = build(pb.UpdatePriorityRequest, queue_name=queue, id=id_, priority=priority)
    return Op("UpdatePriority", req, lambda r: Message(r.message), True)


def _key(k: Any) -> dict[str, Any]:
    return {"id": k.id, "scopes": list(k.scopes), "created_ms": int(k.created_ms)}


def create_key(scopes: Sequence[str]) -> Op[dict[str, Any]]:
    """Not repeatable: a repeat would create a second key."""
    return Op("CreateKey", pb.CreateKeyRequest(scopes=list(scopes)),
              lambda r: {**_key(r.key_info), "key": r.key})


def list_keys() -> Op[list[dict[str, Any]]]:
    return Op("ListKeys", pb.ListKeysRequest(), lambda r: [_key(k) for k in r.keys], True)


def revoke_key(key_id: str) -> Op[None]:
    return Op("RevokeKey", pb.RevokeKeyRequest(id=key_id), _true, True, frozenset({"KEY_NOT_FOUND"}))
