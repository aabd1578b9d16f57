"""Redrive endpoints: `POST|GET|DELETE /API/v1/queues/{name}/redrive` onto
`doq.service.redrive` (the task that moves a dead-letter queue's messages back)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field
from starlette.responses import Response

from doq.queues import redrive as RD
from doq.service import redrive as svc
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.http.routes import JSON, QueueName, http_caller, route

if TYPE_CHECKING:
    from doq.service.api import QueueService

_EXAMPLE: dict[str, Any] = {
    "queue": "orders_dlq", "to": "orders", "state": "running", "max_per_second": 50, "moved": 1200,
    "remaining": 300, "total": 1500, "started_at_ms": 1767225600000, "updated_at_ms": 1767225624000,
    "reason": "",
}


class RedriveBody(m._In):
    model_config = ConfigDict(json_schema_extra={"examples": [{}, {"to": "orders", "max_per_second": 50}]})
    to: m.QueueName | None = Field(None, description=(
        "The target queue. Default: the one queue whose dead_letter_queue setting names this queue "
        "(409 REDRIVE_TARGET_REQUIRED when none or several do)."))
    max_per_second: int | None = Field(None, ge=0, le=RD.MAX_RATE, description=(
        "Move at most this many messages a second (paced by the cluster's replicated clock); "
        "0 or none: no limit."))


class RedriveModel(m._Out):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE]})
    queue: str = Field(description="The dead-letter queue the messages leave.")
    to: str = Field(description="The queue they go to.")
    state: Literal["running", "completed", "cancelled", "failed"]
    max_per_second: int = Field(description="The rate limit (0: none).")
    moved: int = Field(description="Messages moved so far.")
    remaining: int = Field(description="Messages it may still move (an upper bound while running; 0 once ended).")
    total: int = Field(description="Messages the queue held (ready or delayed) when the task started.")
    started_at_ms: int
    updated_at_ms: int = Field(description="When it last moved a message or ended (replicated time).")
    reason: str = Field(description="Why it failed (\"\" otherwise).")


def _json(p: svc.RedriveProgress, status: int = 200) -> Response:
    return Response(m.dumps(p.to_dict()), status_code=status, media_type=JSON)


class RedriveRoutes:
    def __init__(self, api: QueueService) -> None:
        self.api = api

    @route(
        "POST", "/queues/{name}/redrive", answer="Accepted: the task (it runs in the cluster).",
        tags=["queues"], status_code=202, response_model=RedriveModel, summary="Redrive a dead-letter queue",
        responses=errors(400, 404, 409, 413, 415, 507, notes={
            409: "REDRIVE_RUNNING: a redrive of this queue is running (cancel it first); "
                 "REDRIVE_TARGET_REQUIRED: no `to`, and not exactly one queue dead-letters into this one"}),
        openapi_extra=body_doc(RedriveBody, required=False),
    )
    async def start_redrive(self, name: QueueName, request: Request) -> Response:
        """Move the messages this (dead-letter) queue holds back to `to` (default: the queue
        that dead-letters into it), at most `max_per_second`, as a replicated task that goes
        on after a failover. Moved messages keep content, group, metadata, priority and dedup
        id; their attempt count restarts at 0. Messages in flight and messages that arrive
        after the start stay."""
        b = await read_json(request, RedriveBody, required=False)
        p = await svc.start(self.api, name, b.to or "", b.max_per_second or 0, caller=http_caller(request))
        return _json(p, 202)

    @route(
        "GET", "/queues/{name}/redrive", answer="The queue's redrive task and its progress.", tags=["queues"],
        response_model=RedriveModel, summary="A redrive's progress", responses=errors(400, 404, notes={
            404: "QUEUE_NOT_FOUND, or REDRIVE_NOT_FOUND: no redrive was started on this queue"}),
    )
    async def get_redrive(self, name: QueueName, request: Request) -> Response:
        """The last redrive started on this queue: running, completed, cancelled or failed."""
        return _json(await svc.get(self.api, name, caller=http_caller(request)))

    @route(
        "DELETE", "/queues/{name}/redrive", answer="The task, cancelled (or as it ended).", tags=["queues"],
        response_model=RedriveModel, summary="Cancel a redrive", responses=errors(400, 404, 507),
    )
    async def cancel_redrive(self, name: QueueName, request: Request) -> Response:
        """Stop the running redrive; messages moved stay moved (start again to move the rest)."""
        return _json(await svc.cancel(self.api, name, caller=http_caller(request)))


def build_redrive_router(api: QueueService) -> APIRouter:
    r = APIRouter(prefix="/API/v1", generate_unique_id_function=operation_id, route_class=LeanRoute)
    handlers = RedriveRoutes(api)
    for name, fn in vars(RedriveRoutes).items():
        if hasattr(fn, "route"):
            method, path, options = fn.route
            r.add_api_route(path, getattr(handlers, name), methods=[method], **options)
    return r
