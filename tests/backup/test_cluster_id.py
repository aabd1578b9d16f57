"""The cluster id: created once when a cluster is bootstrapped, kept across restarts, the
same on every member (joiners get it with the leader's snapshot), recorded in every backup;
`check_chain`, `doq verify` (also `--against`) and restores refuse another cluster's files
by name, a restore into an empty node adopts the backup's cluster, and files written
before cluster ids (none recorded) still verify.

Real parts: LMDB files, `doq serve` processes (two single-node clusters A and B, and a
three-node cluster), `doq backup/restore/verify` and PySpark in local mode."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from doq import cli
from doq.backup.chain_dir import chain_files
from doq.backup.format import BackupHeader, BackupReader, BackupWriter, read_header
from doq.backup.ops import chain_problems, check_chain
from doq.backup.verify import verify
from doq.errors import InvalidArgument
from doq.node.cluster import MemberAddrs
from doq.node.raft_snapshot import (
    encode_snapshot_data,
    install_snapshot_data,
    write_state_snapshot,
)
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore
from tests.support.cluster import (
    cluster_view,
    http_call,
    node_files,
    node_procs,
    running_cluster,
    until,
    voters,
)
from tests.support.proc import NodeProc, running_node

Q = "/API/v1/queues"


# -- the store (real LMDB, no process) ------------------------------------------------------
def _store(path: Path) -> StateStore:
    return StateStore(open_env(path, map_size=64 * 1024**2))


def _apply(st: StateStore, *cmds: c.Command) -> None:
    with st.write() as txn:
        st.apply_entries(txn, [(st.applied_index + 1, encode_batch(c.CommandBatch(1_700_000_000_000, list(cmds))))])


def test_a_state_gets_its_cluster_id_once_and_keeps_it(tmp_path: Path) -> None:
    st = _store(tmp_path / "a")
    assert st.cluster_id == ""
    digest = st.state_digest()
    cid = st.ensure_cluster_id()
    assert uuid.UUID(cid) and st.ensure_cluster_id() == cid == st.cluster_id
    assert st.is_empty() and st.state_digest() == digest  # not a record: not in the digest
    st.env.close()
    again = _store(tmp_path / "a")
    assert again.cluster_id == cid  # durable
    assert again.ensure_cluster_id(lambda: "never-used") == cid
    again.env.close()


def test_a_bad_cluster_id_is_refused_and_a_restore_changes_nothing(tmp_path: Path) -> None:
    st = _store(tmp_path / "a")
    own = st.ensure_cluster_id()
    with pytest.raises(InvalidArgument) as e:
        st.restore([(b"G", b"x", 1)], 1, cluster_id="x" * 129)
    assert e.value.reason == "INVALID_CLUSTER_ID"
    assert st.is_empty() and st.cluster_id == own
    st.env.close()
    again = _store(tmp_path / "a")
    assert again.cluster_id == own
    again.env.close()


def test_a_raft_snapshot_carries_the_cluster_id(tmp_path: Path) -> None:
    """What a joining node installs: the leader's state AND its cluster id; the replicas'
    states are then byte-identical. A snapshot written before cluster ids (no state part)
    still installs, with none."""
    leader, joiner = _store(tmp_path / "leader"), _store(tmp_path / "joiner")
    cid = leader.ensure_cluster_id()
    _apply(leader, c.CreateQueue("jobs", "delayed", QueueSettings()))
    _apply(leader, c.Enqueue("jobs", [c.EnqueueItem(b"m%d" % i) for i in range(10)]))
    members = {"n1": MemberAddrs("a:1", "a:2", "a:3")}
    read = leader.open_read()
    data = write_state_snapshot(read, members, "n1")
    with joiner.write() as txn:
        assert install_snapshot_data(joiner, txn, data, read.applied_index) == members
    assert joiner.cluster_id == cid and joiner.dump_state_bytes() == leader.dump_state_bytes()
    old = _store(tmp_path / "old")
    with old.write() as txn:
        install_snapshot_data(old, txn, encode_snapshot_data(members, {}, b""), 1)
    assert old.cluster_id == "" and old.applied_index == 1


def _h(cluster: str, since: int, to: int) -> BackupHeader:
    return BackupHeader(cluster, "n", since, to, 0)


def test_chain_rule_same_cluster_names_both_files_and_ids() -> None:
    names = ["full.bak", "inc1.bak", "inc2.bak"]
    # files that record no cluster id (written before cluster ids) are not checked
    assert chain_problems([_h("", 0, 10), _h("a", 11, 20), _h("", 21, 30)], names=names) == []
    problems = chain_problems([_h("", 0, 10), _h("a", 11, 20), _h("b", 21, 30)], names=names)
    assert [(i, e.reason) for i, e in problems] == [(2, "BACKUP_CLUSTER_MISMATCH")]
    msg = problems[0][1].message
    assert all(x in msg for x in ("inc2.bak", "'b'", "inc1.bak", "'a'")), msg
    with pytest.raises(InvalidArgument, match="full.bak") as e:
        check_chain([_h("a", 0, 10), _h("", 11, 20), _h("b", 21, 30)], names=names)
    assert e.value.reason == "BACKUP_CLUSTER_MISMATCH"


# -- two single-node clusters A and B (real `doq serve`) -----------------------------------
def call(node: NodeProc, method: str, path: str, body: object | None = None) -> Any:
    status, doc = http_call(node.http_url, method, path, body)
    assert status < 300, (status, doc)
    return doc


def doq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doq", *args], capture_output=True, text=True, timeout=120)


def backup_dir(node: NodeProc, d: Path) -> None:
    r = doq("backup", "--server", node.http_url, "--dir", str(d))
    assert r.returncode == 0, r.stderr


def workload(node: NodeProc, queue: str, n: int) -> None:
    """`n` messages into `queue` (created if missing)."""
    if queue not in {q["name"] for q in call(node, "GET", Q)["queues"]}:
        call(node, "POST", Q, {"name": queue, "type": "delayed"})
    msgs = [{"content": f"{queue}-{i}", "priority": i % 5} for i in range(n)]
    call(node, "POST", f"{Q}/{queue}/messages:batch", {"messages": msgs})


def cluster_id(node: NodeProc) -> str:
    return str(cluster_view(node.http_url)["cluster_id"])


@dataclass
class Clusters:
    a: NodeProc
    b: NodeProc
    a_chain: list[Path]  # full, incremental
    b_chain: list[Path]
    a_id: str
    b_id: str


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    tmp = tmp_path_factory.mktemp("clusters")
    with running_node(tmp / "a") as a, running_node(tmp / "b") as b:
        for node, name in ((a, "a"), (b, "b")):
            workload(node, "jobs", 50)
            backup_dir(node, tmp / f"{name}-chain")
            workload(node, "jobs", 30)
            backup_dir(node, tmp / f"{name}-chain")
        yield Clusters(a, b, chain_files(tmp / "a-chain"), chain_files(tmp / "b-chain"), cluster_id(a), cluster_id(b))


def _header(p: Path) -> BackupHeader:
    with open(p, "rb") as f:
        return read_header(f)


@pytest.mark.integration
def test_each_node_shows_its_cluster_id_and_records_it_in_its_backups(clusters: Clusters) -> None:
    for node, cid, files in ((clusters.a, clusters.a_id, clusters.a_chain),
                             (clusters.b, clusters.b_id, clusters.b_chain)):
        assert uuid.UUID(cid)
        assert call(node, "GET", "/db/digest")["cluster_id"] == cid
        assert [_header(p).cluster_id for p in files] == [cid, cid]
    assert clusters.a_id != clusters.b_id


@pytest.mark.integration
def test_check_chain_refuses_a_mixed_chain_by_name(clusters: Clusters) -> None:
    mixed = [clusters.a_chain[0], clusters.b_chain[1]]
    with pytest.raises(InvalidArgument) as e:
        check_chain([_header(p) for p in mixed], names=[str(p) for p in mixed])
    assert e.value.reason == "BACKUP_CLUSTER_MISMATCH"
    assert all(x in e.value.message for x in (str(mixed[0]), str(mixed[1]), clusters.a_id, clusters.b_id))


@pytest.mark.spark
@pytest.mark.integration
def test_doq_verify_refuses_a_mixed_chain(spark: Any, clusters: Clusters, tmp_path: Path) -> None:
    mixed = [clusters.a_chain[0], clusters.b_chain[1]]
    report = tmp_path / "report.json"
    assert cli.main(["verify", *map(str, mixed), "--report", str(report), "--quiet"]) == 1
    doc = json.loads(report.read_text())
    f = next(f for f in doc["failures"] if f["reason"] == "BACKUP_CLUSTER_MISMATCH")
    assert f["file"] == str(mixed[1])
    assert all(x in f["message"] for x in (str(mixed[0]), clusters.a_id, clusters.b_id))
    assert doc["cluster_id"] == clusters.a_id and not doc["verified"]
    assert [x["cluster_id"] for x in doc["files"]] == [clusters.a_id, clusters.b_id]


@pytest.mark.integration
def test_doq_restore_refuses_a_mixed_chain_offline_and_online(clusters: Clusters, tmp_path: Path) -> None:
    full, inc = clusters.a_chain[0], clusters.b_chain[1]
    r = doq("restore", "-f", str(full), "-i", str(inc), "--data-dir", str(tmp_path / "data"))
    assert r.returncode != 0 and all(x in r.stderr for x in (str(full), str(inc), clusters.a_id, clusters.b_id))
    assert not node_dir(tmp_path / "data", "node-1").exists()  # nothing written
    with running_node(tmp_path / "fresh") as fresh:
        before = call(fresh, "GET", "/db/digest")
        r = doq("restore", "--server", fresh.http_url, "-f", str(full), "-i", str(inc))
        assert r.returncode != 0 and "BACKUP_CLUSTER_MISMATCH" in r.stderr, r.stderr
        assert all(x in r.stderr for x in (full.name, clusters.a_id, clusters.b_id)), r.stderr
        assert call(fresh, "GET", "/db/digest") == before  # still empty, still its own cluster
        assert before["cluster_id"] not in (clusters.a_id, clusters.b_id)


@pytest.mark.integration
def test_restoring_onto_a_node_of_another_cluster_is_refused(clusters: Clusters) -> None:
    """B holds data: A's incremental (and A's whole chain) cannot continue B's history."""
    b = clusters.b
    before = call(b, "GET", "/db/digest")
    for files in ([clusters.a_chain[1]], clusters.a_chain):
        args = ["-f", str(files[0]), *(x for p in files[1:] for x in ("-i", str(p)))]
        r = doq("restore", "--server", b.http_url, *args)
        assert r.returncode != 0 and "RESTORE_CLUSTER_MISMATCH" in r.stderr, r.stderr
        assert clusters.a_id in r.stderr and clusters.b_id in r.stderr and files[0].name in r.stderr
        assert call(b, "GET", "/db/digest") == before


