"""Recovery of a real three-node cluster of `doq serve` processes on 127.0.0.1:

- kill -9 of every node at once under a pipelined producer, then a start of all three:
  every acknowledged enqueue is there exactly once; the same while the nodes compact
  their logs (a snapshot meta every 200 entries, the log discarded a few entries per
  write txn): they restart from logs that start further on;
- a node that was down while the log was compacted catches up by the leader's snapshot
  and ends with the leader's state: the same `GET /db/digest`, and byte-identical state
  databases (a digest of their dump, read from the files once the nodes stopped).
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import pytest

from doq_client import DoqClient, DoqClientError, EnqueueResult
from tests.support.cluster import (
    applied_indexes,
    call,
    leader,
    node_files,
    node_procs,
    running_cluster,
    state_dump_digest,
    until,
)

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


@pytest.mark.parametrize("compacting", [False, True], ids=["default", "compacting"])
def test_kill9_of_every_node_at_once_loses_nothing_acknowledged(tmp_path: Path, compacting: bool) -> None:
    extra = ["--snapshot-every", "200", "--keep-entries", "10"] if compacting else []
    with running_cluster(node_procs(tmp_path / "data", extra)) as nodes:
        client = DoqClient(leader(nodes).grpc_addr)
        client.create_queue("jobs")
        acked: dict[str, int] = {}
        submitted: list[str] = []
        lock = threading.Lock()

        def record(payload: str, fut: concurrent.futures.Future[EnqueueResult]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                with lock:
                    acked[payload] = fut.result().id

        def produce() -> None:
            producer = client.producer(window=256)
            try:
                for i in range(10_000_000):
                    payload = f"m-{i}"
                    submitted.append(payload)
                    producer.enqueue("jobs", payload).add_done_callback(
                        lambda f, p=payload: record(p, f))
            except (DoqClientError, RuntimeError):
                return  # the stream failed: the cluster is down

        producing = threading.Thread(target=produce, daemon=True)
        producing.start()
        until("500 acknowledged enqueues", lambda: len(acked) >= 500)
        if compacting:  # a few compactions' worth of entries: the kill finds one under way
            until("700 entries", lambda: max(applied_indexes(nodes).values(), default=0) > 700, 120)
        for n in nodes:  # all three, while enqueues are in flight
            n.kill9()
        client.close()  # fails whatever is still pending
        producing.join(60)
        assert not producing.is_alive()
        with lock:
            acked_at_crash = dict(acked)
        assert len(submitted) > len(acked_at_crash)  # some were in flight at the kill
        if compacting:
            for n in nodes:
                with node_files(n) as (_, log):  # at least one snapshot meta, its log compacted
                    assert log.snapshot_meta().index >= 200, n.node_id
                    assert 1 < log.first_index() <= log.snapshot_meta().index, n.node_id

        for n in nodes:
            n.launch()  # a member is ready only once a quorum runs
        for n in nodes:
            n.wait_ready(90)
        with DoqClient(leader(nodes).grpc_addr) as c:
            delivered: list[tuple[str, int]] = []
            while batch := c.dequeue("jobs", ack=True, max_messages=200):
                delivered += [(m.text, m.id) for m in batch]

    by_payload = dict(delivered)
    assert len(by_payload) == len(delivered), "a payload was stored twice"
    assert len({i for _, i in delivered}) == len(delivered), "an id was delivered twice"
    assert set(by_payload) <= set(submitted), "a payload never enqueued was delivered"
    lost = {p: i for p, i in acked_at_crash.items() if by_payload.get(p) != i}
    assert not lost, f"{len(lost)} of {len(acked_at_crash)} acknowledged enqueues lost, e.g. {list(lost.items())[:5]}"


def test_a_node_down_while_the_log_was_compacted_catches_up_by_snapshot_to_identical_state(
        tmp_path: Path) -> None:
    compact = ["--snapshot-every", "20", "--keep-entries", "5"]
    nodes = node_procs(tmp_path / "data", compact)
    lagging = nodes[2]
    lagging.extra_args = ["--snapshot-every", "0"]  # never snapshots itself: any snapshot it has was sent
    with running_cluster(nodes):
        if leader(nodes) is lagging:
            status, body = call(lagging, "POST", "/cluster/transfer-leader", {"target": "node-1"})
            assert status == 200, body
        lead = leader(nodes)
        assert lead is not lagging
        with DoqClient(lead.grpc_addr) as c:
            c.create_queue("jobs")
            c.create_queue("fair", type="fair")
            for i in range(10):
                c.enqueue("jobs", f"before-{i}")

            lagging.kill9()
            with node_files(lagging) as (state, log):
                down_at = state.applied_index
                assert log.snapshot_meta().index < down_at

            # 400 entries (each unary call is one) while it is down. The leader queues its
            # appends to the dead node until 256 are in flight (and the transport keeps them
            # for the reconnect); the entries after those are compacted away (a snapshot
            # every 20, 5 kept behind), so only a snapshot can bring it up to date
            for i in range(200):
                c.enqueue("jobs", f"during-{i}", priority=i % 7)
                c.enqueue("fair", f"fair-{i}", group=f"g{i % 3}")
            c.enqueue("jobs", "later", delay_ms=HOUR_MS)
            leased = c.dequeue("jobs", max_messages=5, visibility_timeout_ms=HOUR_MS)
            c.ack("jobs", leased[0].id, leased[0].lease_id)
            for _ in range(20):
                c.dequeue("fair", ack=True)
            c.delete("jobs", leased[1].id)

        lagging.start(timeout_s=90)  # ready = has applied up to the commit index it learned

        def converged() -> bool:
            indexes = applied_indexes(nodes)
            return len(indexes) == 3 and len(set(indexes.values())) == 1
        until("the three nodes at one applied index", converged)
        # nothing is due for an hour: no entry follows, and the applied index is durable
        live = {n.node_id: call(n, "GET", "/db/digest")[1] for n in nodes}
        assert len({(d["applied_index"], d["digest"]) for d in live.values()}) == 1, live
        for n in nodes:
            n.kill9()

    with node_files(lagging) as (state, log):
        installed_at = log.snapshot_meta().index
    assert installed_at > down_at, "the lagging node caught up from the log, not by a snapshot"
    dumps = {n.node_id: state_dump_digest(n) for n in nodes}  # byte-identical, not just equal records
    assert len(set(dumps.values())) == 1, dumps
