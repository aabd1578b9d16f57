"""Redrive over the HTTP gateway and gRPC (the real service over LMDB, in process): start,
progress, cancel, bad input that changes nothing, metrics."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from doq_proto.v1 import doq_pb2 as pb

from tests.support.inproc import grpc_stub, http_client, local_service, user_records

Q = "/API/v1/queues"


async def _setup(c: httpx.AsyncClient, n: int) -> None:
    for body in ({"name": "dlq", "type": "fair"},
                 {"name": "orders", "settings": {"max_attempts": 1, "dead_letter_queue": "dlq"}},
                 {"name": "other"}):
        assert (await c.post(Q, json=body)).status_code == 201
    msgs = [{"content": f"m{i}", "group": f"g{i % 2}", "metadata": {"i": str(i)}, "dedup_id": f"d{i}"}
            for i in range(n)]
    if msgs:
        r = await c.post(f"{Q}/dlq/messages:batch", json={"messages": msgs})
        assert r.status_code == 200, r.text


async def _until_ended(c: httpx.AsyncClient, name: str = "dlq") -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        doc = (await c.get(f"{Q}/{name}/redrive")).json()
        if doc["state"] != "running" or time.monotonic() > deadline:
            return doc  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)


async def test_redrive_moves_every_message_back_to_the_source(tmp_path: Path) -> None:
    async with local_service(tmp_path) as svc, http_client(svc) as c:
        await _setup(c, 30)
        r = await c.post(f"{Q}/dlq/redrive", json={"max_per_second": 200})
        assert r.status_code == 202, r.text
        t = r.json()
        assert (t["queue"], t["to"], t["state"], t["total"], t["max_per_second"]) == ("dlq", "orders", "running", 30, 200)
        doc = await _until_ended(c)
        assert (doc["state"], doc["moved"], doc["remaining"]) == ("completed", 30, 0)
        assert (await c.get(f"{Q}/orders")).json()["stats"]["ready"] == 30
        assert (await c.get(f"{Q}/dlq")).json()["stats"]["total"] == 0
        got = (await c.post(f"{Q}/orders/messages:dequeue", json={"max_messages": 30})).json()["messages"]
        assert sorted((m["content"], m["group"], m["metadata"]["i"], m["dedup_id"], m["attempts"]) for m in got) == \
            sorted((f"m{i}", f"g{i % 2}", str(i), f"d{i}", 1) for i in range(30))  # 1: this delivery
        metrics = (await c.get("/metrics")).text
        assert 'doq_redrive_messages{kind="moved",queue="dlq"} 30.0' in metrics
        assert 'doq_redrive_running{queue="dlq"} 0.0' in metrics


async def test_cancel_and_resume(tmp_path: Path) -> None:
    async with local_service(tmp_path) as svc, http_client(svc) as c:
        await _setup(c, 40)
        assert (await c.post(f"{Q}/dlq/redrive", json={"to": "other", "max_per_second": 1})).status_code == 202
        r = await c.delete(f"{Q}/dlq/redrive")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        moved = r.json()["moved"]
        assert 1 <= moved < 40
        again = await c.delete(f"{Q}/dlq/redrive")  # an ended task: as it is
        assert again.status_code == 200 and again.json() == r.json()
        await asyncio.sleep(1.2)  # a cancelled task moves nothing more, however long
        assert (await c.get(f"{Q}/dlq/redrive")).json()["moved"] == moved
        assert (await c.get(f"{Q}/other")).json()["stats"]["ready"] == moved
        r = await c.post(f"{Q}/dlq/redrive", json={"to": "other"})  # a new task: the rest
        assert r.status_code == 202 and r.json()["total"] == 40 - moved
        doc = await _until_ended(c)
        assert (doc["state"], doc["moved"]) == ("completed", 40 - moved)
        assert (await c.get(f"{Q}/other")).json()["stats"]["ready"] == 40


@pytest.mark.parametrize("path,body,status,reason", [
    ("nope", {}, 404, "QUEUE_NOT_FOUND"),
    ("dlq", {"to": "dlq"}, 400, "REDRIVE_TO_ITSELF"),
    ("dlq", {"to": "missing"}, 404, "QUEUE_NOT_FOUND"),
    ("dlq", {"max_per_second": -1}, 400, "INVALID_ARGUMENT"),
    ("dlq", {"max_per_second": 1.5}, 400, "INVALID_ARGUMENT"),
    ("dlq", {"to": "bad name!"}, 400, "INVALID_ARGUMENT"),
    ("dlq", {"unknown": 1}, 400, "INVALID_ARGUMENT"),
    ("other", {}, 409, "REDRIVE_TARGET_REQUIRED"),
])
async def test_bad_input_changes_nothing(tmp_path: Path, path: str, body: dict[str, Any], status: int,
                                         reason: str) -> None:
    async with local_service(tmp_path) as svc, http_client(svc) as c:
        await _setup(c, 5)
        before = user_records(svc)
        r = await c.post(f"{Q}/{path}/redrive", json=body)
        assert r.status_code == status, r.text
        if status != 400 or reason != "INVALID_ARGUMENT":  # (a body refused by its schema: the generic reason)
            assert r.json()["reason"] == reason
        assert user_records(svc) == before
        assert (await c.get(f"{Q}/dlq/redrive")).json()["reason"] == "REDRIVE_NOT_FOUND"


async def test_a_second_start_while_running_is_refused(tmp_path: Path) -> None:
    async with local_service(tmp_path) as svc, http_client(svc) as c:
        await _setup(c, 50)
        first = (await c.post(f"{Q}/dlq/redrive", json={"max_per_second": 1})).json()
        r = await c.post(f"{Q}/dlq/redrive", json={"to": "other"})
        assert r.status_code == 409 and r.json()["reason"] == "REDRIVE_RUNNING"
        now = (await c.get(f"{Q}/dlq/redrive")).json()
        assert (now["to"], now["max_per_second"], now["started_at_ms"], now["total"]) == (
            "orders", 1, first["started_at_ms"], 50)  # the running task, not replaced
        assert (await c.get(f"{Q}/other")).json()["stats"]["total"] == 0


async def test_grpc(tmp_path: Path) -> None:
    async with local_service(tmp_path) as svc, http_client(svc) as c, grpc_stub(svc) as stub:
        await _setup(c, 12)
        t = await stub.StartRedrive(pb.StartRedriveRequest(queue_name="dlq", max_per_second=0))
        assert (t.queue_name, t.to, t.total) == ("dlq", "orders", 12)
        got = await stub.GetRedrive(pb.GetRedriveRequest(queue_name="dlq"))
        assert (got.state, got.moved, got.remaining) == ("completed", 12, 0)
        assert (await stub.CancelRedrive(pb.CancelRedriveRequest(queue_name="dlq"))).state == "completed"
        for call, req, code, reason in [
            (stub.StartRedrive, pb.StartRedriveRequest(queue_name="nope"), grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND"),
            (stub.StartRedrive, pb.StartRedriveRequest(queue_name="dlq", to="dlq"), grpc.StatusCode.INVALID_ARGUMENT,
             "REDRIVE_TO_ITSELF"),
            (stub.StartRedrive, pb.StartRedriveRequest(queue_name="dlq", max_per_second=10**7),
             grpc.StatusCode.INVALID_ARGUMENT, "INVALID_RATE"),
            (stub.GetRedrive, pb.GetRedriveRequest(queue_name="other"), grpc.StatusCode.NOT_FOUND, "REDRIVE_NOT_FOUND"),
            (stub.CancelRedrive, pb.CancelRedriveRequest(queue_name="other"), grpc.StatusCode.NOT_FOUND,
             "REDRIVE_NOT_FOUND"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call(req)  # type: ignore[operator]
            assert e.value.code() == code
            assert dict(e.value.trailing_metadata() or ())["doq-reason"] == reason


async def test_the_task_survives_a_restart(tmp_path: Path) -> None:
    """Replicated state: a node stopped mid-redrive reloads the task from LMDB and goes on."""
    async with local_service(tmp_path) as svc, http_client(svc) as c:
        await _setup(c, 20)
        await c.post(f"{Q}/dlq/redrive", json={"max_per_second": 5})
        first = (await c.get(f"{Q}/dlq/redrive")).json()
    assert first["state"] == "running"
    async with local_service(tmp_path) as svc2, http_client(svc2) as c2:
        again = (await c2.get(f"{Q}/dlq/redrive")).json()
        assert again["started_at_ms"] == first["started_at_ms"] and again["moved"] >= first["moved"]
        doc = await _until_ended(c2)
        assert (doc["state"], doc["moved"]) == ("completed", 20)
        assert (await c2.get(f"{Q}/orders")).json()["stats"]["ready"] == 20
