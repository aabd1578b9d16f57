"""A leader that stops answering (SIGSTOP: a frozen VM, a long GC pause, a stuck disk) while
its process and sockets stay open. The other two elect a new leader; the client must move
to it on its own — not wait for its deadline on the paused node — without storing what it
produced twice (dedup ids) or losing what it consumed (leases).

Each test keeps the old leader stopped until the client's work is done, so work that
finishes proves the client moved away (a client stuck on the paused node could only
finish after SIGCONT); the only bound is the calls' deadline, ~15x what moving takes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from doq_client import DoqClient, DoqClientError, FailoverPolicy
from tests.support.cluster import call, cluster_view, leader, three_nodes, until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration
CALL_TIMEOUT_S = 45
"""Deadline of every call and of the client's failover: ~15x what moving takes (a ping
unanswered for 2 s, an election, a retry), and less than the 1 minute a gRPC channel waits
for a ping's answer by default — a client without its own ping timeout fails here."""


@pytest.fixture
def paused(tmp_path: Path) -> Iterator[tuple[list[NodeProc], NodeProc, DoqClient]]:
    """Three nodes, a queue "q", a client that knows all three, and the leader stopped."""
    with three_nodes(tmp_path / "data") as nodes:
        lead = leader(nodes)
        assert call(lead, "POST", "/API/v1/queues", {"name": "q", "type": "delayed"})[0] == 201
        addrs = [lead.grpc_addr, *(n.grpc_addr for n in nodes if n is not lead)]  # the leader first
        with DoqClient(addrs, timeout_s=CALL_TIMEOUT_S,
                       failover=FailoverPolicy(timeout_s=CALL_TIMEOUT_S)) as client:
            client.get_queue("q")  # the client's channel to the leader is open
            assert lead.proc is not None
            os.kill(lead.proc.pid, signal.SIGSTOP)
            try:
                yield nodes, lead, client
            finally:
                os.kill(lead.proc.pid, signal.SIGCONT)
        # the deposed leader resumes, learns of the new term and answers what it held: no
        # "Future exception was never retrieved" in any node's log
        until("the old leader follows", lambda: cluster_view(lead.http_url)["leader_id"] not in ("", lead.node_id),
              CALL_TIMEOUT_S)
        for n in nodes:
            assert "never retrieved" not in n.log(), n.log()[-3000:]


def _live_stats(nodes: list[NodeProc], old: NodeProc) -> dict[str, int]:
    live = [n for n in nodes if n is not old]
    new = leader(live)
    status, body = call(new, "GET", "/API/v1/queues/q")
    assert status == 200, body
    return body["stats"]  # type: ignore[no-any-return]


def test_unary_calls_move_to_the_new_leader(paused: tuple[list[NodeProc], NodeProc, DoqClient]) -> None:
    nodes, old, client = paused
    first = client.enqueue("q", "a", dedup_id="d-a")  # repeatable: the client may send it again
    again = client.enqueue("q", "a", dedup_id="d-a")
    assert again.duplicate and again.id == first.id
    assert client.router.current != old.grpc_addr
    [m] = client.dequeue("q", max_messages=1)
    assert m.content == b"a"
    client.ack("q", m.id, lease_id=m.lease_id)
    assert _live_stats(nodes, old)["total"] == 0


def test_streams_move_to_the_new_leader(paused: tuple[list[NodeProc], NodeProc, DoqClient]) -> None:
    nodes, old, client = paused
    n = 30
    with client.producer(window=8) as p:
        futs = [p.enqueue("q", f"m{i}") for i in range(n)]
        ids = [f.result(timeout=CALL_TIMEOUT_S).id for f in futs]
    assert len(set(ids)) == n
    seen: list[bytes] = []
    with client.consumer("q", prefetch=4) as cons:
        for msg in cons:
            seen.append(msg.content)
            cons.ack(msg)
            if len(seen) == n:
                break
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(n))  # each once: no duplicate stored
    until("every ack applied", lambda: _live_stats(nodes, old)["total"] == 0, CALL_TIMEOUT_S)


def test_a_lease_that_ended_while_its_dequeue_waited_for_a_quorum_is_not_handed_out(tmp_path: Path) -> None:
    """A dequeue proposed while both followers are paused cannot commit; the lease it asks
    for (1 s) ends meanwhile. When the quorum is back, whatever happens to the entry (the old
    leader leads again and commits it, or another member's entries replace it), the message
    is not handed out with an ended lease and is ready again with no attempt counted: if
    the entry commits, the leader that applies it (the old one or another) finds the lease
    ended and releases it, and the machine lets that release win over the lease's expiry
    in the batch that finds it due; if it is replaced, it never applied."""
    with three_nodes(tmp_path / "data") as nodes:
        lead = leader(nodes)
        assert call(lead, "POST", "/API/v1/queues", {
            "name": "q", "type": "delayed", "settings": {"visibility_timeout_ms": 1000}})[0] == 201
        assert call(lead, "POST", "/API/v1/queues/q/messages", {"content": "a"})[0] in (200, 201)
        followers = [n for n in nodes if n is not lead]
        outcome: list[object] = []
        with DoqClient(lead.grpc_addr, timeout_s=CALL_TIMEOUT_S, failover=FailoverPolicy(timeout_s=0)) as c:
            for f in followers:
                assert f.proc is not None
                os.kill(f.proc.pid, signal.SIGSTOP)
            try:
                worker = threading.Thread(target=lambda: outcome.append(_dequeue_or_error(c)))
                worker.start()
                # the lease the dequeue asks for ends while it waits (the leader also steps
                # down meanwhile: it hears from no quorum)
                until("the leader steps down", lambda: cluster_view(lead.http_url)["leader_id"] != lead.node_id,
                      CALL_TIMEOUT_S)
                time.sleep(1.5)
            finally:
                for f in followers:
                    os.kill(f.proc.pid, signal.SIGCONT)
            worker.join(CALL_TIMEOUT_S)
        assert outcome, "the dequeue did not return"
        assert outcome[0] == [] or isinstance(outcome[0], DoqClientError), outcome  # never the message
        if isinstance(outcome[0], DoqClientError):
            assert outcome[0].reason in ("NOT_LEADER", "OUTCOME_UNKNOWN"), outcome
        new = leader(nodes)

        def settled() -> dict[str, object] | None:
            status, body = call(new, "GET", "/API/v1/queues/q/messages/1")
            return body if status == 200 and body["state"] == "ready" else None

        msg = until("the message is ready", settled, CALL_TIMEOUT_S)
        # committed (the answer []: released unsent), replaced (NOT_LEADER: never applied)
        # or either (OUTCOME_UNKNOWN: the old leader did not learn its fate in time)
        assert msg["attempts"] == 0, (msg, outcome, new.node_id)


def _dequeue_or_error(c: DoqClient) -> object:
    try:
        return c.dequeue("q", max_messages=1)
    except DoqClientError as e:
        return e


def test_a_long_poll_outlives_the_clients_pings(tmp_path: Path) -> None:
    """The client pings every second while a call is open; the node accepts that (gRPC's
    default would answer the third ping of a quiet call with GOAWAY too_many_pings)."""
    with running_node(tmp_path / "data") as node, DoqClient(node.grpc_addr, timeout_s=CALL_TIMEOUT_S) as c:
        c.create_queue("q")
        assert c.dequeue("q", wait_ms=5_000) == []
        c.enqueue("q", "a")
        [m] = c.dequeue("q", wait_ms=5_000)
        assert m.content == b"a"
