"""Fair-queue group policies over HTTP and gRPC (the real service over LMDB, in process):
`PUT|DELETE /API/v1/queues/{name}/groups/{group}`, `GET .../groups`, the queue settings
`default_group_weight` / `default_group_max_per_second`, `SetGroupPolicy` / `ListGroups`;
every refusal is a clear problem (or status) and changes nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.service.api import QueueService
from tests.http.test_gateway_unit import assert_problem
from tests.support.inproc import served, user_records

Q = "/API/v1/queues"


async def _fair(client: httpx.AsyncClient, name: str = "fq", **settings: int) -> None:
    r = await client.post(Q, json={"name": name, "type": "fair", "settings": settings})
    assert r.status_code == 201, r.text


async def test_put_get_delete_a_group_policy_and_queue_defaults(client: httpx.AsyncClient,
                                                                 service: QueueService) -> None:
    await _fair(client, default_group_weight=2, default_group_max_per_second=0)
    r = await client.get(f"{Q}/fq")
    assert r.json()["settings"]["default_group_weight"] == 2
    assert r.json()["settings"]["default_group_max_per_second"] == 0
    r = await client.put(f"{Q}/fq/groups/paying", json={"weight": 5})
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "group": {
        "group": "paying", "ready": 0, "in_flight": 0, "weight": 5, "max_per_second": 0, "throttled": False,
        "overridden": True}}
    before = user_records(service)
    r = await client.put(f"{Q}/fq/groups/other", json={})  # neither given: the group as it is
    assert r.status_code == 200 and r.json()["group"]["weight"] == 2
    assert user_records(service) == before
    r = await client.put(f"{Q}/fq/groups/noisy", json={"max_per_second": 100})
    assert r.json()["group"]["weight"] == 2 and r.json()["group"]["max_per_second"] == 100
    for g in ("paying", "free"):
        r = await client.post(f"{Q}/fq/messages:batch", json={"messages": [{"content": "x", "group": g}] * 12})
        assert r.status_code == 200, r.text
    got = []
    for _ in range(7):
        r = await client.get(f"{Q}/fq/messages", params={"ack": "true"})
        got.append(r.json()["group"])
    assert got == ["free", "free", "paying", "paying", "paying", "paying", "paying"]
    groups = (await client.get(f"{Q}/fq/groups")).json()
    assert [(g["group"], g["ready"], g["weight"], g["max_per_second"], g["overridden"]) for g in groups["groups"]] == [
        ("free", 10, 2, 0, False), ("noisy", 0, 2, 100, True), ("paying", 7, 5, 0, True)]
    r = await client.delete(f"{Q}/fq/groups/paying")
    assert r.json()["group"] == {"group": "paying", "ready": 7, "in_flight": 0, "weight": 2, "max_per_second": 0,
                                 "throttled": False, "overridden": False}
    r = await client.put(f"{Q}/fq", json={"settings": {"default_group_weight": 3}})
    assert r.json()["queue"]["settings"]["default_group_weight"] == 3
    assert [g["weight"] for g in (await client.get(f"{Q}/fq/groups")).json()["groups"]] == [3, 3, 3]


async def test_the_default_group_and_groups_holding_a_slash_are_addressed_over_http(
        client: httpx.AsyncClient) -> None:
    """`.../groups/` is the default group "" (messages sent without a group); a `/` in a
    group's name may come percent-encoded or as it is."""
    await _fair(client)
    r = await client.put(f"{Q}/fq/groups/", json={"max_per_second": 7})
    assert r.status_code == 200 and r.json()["group"]["group"] == "" and r.json()["group"]["max_per_second"] == 7
    r = await client.put(f"{Q}/fq/groups/tenant%2Fa", json={"weight": 4})
    assert r.status_code == 200 and r.json()["group"]["group"] == "tenant/a", r.text
    r = await client.put(f"{Q}/fq/groups/tenant/b/c", json={"weight": 2})
    assert r.status_code == 200 and r.json()["group"]["group"] == "tenant/b/c", r.text
    r = await client.post(f"{Q}/fq/messages:batch", json={"messages": [{"content": "x"}, {"content": "y"}]})
    assert r.status_code == 200, r.text
    groups = {g["group"]: g for g in (await client.get(f"{Q}/fq/groups")).json()["groups"]}
    assert (groups[""]["ready"], groups[""]["max_per_second"]) == (2, 7)
    assert groups["tenant/a"]["weight"] == 4 and groups["tenant/b/c"]["weight"] == 2
    r = await client.delete(f"{Q}/fq/groups/")
    assert r.status_code == 200 and r.json()["group"]["max_per_second"] == 0 and not r.json()["group"]["overridden"]
    r = await client.delete(f"{Q}/fq/groups/tenant/a")
    assert r.status_code == 200 and r.json()["group"]["group"] == "tenant/a" and not r.json()["group"]["overridden"]


