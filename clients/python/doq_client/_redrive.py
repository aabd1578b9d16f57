"""Redrive: the task that moves a dead-letter queue's messages back to a queue (the
server's StartRedrive, CancelRedrive and GetRedrive). `DoqClient` and `AsyncDoqClient`
call these `Op`s (see `doq_client._ops`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from doq_client._ops import Op
from doq_client.types import build
from doq_proto.v1 import doq_pb2 as pb


@dataclass(frozen=True, slots=True)
class RedriveTask:
    """A redrive and its progress. `state`: running, completed, cancelled or failed
    (`reason` says why). `remaining`: messages it may still move (0 once it ended)."""

    queue: str
    to: str
    state: str
    max_per_second: int
    moved: int
    remaining: int
    total: int
    started_at_ms: int
    updated_at_ms: int
    reason: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_pb(cls, t: Any) -> RedriveTask:
        return cls(t.queue_name, t.to, t.state, t.max_per_second, t.moved, t.remaining, t.total,
                   t.started_at_ms, t.updated_at_ms, t.reason)


def start(queue: str, to: str, max_per_second: int) -> Op[RedriveTask]:
    """Not repeatable: a repeat of a start that took effect answers REDRIVE_RUNNING."""
    req = build(pb.StartRedriveRequest, queue_name=queue, to=to, max_per_second=max_per_second)
    return Op("StartRedrive", req, RedriveTask.from_pb)


def cancel(queue: str) -> Op[RedriveTask]:
    return Op("CancelRedrive", pb.CancelRedriveRequest(queue_name=queue), RedriveTask.from_pb, True)


def get(queue: str) -> Op[RedriveTask]:
    return Op("GetRedrive", pb.GetRedriveRequest(queue_name=queue), RedriveTask.from_pb, True)
