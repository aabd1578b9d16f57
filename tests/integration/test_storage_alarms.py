"""Storage alarms on real `doq serve` processes (real LMDB, real HTTP and gRPC; the disk
tests on a small tmpfs of their own, mounted as root, so no other process moves its free
space): a node past `--max-data-size`, or under
`--disk-free-limit`, or whose write failed with ENOSPC, refuses writes that grow the state
with 507 / RESOURCE_EXHAUSTED and the reason, keeps serving reads, dequeues, acks and
deletes, and takes writes again by itself once space is freed: no restart (the same pid
throughout), nothing acknowledged lost. On a three-node cluster, one node's full store
stops the leader's growth and its freed space resumes it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

import doq_client
from tests.support.cluster import call, http_call, leader, node_procs, running_cluster, until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

CONTENT = "x" * 16_000
CANARY = ["canary-1", "canary-2", "canary-3"]


def _enqueue(node: NodeProc, queue: str, content: str = CONTENT) -> tuple[int, Any]:
    return call(node, "POST", f"/API/v1/queues/{queue}/messages", {"content": content})


def _fill(node: NodeProc, queue: str, content: str = CONTENT, limit: int = 10_000) -> tuple[int, Any]:
    """Enqueue until refused; returns (messages taken, the refusal's body)."""
    for n in range(limit):
        status, body = _enqueue(node, queue, content)
        if status not in (200, 201):
            assert status == 507, (status, body)
            return n, body
    raise AssertionError(f"{limit} enqueues taken: no alarm")


def _stats(node: NodeProc, queue: str) -> dict[str, int]:
    status, body = call(node, "GET", f"/API/v1/queues/{queue}")
    assert status == 200, body
    return dict(body["stats"])


def _canary(node: NodeProc) -> list[str]:
    """The canary queue and its messages; returns their ids."""
    assert call(node, "POST", "/API/v1/queues", {"name": "canary", "type": "delayed"})[0] == 201
    ids = []
    for c in CANARY:
        status, body = _enqueue(node, "canary", c)
        assert status in (200, 201), body
        ids.append(body["id"])
    return ids


def _canary_intact(node: NodeProc, ids: list[str]) -> None:
    """Every canary message is there, with its content (read without leasing)."""
    assert _stats(node, "canary")["total"] == len(CANARY)
    for mid, content in zip(ids, CANARY, strict=True):
        status, body = call(node, "GET", f"/API/v1/queues/canary/messages/{mid}")
        assert status == 200 and body["content"] == content, body


def _assert_refusal(body: dict[str, Any], reason: str) -> None:
    assert body["status"] == 507 and body["reason"] == reason and body["retryable"] is True, body
    assert "short of space" in body["detail"], body


def _readyz(node: NodeProc, *, ready: bool = True) -> dict[str, Any]:
    """`/readyz`'s body; with `ready`, once it answers 200 (an alarm alone does not make a
    node unready: it serves drains; it is briefly not ready while it applies what its
    leader committed, which a loaded machine stretches)."""
    got: list[tuple[int, Any]] = []

    def answered() -> bool:
        got[:] = [call(node, "GET", "/readyz")]
        return not ready or got[0][0] == 200

    until("ready", answered, timeout_s=60)
    return dict(got[0][1])


def _alarm_reasons(node: NodeProc) -> list[str]:
    """The reasons `/readyz` lists, ready or not (a node whose write waits for space
    has not applied up to its commit index: not ready)."""
    return [a["reason"] for a in _readyz(node, ready=False)["alarms"]]


def _applied_up_to_leaders_commit(cluster: list[NodeProc], node: NodeProc) -> None:
    """Wait until `node` has applied everything its leader had committed when this was
    called (`/cluster`'s `commit_index` on the leader, `applied_index` on the node)."""
    status, view = call(leader(cluster), "GET", "/cluster")
    assert status == 200, view
    target = int(view["commit_index"])

    def applied() -> bool:
        status, body = call(node, "GET", "/cluster")
        return status == 200 and int(body["applied_index"]) >= target

    until(f"{node.node_id} applied up to {target}", applied, timeout_s=60)


def _metrics(node: NodeProc) -> str:
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=30) as r:
        return str(r.read().decode())


