"""`/API/v1/queues/{name}/groups/{group}`: a fair queue's per-group weight and rate.

`{group}` takes the rest of the path (a group may hold `/`), and may be empty: the default
group "" of messages sent without one is `.../groups/`.

`PUT` overrides the queue's defaults (`default_group_weight`,
`default_group_max_per_second`) for one group, `DELETE` drops the overrides (the
defaults apply again). Both answer the group as it is then (its backlog, in flight,
weight, rate); the listing is `GET /API/v1/queues/{name}/groups` (`routes.py`).
A thin translation onto `QueueService.set_group_policy`; the admin scope (doq.auth.table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Path, Request
from pydantic import ConfigDict, Field
from starlette.responses import Response

from doq.queues import limits as L
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.http.routes import QueueName, http_caller

if TYPE_CHECKING:
    from doq.service.api import QueueService

GroupName = Annotated[str, Path(
    description="The group name as messages carry it, percent-encoded (a `/` in it may also be sent as it "
                "is); the default group (messages sent without one) is the empty name: `.../groups/`.",
    examples=["tenant-a"], json_schema_extra={"pattern": m.NO_NUL},
)]
JSON = "application/json"


class GroupPolicyBody(m._In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"weight": 5}, {"max_per_second": 100},
                                                              {"weight": 2, "max_per_second": 0}]})
    weight: int | None = Field(
        None, ge=1, le=L.MAX_GROUP_WEIGHT,
        description="Deliveries per turn of the round-robin (a group of weight 5 gets 5 for another's 1). "
                    "Omitted: unchanged.")
    max_per_second: int | None = Field(
        None, ge=0, le=L.MAX_GROUP_RATE,
        description="Deliveries per second at most (0 = no limit); a group over it is skipped, the others go "
                    "on. Omitted: unchanged.")


class GroupResult(m._Out):
    success: bool
    group: m.GroupModel


def build_groups_router(api: QueueService) -> APIRouter:
    r = APIRouter(prefix="/API/v1", generate_unique_id_function=operation_id, route_class=LeanRoute)

    @r.put("/queues/{name}/groups/{group:path}", tags=["queues"], response_model=GroupResult,
           summary="Set a group's weight or rate", response_description="The group with its weight and rate now.",
           responses=errors(400, 404, 409, 413, 415), openapi_extra=body_doc(GroupPolicyBody))
    async def set_group_policy(name: QueueName, group: GroupName, request: Request) -> Response:
        """Give one group of a fair queue its own `weight` and/or `max_per_second` (either
        optional; an omitted or null one is unchanged), in place of the queue's `default_group_weight` /
        `default_group_max_per_second`. A delayed queue has no groups: 409 NOT_FAIR_QUEUE."""
        b = await read_json(request, GroupPolicyBody)
        g = await api.set_group_policy(name, group, b.weight, b.max_per_second, caller=http_caller(request))
        return Response(m.dumps({"success": True, "group": m.group_dict(g)}), media_type=JSON)

    @r.delete("/queues/{name}/groups/{group:path}", tags=["queues"], response_model=GroupResult,
              summary="Drop a group's own weight and rate", response_description="The group with the queue's "
              "defaults.", responses=errors(400, 404, 409))
    async def reset_group_policy(name: QueueName, group: GroupName, request: Request) -> Response:
        """The group takes the queue's defaults again (its messages stay)."""
        g = await api.set_group_policy(name, group, reset=True, caller=http_caller(request))
        return Response(m.dumps({"success": True, "group": m.group_dict(g)}), media_type=JSON)

    return r
