"""The redrive RPCs of doq.v1.DOQ (StartRedrive, CancelRedrive, GetRedrive): requests onto
`doq.service.redrive`, its progress onto `RedriveTask` (the servicer's handlers call these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from doq_proto.v1 import doq_pb2 as pb

from doq.service import redrive as svc
from doq.service.door import Caller

if TYPE_CHECKING:
    from doq.service.api import QueueService


def task_to_pb(p: svc.RedriveProgress) -> pb.RedriveTask:
    return pb.RedriveTask(queue_name=p.queue, to=p.to, state=p.state, max_per_second=p.max_per_second,
                          moved=p.moved, remaining=p.remaining, total=p.total, started_at_ms=p.started_at_ms,
                          updated_at_ms=p.updated_at_ms, reason=p.reason)


async def start(api: QueueService, request: pb.StartRedriveRequest, caller: Caller) -> pb.RedriveTask:
    return task_to_pb(await svc.start(api, request.queue_name, request.to, request.max_per_second, caller=caller))


async def cancel(api: QueueService, request: pb.CancelRedriveRequest, caller: Caller) -> pb.RedriveTask:
    return task_to_pb(await svc.cancel(api, request.queue_name, caller=caller))


async def get(api: QueueService, request: pb.GetRedriveRequest, caller: Caller) -> pb.RedriveTask:
    return task_to_pb(await svc.get(api, request.queue_name, caller=caller))