def _gauge(metrics_text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", metrics_text, re.M)
    assert found is not None, name
    return float(found.group(1))


def _storage(node: NodeProc) -> dict[str, int]:
    status, body = call(node, "GET", "/cluster")
    assert status == 200 and body["storage"] is not None, body
    return dict(body["storage"])


def _grpc_enqueue_code(node: NodeProc) -> grpc.StatusCode:
    with grpc.insecure_channel(node.grpc_addr) as ch:
        try:
            pb_grpc.DOQStub(ch).Enqueue(pb.EnqueueRequest(queue_name="bulk", content=b"y" * 100), timeout=30)
        except grpc.RpcError as e:
            return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _drain_works(node: NodeProc, queue: str) -> None:
    """Under the alarm: a dequeue, an ack, a read and a delete are served."""
    status, msg = call(node, "GET", f"/API/v1/queues/{queue}/messages?ack=false")
    assert status == 200, msg
    status, body = call(node, "POST", f"/API/v1/queues/{queue}/messages/{msg['id']}/ack")
    assert status == 200, body
    status, msg = call(node, "GET", f"/API/v1/queues/{queue}/messages?ack=true")
    assert status == 200, msg
    status, peeked = call(node, "GET", f"/API/v1/queues/{queue}/messages?ack=false")
    assert status == 200, peeked
    status, got = call(node, "GET", f"/API/v1/queues/{queue}/messages/{peeked['id']}")
    assert status == 200 and got["id"] == peeked["id"], got
    status, body = call(node, "DELETE", f"/API/v1/queues/{queue}/messages/{peeked['id']}")
    assert status == 200, body


def _resumes(node: NodeProc, queue: str) -> float:
    """Seconds until an enqueue is taken again (polling)."""
    t0 = time.monotonic()
    until("writes resume", lambda: _enqueue(node, queue, "after")[0] in (200, 201), timeout_s=60)
    return time.monotonic() - t0


def test_a_node_past_its_max_data_size_refuses_growth_serves_drains_and_resumes_after_a_purge(tmp_path: Path) -> None:
    with running_node(tmp_path / "data", extra_args=["--max-data-size", "4MiB", "--disk-free-limit", "0"]) as node:
        assert node.proc is not None
        pid = node.proc.pid
        canary = _canary(node)
        assert call(node, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})[0] == 201
        taken, refusal = _fill(node, "bulk")
        assert 100 < taken < 4 * 2**20 // len(CONTENT), taken  # the limit, not the disk, stopped it
        _assert_refusal(refusal, "DATA_SIZE_LIMIT")
        assert [a["reason"] for a in _readyz(node)["alarms"]] == ["DATA_SIZE_LIMIT"]
        text = _metrics(node)
        assert 'doq_storage_alarm{node="node-1",reason="DATA_SIZE_LIMIT"} 1.0' in text
        # what the store takes, as /cluster, `doq cluster status` and the dashboard show it
        assert "\ndoq_storage_limit_bytes 4.194304e+06\n" in text
        full = _storage(node)
        assert full["max_bytes"] == 4 * 2**20 and 2 * 2**20 < full["used_bytes"] <= 4 * 2**20 + 2**20, full
        assert full["disk_free_bytes"] > 0 and full["disk_free_limit_bytes"] == 0
        assert _gauge(text, "doq_storage_used_bytes") > 2 * 2**20
        assert _grpc_enqueue_code(node) == grpc.StatusCode.RESOURCE_EXHAUSTED
        with doq_client.DoqClient(node.grpc_addr) as client, pytest.raises(doq_client.StorageFull) as refused:
            client.enqueue("bulk", b"z")
        assert refused.value.reason == "DATA_SIZE_LIMIT" and refused.value.retryable
        status, body = call(node, "POST", "/API/v1/queues", {"name": "more", "type": "delayed"})
        assert status == 507, body
        assert _stats(node, "bulk")["total"] == taken  # every acknowledged enqueue is there
        _drain_works(node, "bulk")
        assert _stats(node, "bulk")["total"] == taken - 3  # one acked, one dequeued with ack, one deleted
        _canary_intact(node, canary)

        status, body = call(node, "POST", "/API/v1/queues/bulk/purge")
        assert status == 200 and body["purged"] == taken - 3, body
        _resumes(node, "bulk")
        assert _readyz(node)["alarms"] == []
        assert "doq_storage_alarm{" not in _metrics(node)
        assert _storage(node)["used_bytes"] < full["used_bytes"] - 2**20  # the purge gave its pages back
        _canary_intact(node, canary)
        assert node.proc.pid == pid and node.proc.poll() is None  # no restart


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")
def test_a_node_under_its_disk_free_limit_refuses_growth_until_a_ballast_file_is_removed(tmp_path: Path) -> None:
    """On a 64 MiB tmpfs of its own (no other process changes its free space): a ballast
    file takes the free space under the 16 MiB limit; removing it lifts the alarm."""
    with _tmpfs(tmp_path / "fs", "64m") as fs:
        data = fs / "data"
        with running_node(data, extra_args=["--disk-free-limit", "16MiB"]) as node:
            _canary(node)
            ballast = fs / "ballast"
            with open(ballast, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(fs).free - (8 << 20))
            until("the disk alarm", lambda: _alarm_reasons(node) == ["DISK_FREE_LIMIT"])
            status, body = call(node, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})
            _assert_refusal(body, "DISK_FREE_LIMIT")
            assert "--disk-free-limit" in body["detail"]
            _drain_works(node, "canary")
            ballast.unlink()
            _resumes(node, "canary")
            assert _stats(node, "canary")["total"] == len(CANARY) - 3 + 1


@pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")
def test_a_write_that_fails_with_enospc_is_retried_until_space_is_freed_and_loses_nothing(tmp_path: Path) -> None:
    """No limit set (`--disk-free-limit 0`): the disk really fills, a write fails with
    ENOSPC mid-way, nothing of it is applied, the node refuses growth (NOSPACE) and retries
    that write; removing a ballast file lets it through, without a restart."""
    with _tmpfs(tmp_path / "fs", "24m") as fs:
        data = fs / "data"
        ballast = fs / "ballast"
        with running_node(data, extra_args=["--disk-free-limit", "0"]) as node:
            assert node.proc is not None
            pid = node.proc.pid
            canary = _canary(node)
            assert call(node, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})[0] == 201
            with open(ballast, "wb") as f:  # leave ~4 MiB free
                os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(fs).free - (4 << 20))
            ok: list[int] = []
            waited: list[tuple[int, Any]] = []
            refused: list[dict[str, Any]] = []

            alarm_seen = threading.Event()

            def producer() -> None:  # one enqueue at a time: the one whose write fails waits
                while not alarm_seen.is_set():
                    status, body = http_call(node.http_url, "POST", "/API/v1/queues/bulk/messages",
                                             {"content": CONTENT}, timeout_s=600)
                    if status == 507 and body.get("reason") == "NOSPACE":
                        # answered before its commit failed (a node answers once applied in
                        # memory), its next call meets the alarm: refused, never applied
                        refused.append(body)
                        return
                    if status not in (200, 201):
                        waited.append((status, body))
                        return
                    ok.append(int(body["id"]))

            t = threading.Thread(target=producer, daemon=True)
            t.start()
            until("the NOSPACE alarm", lambda: "NOSPACE" in _alarm_reasons(node), timeout_s=120)
            alarm_seen.set()
            status, body = _enqueue(node, "bulk")  # refused at once while the failed write is retried
            _assert_refusal(body, "NOSPACE")
            ballast.unlink()
            _resumes(node, "bulk")
            t.join(60)
            assert not t.is_alive() and not waited, waited  # the write that waited went through
            for body in refused:
                _assert_refusal(body, "NOSPACE")
            until("alarms cleared", lambda: _readyz(node)["alarms"] == [])
            total = _stats(node, "bulk")["total"]
            assert total >= len(ok) >= 10  # every acknowledged enqueue
            _canary_intact(node, canary)
            assert node.proc.pid == pid and node.proc.poll() is None
        # after a restart too: nothing acknowledged lost
        with running_node(data, extra_args=["--disk-free-limit", "0"]) as node:
            assert _stats(node, "bulk")["total"] == total
            _canary_intact(node, canary)


