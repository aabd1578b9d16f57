"""End to end: a real `doq serve` under a workload (enqueues, dequeues, acks, priority
changes, deletes, dead-lettering, queue deletion) backed up with `doq backup --dir`; the
Spark job verifies the chain, proves it equal to the node's state now (`--against`: its
`GET /db/digest` and its queue counts) and to an offline restore of the chain, and fails
against a node whose state differs (another cluster; a node restored from a shorter chain)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from doq.backup.chain_dir import chain_files
from doq.backup.ops import restore_offline
from doq.backup.verify import verify
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore
from tests.support.proc import NodeProc, running_node

pytestmark = [pytest.mark.spark, pytest.mark.integration]
Q = "/API/v1/queues"


def call(node: NodeProc, method: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def doq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True, timeout=120)


def backup_dir(node: NodeProc, d: Path) -> dict[str, Any]:
    r = doq("backup", "--server", node.http_url, "--dir", str(d), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def enqueue(node: NodeProc, queue: str, n: int, **extra: Any) -> list[str]:
    msgs = [{"content": f"{queue}-{i}", "group": f"g{i % 3}", "priority": i % 7, **extra} for i in range(n)]
    return [r["id"] for r in call(node, "POST", f"{Q}/{queue}/messages:batch", {"messages": msgs})["results"]]


def workload_until_first_backup(node: NodeProc) -> None:
    call(node, "POST", Q, {"name": "dlq", "type": "delayed"})
    call(node, "POST", Q, {"name": "jobs", "type": "delayed",
                           "settings": {"max_attempts": 1, "dead_letter_queue": "dlq",
                                        # leases outlive the test even on a loaded machine:
                                        # only the nacks below dead-letter
                                        "visibility_timeout_ms": 3_600_000}})
    # the fair queue's leases (dequeued before the third backup) outlive the test too: the
    # node's counts and the chain's must not differ by leases that ended meanwhile
    call(node, "POST", Q, {"name": "fair", "type": "fair", "settings": {"visibility_timeout_ms": 3_600_000}})
    call(node, "POST", Q, {"name": "tmp", "type": "delayed"})
    enqueue(node, "jobs", 300)
    enqueue(node, "fair", 120)
    enqueue(node, "tmp", 20)


def workload_until_second_backup(node: NodeProc) -> None:
    got = call(node, "POST", f"{Q}/jobs/messages:dequeue", {"max_messages": 60})["messages"]
    assert len(got) == 60
    acked = [m["id"] for m in got[:25]]
    leases = [m["lease_id"] for m in got[:25]]
    res = call(node, "POST", f"{Q}/jobs/messages:ack", {"ids": acked, "lease_ids": leases})["results"]
    assert all(r["success"] for r in res)
    for m in got[25:35]:  # max_attempts 1: a nack dead-letters into dlq
        call(node, "POST", f"{Q}/jobs/messages/{m['id']}/nack", {"lease_id": m["lease_id"]})
    ready = call(node, "POST", f"{Q}/jobs/messages:dequeue", {"max_messages": 10, "ack": True})["messages"]
    assert len(ready) == 10  # dequeued with ack: removed
    ids = enqueue(node, "jobs", 40)
    for i in ids[:8]:
        call(node, "PUT", f"{Q}/jobs/messages/{i}/priority", {"priority": 99})
    for i in ids[8:14]:
        call(node, "DELETE", f"{Q}/jobs/messages/{i}")
    enqueue(node, "jobs", 15, delay_ms=3_600_000)  # delayed by an hour
    # a redrive (doq.queues.redrive): its task record travels in the chain
    call(node, "POST", Q, {"name": "parked", "type": "delayed"})
    enqueue(node, "parked", 6)
    task = call(node, "POST", f"{Q}/parked/redrive", {"to": "fair"})
    assert task["total"] == 6


def workload_until_third_backup(node: NodeProc) -> None:
    call(node, "DELETE", f"{Q}/tmp")
    enqueue(node, "parked", 2)
    call(node, "POST", f"{Q}/parked/redrive", {"to": "jobs"})  # no rate limit: done in its own entry
    assert call(node, "GET", f"{Q}/parked/redrive")["state"] == "completed"
    fair = call(node, "POST", f"{Q}/fair/messages:dequeue", {"max_messages": 30})["messages"]
    call(node, "POST", f"{Q}/fair/messages:ack", {"ids": [m["id"] for m in fair[:20]],
                                                  "lease_ids": [m["lease_id"] for m in fair[:20]]})
    for i in range(5):
        call(node, "POST", f"{Q}/fair/messages", {"content": f"d{i}", "dedup_id": f"dedup-{i}"})


@dataclass
class Served:
    node: NodeProc
    chain: Path
    backups: list[dict[str, Any]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("e2e")
    with running_node(tmp / "node") as node:
        chain = tmp / "chain"
        backups = []
        for step in (workload_until_first_backup, workload_until_second_backup, workload_until_third_backup):
            step(node)
            backups.append(backup_dir(node, chain))
        yield Served(node, chain, backups)


def test_backup_dir_writes_the_next_file_of_the_chain(served: Served) -> None:
    names = [p.name for p in chain_files(served.chain)]
    lasts = [b["last_version"] for b in served.backups]
    assert names == ["000000-full.bak", f"000001-since-{lasts[0] + 1}.bak", f"000002-since-{lasts[1] + 1}.bak"]
    assert [b["since"] for b in served.backups] == [0, lasts[0] + 1, lasts[1] + 1]
    r = doq("backup", "--server", served.node.http_url, "--dir", str(served.chain), "--since", "3")
    assert r.returncode == 2 and "--dir" in r.stderr


def test_the_chain_of_a_live_node_verifies_against_it(spark: Any, served: Served, tmp_path: Path) -> None:
    node = served.node
    paths = chain_files(served.chain)
    live = call(node, "GET", "/db/digest")
    r = verify(paths, spark=spark, against=node.http_url)
    assert r.ok, [f.line() for f in r.failures]
    doc = r.to_dict()
    # the fresh incremental's recorded digest is the node's, and the chain rebuilds it
    assert doc["against"]["node_digest"] == doc["state"]["digest"] == live["digest"]
    assert doc["state"]["to_version"] == live["applied_index"] and r.files[-1].against
    assert all(f["digest_ok"] for f in doc["files"])
    # per-queue counts of the rebuilt state are the node's
    for q in call(node, "GET", Q)["queues"]:
        got = doc["state"]["queues"][q["name"]]
        want = q["stats"]
        assert (got["ready"], got["delayed"], got["in_flight"], got["dead"]) == (
            want["ready"], want["delayed"], want["in_flight"], want["dead"]), q["name"]
    assert "tmp" not in doc["state"]["queues"] and doc["state"]["queues"]["jobs"]["dead"] == 10
    assert doc["state"]["queues"]["dlq"]["ready"] == 10 and doc["state"]["queues"]["fair"]["dedup"] == 5
    # and an offline restore of the chain holds the same state
    restore_offline(tmp_path / "data", "n1", paths[0], paths[1:])
    env = open_env(node_dir(tmp_path / "data", "n1") / "doq.lmdb")
    try:
        restored = StateStore(env)
        assert restored.state_digest()[1] == r.digest
        task = restored.view.redrives["parked"]
        assert (task.to, task.state, task.moved, task.total) == ("jobs", "completed", 2, 2)
    finally:
        env.close()


def test_against_another_cluster_fails(spark: Any, served: Served, tmp_path: Path) -> None:
    """Another node (its own cluster), versions beyond the chain's: named by cluster id."""
    with running_node(tmp_path / "other") as other:
        call(other, "POST", Q, {"name": "jobs", "type": "delayed"})
        for _ in range(80):  # versions beyond the chain's, so the version checks alone do not catch it
            enqueue(other, "jobs", 3)
        live = call(other, "GET", "/db/digest")
        assert live["applied_index"] > served.backups[-1]["last_version"]
        r = verify(chain_files(served.chain), spark=spark, against=other.http_url)
    assert not r.ok
    f = next(f for f in r.failures if f.reason == "AGAINST_CLUSTER_MISMATCH")
    assert live["cluster_id"] in f.message and r.to_dict()["cluster_id"] in f.message


def test_against_a_node_restored_from_a_shorter_chain_fails(spark: Any, served: Served, tmp_path: Path) -> None:
    paths = chain_files(served.chain)
    r = doq("restore", "-f", str(paths[0]), "-i", str(paths[1]), "--data-dir", str(tmp_path / "short"))
    assert r.returncode == 0, r.stderr
    with running_node(tmp_path / "short") as short:
        rep = verify(paths, spark=spark, against=short.http_url)
    assert not rep.ok
    behind = next(f for f in rep.failures if f.reason == "AGAINST")
    assert "behind the chain" in behind.message
    assert ("DIGEST_MISMATCH", rep.files[-1].name) in {(f.reason, f.file) for f in rep.failures}
