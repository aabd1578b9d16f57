"""One rule, one place: HTTP, gRPC and the state machine give the same answer (accepted or
refused as invalid) at each bound of doq.queues.limits and just beyond it, and for queue
names (a full match: "jobs\\n" is not "jobs").

HTTP and gRPC run over one real service (LocalNode, LMDB in a temp dir); the machine is
driven directly with commands, as the log would. Values below 0 cannot be sent over gRPC
(the proto fields are unsigned), so those rows compare HTTP and the machine only.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.errors import InvalidArgument
from doq.queues import commands as c
from doq.queues import limits as L
from doq.queues.machine import QueueMachine
from doq.queues.model import QueueSettings
from doq.queues.store import MemoryStore
from doq.service.api import QueueService
from tests.support.inproc import grpc_stub, http_client, local_service, user_records

Q = "/API/v1/queues"
T0 = 1_700_000_000_000
_names = (f"q{i}" for i in itertools.count())
_indexes = itertools.count(1)


@dataclass
class Sides:
    service: QueueService
    http: httpx.AsyncClient
    grpc: pb_grpc.DOQStub
    machine: QueueMachine


@pytest.fixture
async def sides(tmp_path: Path) -> AsyncIterator[Sides]:
    async with local_service(tmp_path) as service, http_client(service) as http, grpc_stub(service) as stub:
        yield Sides(service, http, stub, QueueMachine(MemoryStore()))


def machine_answer(m: QueueMachine, *cmds: c.Command) -> bool:
    """True if the machine accepted the last command (False: refused as invalid)."""
    res: Any = m.apply(next(_indexes), c.CommandBatch(T0, list(cmds)))[-1]
    if isinstance(res, list) and res:
        res = res[0]  # Enqueue: one result per item; Dequeue: the messages
    if isinstance(res, InvalidArgument):
        return False
    assert not isinstance(res, Exception), res
    return True


def http_answer(r: httpx.Response) -> bool:
    if r.status_code == 400:
        assert r.headers["content-type"] == "application/problem+json"
        return False
    assert r.status_code in (200, 201, 204), r.text
    return True


async def grpc_answer(call: Awaitable[Any]) -> bool:
    try:
        res = await call
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        return False
    if isinstance(res, pb.EnqueueResponse) and not res.success:
        assert res.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], res
        return False
    return True


# -- queue settings ----------------------------------------------------------------------------
SETTINGS_BOUNDS = [
    ("visibility_timeout_ms", L.MAX_VISIBILITY_TIMEOUT_MS),
    ("max_attempts", L.MAX_ATTEMPTS),
    ("max_unacked_per_group", L.MAX_UNACKED_PER_GROUP),
    ("dedup_window_ms", L.MAX_DEDUP_WINDOW_MS),
]
SETTINGS_CASES = [(f, v, v <= hi) for f, hi in SETTINGS_BOUNDS for v in (hi, hi + 1)]


@pytest.mark.parametrize(("field", "value", "valid"), SETTINGS_CASES)
async def test_settings_bound_same_answer_everywhere(sides: Sides, field: str, value: int, valid: bool) -> None:
    before = user_records(sides.service)
    answers = {
        "http": http_answer(await sides.http.post(Q, json={"name": next(_names), "settings": {field: value}})),
        "grpc": await grpc_answer(sides.grpc.CreateQueue(pb.CreateQueueRequest(
            name=next(_names), settings=pb.QueueSettings(**{field: value})))),
        "machine": machine_answer(sides.machine, c.CreateQueue(
            next(_names), "delayed", QueueSettings(**{field: value}))),  # type: ignore[arg-type]
    }
    assert answers == dict.fromkeys(answers, valid)
    if not valid:
        assert user_records(sides.service) == before


@pytest.mark.parametrize(("field", "value", "valid"), [(f, v, v >= 0) for f, _ in SETTINGS_BOUNDS for v in (0, -1)])
async def test_settings_lower_bound_http_and_machine(sides: Sides, field: str, value: int, valid: bool) -> None:
    answers = {
        "http": http_answer(await sides.http.post(Q, json={"name": next(_names), "settings": {field: value}})),
        "machine": machine_answer(sides.machine, c.CreateQueue(
            next(_names), "delayed", QueueSettings(**{field: value}))),  # type: ignore[arg-type]
    }
    assert answers == dict.fromkeys(answers, valid)


# -- command arguments ---------------------------------------------------------------------------
Case = Callable[[Sides, str, int], Awaitable[dict[str, bool]]]


async def _enqueue_delay(s: Sides, q: str, v: int) -> dict[str, bool]:
    return {
        "http": http_answer(await s.http.post(f"{Q}/{q}/messages", json={"content": "a", "delay_ms": v})),
        "grpc": await grpc_answer(s.grpc.Enqueue(pb.EnqueueRequest(queue_name=q, content=b"a", delay_ms=v))),
        "machine": machine_answer(s.machine, c.Enqueue(q, [c.EnqueueItem(b"a", delay_ms=v)])),
    }


async def _enqueue_priority(s: Sides, q: str, v: int) -> dict[str, bool]:
    answers = {
        "http": http_answer(await s.http.post(f"{Q}/{q}/messages", json={"content": "a", "priority": v})),
        "machine": machine_answer(s.machine, c.Enqueue(q, [c.EnqueueItem(b"a", priority=v)])),
    }
    if L.PRIORITY_MIN <= v <= L.PRIORITY_MAX:  # int64 on the wire: nothing beyond can be sent
        answers["grpc"] = await grpc_answer(s.grpc.Enqueue(pb.EnqueueRequest(queue_name=q, content=b"a", priority=v)))
    return answers


async def _dequeue_visibility(s: Sides, q: str, v: int) -> dict[str, bool]:
    return {
        "http": http_answer(await s.http.get(f"{Q}/{q}/messages", params={"visibility_timeout_ms": v})),
        "grpc": await grpc_answer(s.grpc.Dequeue(pb.DequeueRequest(queue_name=q, visibility_timeout_ms=v))),
        "machine": machine_answer(s.machine, c.Dequeue(q, 1, False, v)),
    }


async def _dequeue_max_messages(s: Sides, q: str, v: int) -> dict[str, bool]:
    return {
        "http": http_answer(await s.http.post(f"{Q}/{q}/messages:dequeue", json={"max_messages": v})),
        "grpc": await grpc_answer(s.grpc.Dequeue(pb.DequeueRequest(queue_name=q, max_messages=v))),
        "machine": machine_answer(s.machine, c.Dequeue(q, v)),
    }


async def _dequeue_wait(s: Sides, q: str, v: int) -> dict[str, bool]:
    """A long poll's bound is the service's (the machine never waits); a ready message
    makes even the longest valid wait return at once."""
    await s.service.enqueue(q, c.EnqueueItem(b"a"))
    await s.service.enqueue(q, c.EnqueueItem(b"b"))
    return {
        "http": http_answer(await s.http.get(f"{Q}/{q}/messages", params={"wait_ms": v})),
        "grpc": await grpc_answer(s.grpc.Dequeue(pb.DequeueRequest(queue_name=q, wait_ms=v))),
    }


COMMAND_CASES: list[tuple[str, Case, int, bool]] = [
    *[("enqueue delay_ms", _enqueue_delay, v, v <= L.MAX_DELAY_MS) for v in (L.MAX_DELAY_MS, L.MAX_DELAY_MS + 1)],
    *[("enqueue priority", _enqueue_priority, v, L.PRIORITY_MIN <= v <= L.PRIORITY_MAX)
      for v in (L.PRIORITY_MAX, L.PRIORITY_MAX + 1, L.PRIORITY_MIN, L.PRIORITY_MIN - 1)],
    *[("dequeue visibility_timeout_ms", _dequeue_visibility, v, v <= L.MAX_VISIBILITY_TIMEOUT_MS)
      for v in (L.MAX_VISIBILITY_TIMEOUT_MS, L.MAX_VISIBILITY_TIMEOUT_MS + 1)],
    *[("dequeue max_messages", _dequeue_max_messages, v, v <= L.MAX_BATCH_MESSAGES)
      for v in (L.MAX_BATCH_MESSAGES, L.MAX_BATCH_MESSAGES + 1)],
    *[("dequeue wait_ms", _dequeue_wait, v, v <= L.MAX_WAIT_MS) for v in (L.MAX_WAIT_MS, L.MAX_WAIT_MS + 1)],
]


@pytest.mark.parametrize(("what", "case", "value", "valid"), COMMAND_CASES,
                         ids=[f"{w}={v}" for w, _, v, _ in COMMAND_CASES])
async def test_command_bound_same_answer_everywhere(
    sides: Sides, what: str, case: Case, value: int, valid: bool
) -> None:
    q = next(_names)
    await sides.service.create_queue(q)
    assert machine_answer(sides.machine, c.CreateQueue(q, "delayed", QueueSettings()))
    answers = await case(sides, q, value)
    assert answers == dict.fromkeys(answers, valid)


# -- queue names -------------------------------------------------------------------------------
NAMES = [
    ("jobs", True), ("jobs\n", False), ("\njobs", False), ("jobs\r\n", False),
    ("a" * L.MAX_QUEUE_NAME_CHARS, True), ("a" * (L.MAX_QUEUE_NAME_CHARS + 1), False),
    ("a" * L.MAX_QUEUE_NAME_CHARS + "\n", False), ("", False), ("-jobs", False),
]


# ids without backslashes: a test id is passed back to pytest on the command line (mutmut)
@pytest.mark.parametrize(("name", "valid"), NAMES,
                         ids=[f"{i}-{n[:12]!r}".replace("\\", "%") for i, (n, _) in enumerate(NAMES)])
async def test_queue_name_same_answer_everywhere(sides: Sides, name: str, valid: bool) -> None:
    before = user_records(sides.service)
    answers = {
        "http": http_answer(await sides.http.post(Q, json={"name": name})),
        "grpc": await grpc_answer(sides.grpc.CreateQueue(pb.CreateQueueRequest(name=name))),
        "machine": machine_answer(sides.machine, c.CreateQueue(name, "delayed", QueueSettings())),
    }
    if name:  # "" as a dead-letter queue means "none"
        answers["http dead_letter_queue"] = http_answer(await sides.http.post(
            Q, json={"name": next(_names), "settings": {"dead_letter_queue": name}}))
        answers["grpc dead_letter_queue"] = await grpc_answer(sides.grpc.CreateQueue(pb.CreateQueueRequest(
            name=next(_names), settings=pb.QueueSettings(dead_letter_queue=name))))
        answers["machine dead_letter_queue"] = machine_answer(sides.machine, c.CreateQueue(
            next(_names), "delayed", QueueSettings(dead_letter_queue=name)))
    assert answers == dict.fromkeys(answers, valid)
    if not valid:
        assert user_records(sides.service) == before
        names = [q["name"] for q in (await sides.http.get(Q)).json()["queues"]]
        assert name not in names and name.strip() not in names


async def test_a_newline_name_is_refused_in_paths_too(sides: Sides) -> None:
    """"jobs\\n" in a path (URL-encoded) or a gRPC request never reaches the queue "jobs"."""
    await sides.service.create_queue("jobs")
    await sides.service.enqueue("jobs", c.EnqueueItem(b"keep"))
    before = user_records(sides.service)
    for method, path, body in [("GET", f"{Q}/jobs%0A", None), ("POST", f"{Q}/jobs%0A/messages", {"content": "x"}),
                               ("GET", f"{Q}/jobs%0A/messages", None), ("DELETE", f"{Q}/jobs%0A", None)]:
        r = await sides.http.request(method, path, json=body)
        assert r.status_code == 400 and r.json()["reason"] == "INVALID_QUEUE_NAME", (method, path, r.text)
    for call in (sides.grpc.Enqueue(pb.EnqueueRequest(queue_name="jobs\n", content=b"x")),
                 sides.grpc.Dequeue(pb.DequeueRequest(queue_name="jobs\n")),
                 sides.grpc.DeleteQueue(pb.DeleteQueueRequest(name="jobs\n"))):
        assert await grpc_answer(call) is False
    assert user_records(sides.service) == before