def test_one_full_member_stops_the_clusters_growth_until_its_space_is_freed(tmp_path: Path) -> None:
    """node-3's store is limited to 4 MiB, the others are not: once node-3 is full the
    leader refuses growth (whichever node is asked), the whole cluster still drains, and
    purging the queue (applied on node-3 too) resumes writes."""
    nodes = node_procs(tmp_path / "data", ["--disk-free-limit", "0"])
    nodes[2].extra_args += ["--max-data-size", "4MiB"]
    with running_cluster(nodes) as cluster:
        n1, n2, n3 = cluster
        canary = _canary(n1)
        assert call(n1, "POST", "/API/v1/queues", {"name": "bulk", "type": "delayed"})[0] == 201
        entry = n3 if leader(cluster) is not n3 else n2  # through a follower: forwarded
        taken = 0
        while True:
            n, refusal = _fill(entry, "bulk")
            taken += n
            # node-3 learns the last commit with the leader's next message (the commit index
            # rides the next append or heartbeat) and applies it in a write of its own. That
            # write, like the one that crossed the limit, may collect garbage (stale version
            # entries, compacted log): node-3 then clears its alarm and, once the leader hears
            # it, the cluster grows again. Its alarm is settled only once it has applied all
            # the leader committed; fill until node-3 itself stays full.
            _applied_up_to_leaders_commit(cluster, n3)
            until("node-3 full, or the leader taking writes again",
                  lambda: _alarm_reasons(n3) == ["DATA_SIZE_LIMIT"] or not _readyz(leader(cluster))["alarms"])
            if _alarm_reasons(n3) == ["DATA_SIZE_LIMIT"]:
                break
        assert taken > 50, taken
        assert refusal["reason"] in ("DATA_SIZE_LIMIT",), refusal
        assert "node-3" in refusal["detail"], refusal
        lead = leader(cluster)
        alarms = _readyz(lead)["alarms"]
        assert [(a["node_id"], a["reason"]) for a in alarms] == [("node-3", "DATA_SIZE_LIMIT")], alarms
        assert _alarm_reasons(n3) == ["DATA_SIZE_LIMIT"]
        status, view = call(lead, "GET", "/cluster")  # the leader's view names it too
        assert [(a["node_id"], a["reason"]) for a in view["alarms"]] == [("node-3", "DATA_SIZE_LIMIT")], view
        human = subprocess.run([sys.executable, "-m", "doq", "cluster", "status", "--server", lead.http_url],
                               capture_output=True, text=True, timeout=60, env={**os.environ}).stdout
        assert "ALARM node-3 DATA_SIZE_LIMIT: the store holds" in human, human
        own = subprocess.run([sys.executable, "-m", "doq", "cluster", "status", "--server", n3.http_url],
                             capture_output=True, text=True, timeout=60, env={**os.environ}).stdout
        assert re.search(r"^storage of node-3: \d+\.\d MiB of 4\.0 MiB used; disk \S+ \S+ free", own, re.M), own
        for n in cluster:
            status, body = _enqueue(n, "bulk")
            assert status == 507, body
        assert _stats(n1, "bulk")["total"] == taken
        _drain_works(n1, "bulk")
        _canary_intact(n2, canary)
        status, body = call(n2, "POST", "/API/v1/queues/bulk/purge")
        assert status == 200, body
        _resumes(n1, "bulk")
        until("node-3's alarm cleared", lambda: _alarm_reasons(n3) == [] and _alarm_reasons(lead) == [])
        for n in cluster:
            _canary_intact(n, canary)