@pytest.mark.spark
@pytest.mark.integration
def test_against_the_other_cluster_fails_by_cluster_id(spark: Any, clusters: Clusters) -> None:
    r = verify(clusters.a_chain, spark=spark, against=clusters.b.http_url)
    assert not r.ok
    f = next(f for f in r.failures if f.reason == "AGAINST_CLUSTER_MISMATCH")
    assert f.file == str(clusters.a_chain[0])
    assert all(x in f.message for x in (clusters.a_id, clusters.b_id, clusters.b.http_url))
    assert r.against is not None and r.against["cluster_id"] == clusters.b_id
    assert len(r.files) == 2  # nothing taken from the other cluster
    assert verify(clusters.a_chain, spark=spark, against=clusters.a.http_url).ok  # its own: verified


def _anonymous(src: Path, dst: Path) -> Path:
    """`src` rewritten as doq wrote files before cluster ids: no cluster id in the header."""
    with open(src, "rb") as f:
        r = BackupReader(f)
        h, s = r.header, r.summary
        with open(dst, "wb") as out:
            w = BackupWriter(out, from_version=h.from_version, to_version=h.to_version, node_id=h.node_id,
                             created_at_ms=h.created_at_ms, state_digest=s.state_digest)
            w.add_many(r.records())
            w.close()
    assert _header(dst).cluster_id == ""
    return dst