@pytest.mark.parametrize(("method", "path", "body", "status", "reason"), [
    ("PUT", f"{Q}/fq/groups/g", {"weight": 0}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"weight": -1}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"weight": 10_001}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"weight": 10**30}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"weight": "5"}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"max_per_second": -1}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"max_per_second": 1_000_001}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"max_per_second": 1.5}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"rate": 1}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq/groups/g", {"weight": None, "rate": None}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/nope/groups/g", {"weight": 2}, 404, "QUEUE_NOT_FOUND"),
    ("PUT", f"{Q}/dq/groups/g", {"weight": 2}, 409, "NOT_FAIR_QUEUE"),
    ("DELETE", f"{Q}/dq/groups/g", None, 409, "NOT_FAIR_QUEUE"),
    ("DELETE", f"{Q}/nope/groups/g", None, 404, "QUEUE_NOT_FOUND"),
    ("PUT", f"{Q}/fq", {"settings": {"default_group_weight": -1}}, 400, "INVALID_REQUEST"),
    ("PUT", f"{Q}/fq", {"settings": {"default_group_max_per_second": 2_000_000}}, 400, "INVALID_REQUEST"),
])
async def test_bad_group_requests_are_problems_and_change_nothing(
        client: httpx.AsyncClient, service: QueueService, method: str, path: str, body: object, status: int,
        reason: str) -> None:
    await _fair(client)
    assert (await client.post(Q, json={"name": "dq", "type": "delayed"})).status_code == 201
    assert (await client.put(f"{Q}/fq/groups/g", json={"weight": 4, "max_per_second": 9})).status_code == 200
    before = user_records(service)
    r = await client.request(method, path, json=body)
    assert_problem(r, status, reason)
    assert user_records(service) == before


async def test_openapi_document_has_the_group_routes(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert {"put", "delete"} <= set(doc["paths"]["/API/v1/queues/{name}/groups/{group}"])
    assert "get" in doc["paths"]["/API/v1/queues/{name}/groups"]
    body = doc["components"]["schemas"]["GroupPolicyBody"]["properties"]
    assert body["weight"]["anyOf"][0]["minimum"] == 1 and body["max_per_second"]["anyOf"][0]["minimum"] == 0
    group = doc["components"]["schemas"]["GroupModel"]["properties"]
    assert {"ready", "in_flight", "weight", "max_per_second"} <= set(group)
    settings = doc["components"]["schemas"]["QueueSettingsModel"]["properties"]
    assert {"default_group_weight", "default_group_max_per_second"} <= set(settings)


async def test_grpc_set_group_policy_and_list_groups(tmp_path: Path) -> None:
    async with served(tmp_path) as s:
        await s.stub.CreateQueue(pb.CreateQueueRequest(name="fq", type="fair", settings=pb.QueueSettings(
            default_group_max_per_second=50)))
        await s.stub.CreateQueue(pb.CreateQueueRequest(name="dq", type="delayed"))
        r = await s.stub.SetGroupPolicy(pb.SetGroupPolicyRequest(queue_name="fq", group="", weight=3))
        assert (r.group.group, r.group.weight, r.group.max_per_second, r.group.overridden) == ("", 3, 50, True)
        r = await s.stub.SetGroupPolicy(pb.SetGroupPolicyRequest(queue_name="fq", group="a/b", max_per_second=0))
        assert (r.group.weight, r.group.max_per_second) == (1, 0)
        got = await s.stub.ListGroups(pb.ListGroupsRequest(queue_name="fq"))
        assert [(g.group, g.weight, g.max_per_second) for g in got.groups] == [("", 3, 50), ("a/b", 1, 0)]
        assert (await s.stub.GetQueue(pb.GetQueueRequest(name="fq"))).queue.settings.default_group_max_per_second == 50
        before = user_records(s.api)
        for req, code in [
            (pb.SetGroupPolicyRequest(queue_name="fq", group="g", weight=0), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetGroupPolicyRequest(queue_name="fq", group="g", weight=2**32 - 1), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetGroupPolicyRequest(queue_name="fq", group="g", max_per_second=2**63),
             grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetGroupPolicyRequest(queue_name="fq", group="g", weight=2, reset=True),
             grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetGroupPolicyRequest(queue_name="dq", group="g", weight=2), grpc.StatusCode.FAILED_PRECONDITION),
            (pb.SetGroupPolicyRequest(queue_name="nope", group="g", weight=2), grpc.StatusCode.NOT_FOUND),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.stub.SetGroupPolicy(req)
            assert e.value.code() == code, req
        assert user_records(s.api) == before
        r = await s.stub.SetGroupPolicy(pb.SetGroupPolicyRequest(queue_name="fq", group="zz"))  # nothing to set
        assert (r.group.weight, r.group.max_per_second, r.group.overridden) == (1, 50, False)
        assert user_records(s.api) == before
        r = await s.stub.SetGroupPolicy(pb.SetGroupPolicyRequest(queue_name="fq", group="", reset=True))
        assert (r.group.weight, r.group.overridden) == (1, False)
