"""A real three-node cluster of `doq serve` processes on 127.0.0.1: formed by --join, a
message enqueued through one node is dequeued through another, kill -9 of any node
leaves the other two serving, and a restarted node catches up to identical state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import call, leader, three_nodes, until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path / "data") as nodes:
        yield nodes


def test_seed_style_cluster_serves_through_any_node_and_survives_kill9(cluster: list[NodeProc]) -> None:
    n1, n2, n3 = cluster
    status, _ = call(n2, "POST", "/API/v1/queues", {"name": "jobs"})  # forwarded to the leader
    assert status in (200, 201), status
    status, body = call(n2, "POST", "/API/v1/queues/jobs/messages", {"content": "hello"})
    assert status in (200, 201), body
    status, body = call(n3, "GET", "/API/v1/queues/jobs/messages?ack=true")
    assert status == 200, body
    assert body["content"] == "hello"

    victim = leader(cluster)
    victim.kill9()
    rest = [n for n in cluster if n is not victim]

    def enqueue_ok() -> bool:
        status, _ = call(rest[0], "POST", "/API/v1/queues/jobs/messages", {"content": "after"})
        return status in (200, 201)

    until("the two others serve", enqueue_ok)
    victim.start(timeout_s=90)  # rejoins from its own data

    def caught_up() -> bool:
        indexes = {call(n, "GET", "/cluster")[1]["applied_index"] for n in cluster}
        return len(indexes) == 1

    until("the restarted node catches up", caught_up)
    for n in cluster:
        status, body = call(n, "GET", "/API/v1/queues/jobs")
        assert status == 200, body