@pytest.mark.spark
@pytest.mark.integration
def test_files_without_a_cluster_id_still_verify(spark: Any, clusters: Clusters, tmp_path: Path) -> None:
    """Old files: no cluster rule, the digest still proves them (also against the node)."""
    full, inc = clusters.a_chain
    old = [_anonymous(full, tmp_path / "full.bak"), _anonymous(inc, tmp_path / "inc.bak")]
    for chain in (old, [full, old[1]], [old[0], inc]):
        r = verify(chain, spark=spark)
        assert r.ok, [f.line() for f in r.failures]
    r = verify(old, spark=spark, against=clusters.a.http_url)
    assert r.ok, [f.line() for f in r.failures]
    # without ids, another cluster's file is still caught, by the digest
    r = verify([old[0], _anonymous(clusters.b_chain[1], tmp_path / "b-inc.bak")], spark=spark)
    assert not r.ok and "BACKUP_CLUSTER_MISMATCH" not in {f.reason for f in r.failures}


@pytest.mark.spark
@pytest.mark.integration
def test_a_restored_node_continues_the_backed_up_cluster(spark: Any, clusters: Clusters, tmp_path: Path) -> None:
    """Offline and online restores into empty nodes adopt the chain's cluster id, so the
    chain then verifies against them (same cluster, same state)."""
    full, inc = clusters.a_chain
    r = doq("restore", "-f", str(full), "-i", str(inc), "--data-dir", str(tmp_path / "offline"))
    assert r.returncode == 0, r.stderr
    with running_node(tmp_path / "offline") as offline:
        assert cluster_id(offline) == clusters.a_id
        assert call(offline, "GET", "/db/digest")["cluster_id"] == clusters.a_id
        rep = verify(clusters.a_chain, spark=spark, against=offline.http_url)
        assert rep.ok, [f.line() for f in rep.failures]
    with running_node(tmp_path / "online") as online:
        own = cluster_id(online)
        assert own != clusters.a_id
        r = doq("restore", "--server", online.http_url, "-f", str(full), "-i", str(inc))
        assert r.returncode == 0, r.stderr
        assert cluster_id(online) == clusters.a_id
        workload(online, "jobs", 5)  # its next backups are A's and continue A's chain
        backup_dir(online, tmp_path / "online-chain")
        assert _header(chain_files(tmp_path / "online-chain")[0]).cluster_id == clusters.a_id


