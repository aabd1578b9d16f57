"""A redrive on a real three-node cluster: the leader is killed (SIGKILL) while the task
runs, a new leader finishes it from the replicated progress, and every message arrives in
the target queue exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import alive, call, leader, state_dump_digest, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

N = 150
RATE = 25  # messages a second: the task runs ~6 s of replicated time


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path / "data") as nodes:
        yield nodes


def test_leader_killed_mid_redrive_the_new_leader_finishes_it(cluster: list[NodeProc]) -> None:
    first = leader(cluster)
    some = next(n for n in cluster if n is not first)
    for body in ({"name": "dlq", "type": "fair"},
                 {"name": "orders", "settings": {"max_attempts": 1, "dead_letter_queue": "dlq"}}):
        status, doc = call(some, "POST", "/API/v1/queues", body)
        assert status == 201, doc
    msgs = [{"content": f"m{i}", "group": f"g{i % 3}", "metadata": {"i": str(i)}, "dedup_id": f"d{i}"}
            for i in range(N)]
    status, doc = call(some, "POST", "/API/v1/queues/dlq/messages:batch", {"messages": msgs})
    assert status == 200, doc

    status, doc = call(some, "POST", "/API/v1/queues/dlq/redrive", {"max_per_second": RATE})
    assert status == 202, doc
    assert (doc["to"], doc["total"]) == ("orders", N)

    def some_moved() -> dict | None:
        s, d = call(first, "GET", "/API/v1/queues/dlq/redrive")
        return d if s == 200 and d["moved"] >= 5 else None

    before = until("a few messages moved", some_moved)
    assert before["state"] == "running" and before["moved"] < N, before
    first.kill9()  # mid-redrive
    rest = [n for n in cluster if alive(n)]

    def ended() -> dict | None:
        s, d = call(rest[0], "GET", "/API/v1/queues/dlq/redrive")
        return d if s == 200 and d["state"] != "running" else None

    done = until("the new leader finishes the redrive", ended, timeout_s=180)
    assert (done["state"], done["moved"], done["remaining"]) == ("completed", N, 0), done
    assert leader(rest) is not first
    status, q = call(rest[0], "GET", "/API/v1/queues/dlq")
    assert q["stats"]["total"] == 0
    status, q = call(rest[1], "GET", "/API/v1/queues/orders")
    assert q["stats"]["ready"] == N

    got: list[dict] = []
    while True:
        status, doc = call(rest[1], "POST", "/API/v1/queues/orders/messages:dequeue",
                           {"max_messages": 100, "ack": True})
        assert status == 200, doc
        if not doc["messages"]:
            break
        got += doc["messages"]
    # nothing lost, nothing twice; content, group, metadata and dedup id kept; attempts from 0
    assert sorted((m["content"], m["group"], m["metadata"]["i"], m["dedup_id"]) for m in got) == \
        sorted((f"m{i}", f"g{i % 3}", str(i), f"d{i}") for i in range(N))
    assert {m["attempts"] for m in got} == {1}

    # the killed node comes back, catches up, and holds the same state (task record included)
    first.start(timeout_s=90)

    def caught_up() -> bool:
        return len({call(n, "GET", "/cluster")[1]["applied_index"] for n in cluster}) == 1

    until("the restarted node catches up", caught_up, timeout_s=120)
    status, again = call(first, "GET", "/API/v1/queues/dlq/redrive")
    assert status == 200 and again == done | {"updated_at_ms": again["updated_at_ms"]}
    for n in cluster:  # a direct reader of LMDB: each node commits what it holds (the batched commit)
        assert call(n, "GET", "/db/digest")[0] == 200
    for n in cluster:
        n.kill9()
    assert len({state_dump_digest(n) for n in cluster}) == 1