# -- restarts and a three-node cluster --------------------------------------------------------
@pytest.mark.integration
def test_the_cluster_id_survives_restarts(tmp_path: Path) -> None:
    node = NodeProc(tmp_path / "n").start()
    try:
        cid = cluster_id(node)
        node.kill9()  # a crash
        node.start()
        assert cluster_id(node) == cid
        assert node.terminate() == 0  # a clean stop
        node.start()
        assert cluster_id(node) == cid
    finally:
        node.kill9()


@pytest.mark.integration
def test_every_member_of_a_three_node_cluster_has_the_bootstrap_nodes_id(tmp_path: Path) -> None:
    """node-2 joins at once (it gets the bootstrap snapshot); node-3 joins after the log was
    compacted (it gets a later snapshot of the leader's): all three show node-1's id, also
    after node-3 restarts, and their backups record it."""
    nodes = node_procs(tmp_path, ["--snapshot-every", "20", "--keep-entries", "5"])
    with running_cluster(nodes[:2]) as (n1, n2):
        cid = cluster_id(n1)
        for i in range(40):  # more than snapshot-every entries: the log is compacted
            call(n1, "POST", Q, {"name": f"q{i}", "type": "delayed"})
        n3 = nodes[2]
        n3.extra_args = [*n3.extra_args, "--join", f"127.0.0.1:{n1.http_port}"]
        try:
            n3.start(timeout_s=90)
            until("3 voters", lambda: voters(n1.http_url) == ["node-1", "node-2", "node-3"], 90)
            assert [cluster_id(n) for n in (n1, n2, n3)] == [cid] * 3 and uuid.UUID(cid)
            n3.kill9()
            with node_files(n3) as (st, _):  # its own files hold the id
                assert st.cluster_id == cid
            n3.start(timeout_s=90)
            assert cluster_id(n3) == cid
            assert [call(n, "GET", "/db/digest")["cluster_id"] for n in (n1, n2, n3)] == [cid] * 3
            backup_dir(n3, tmp_path / "chain")  # a follower's backup too
            assert _header(chain_files(tmp_path / "chain")[0]).cluster_id == cid
        finally:
            n3.kill9()
