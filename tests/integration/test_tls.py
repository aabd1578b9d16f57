"""TLS against real processes (issue 18): a secure node serves HTTPS and gRPC over TLS
only, verified with the cluster CA it made on its first start; a secure cluster forms with
mutual TLS between members; a process without a certificate of the cluster CA can neither
join nor reach the raft port (forged messages change nothing); a node that binds a
non-loopback address runs secure unless `--insecure`, and a joiner there without the
cluster CA refuses to start. Real: `doq serve` processes on 127.0.0.1, real TLS. A secure
node requires client keys too: requests here carry the admin key its cluster's bootstrap
wrote (`admin_key`), the keys themselves are tests/auth's subject."""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from doq.tls.certs import generate_ca, install_ca, issue_node_cert
from doq_client import DoqClient
from tests.support.cluster import until
from tests.support.forge import PeerRefused, delete_queue_append, peer_context, send_frame
from tests.support.proc import NodeProc, refused_addr

pytestmark = pytest.mark.integration


def ca_file(node: NodeProc) -> Path:
    return node.data_dir / node.node_id / "tls" / "ca.crt"


def admin_key(node: NodeProc) -> str | None:
    """The admin key the cluster's bootstrap wrote in the data dir these tests share (None
    before it exists)."""
    path = node.data_dir / "admin.key"
    return path.read_text().strip() if path.exists() else None


def https(node: NodeProc, method: str, path: str, body: Any = None, ca: Path | None = None,
          key: str | None = None) -> tuple[int, Any]:
    """One request over HTTPS verified with `ca` (default: the node's CA), with `key`
    (default: the admin key)."""
    ctx = ssl.create_default_context(cafile=str(ca or ca_file(node)))
    headers = {"Content-Type": "application/json"}
    if key := key or admin_key(node):
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"https://127.0.0.1:{node.http_port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def remove_member(node: NodeProc, member: str, timeout_s: float = 60) -> tuple[int, Any]:
    """`DELETE /cluster/members/{member}` over HTTPS, again while it answers a retryable 503
    (a membership change still in progress, e.g. the promotion that follows a join, or no
    leader yet on a loaded machine); the last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = https(node, "DELETE", f"/cluster/members/{member}")
        if status != 503 or not (body or {}).get("retryable") or time.monotonic() > deadline:
            return status, body
        time.sleep(0.2)


def wait_https_ready(node: NodeProc, timeout_s: float = 60) -> None:
    def ready() -> bool:
        assert node.proc is not None and node.proc.poll() is None, node.log()
        try:
            return https(node, "GET", "/readyz")[0] == 200
        except OSError:
            return False
    until(f"{node.node_id} ready over HTTPS", ready, timeout_s)


def start_secure(node: NodeProc, timeout_s: float = 60) -> NodeProc:
    """Start `node` with --secure and wait until it is ready over HTTPS and the cluster's
    admin key works (a bootstrapping node writes admin.key before the key commits)."""
    node.extra_args = ["--secure", *node.extra_args]
    node.launch()
    wait_https_ready(node, timeout_s)

    def admin_key_works() -> bool:
        key = admin_key(node)
        return key is not None and https(node, "GET", "/API/v1/keys", key=key)[0] == 200
    until(f"{node.node_id}'s admin key accepted", admin_key_works, timeout_s)
    return node


def _refused_certificates(node: NodeProc) -> float:
    """The node's `doq_raft_streams_refused_total{reason="certificate"}`."""
    req = urllib.request.Request(f"https://127.0.0.1:{node.http_port}/metrics",
                                 headers={"Authorization": f"Bearer {admin_key(node)}"})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=str(ca_file(node)))) as r:
        text = r.read().decode()
    m = re.search(r'^doq_raft_streams_refused_total\{reason="certificate"\} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def digests(nodes: list[NodeProc]) -> set[str]:
    return {https(n, "GET", "/db/digest", ca=ca_file(nodes[0]))[1]["digest"] for n in nodes}


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    """node-1 bootstraps a secure cluster; node-2 and node-3 join with its CA copied into
    their tls/ directories and the admin key (`POST /cluster/join` is an admin action): the
    manual path; join tokens automate it."""
    data = tmp_path_factory.mktemp("tls") / "data"
    nodes = [NodeProc(data, node_id=f"node-{i}") for i in (1, 2, 3)]
    try:
        start_secure(nodes[0])
        for n in nodes[1:]:
            tls = data / n.node_id / "tls"
            tls.mkdir(parents=True)
            for name in ("ca.crt", "ca.key"):
                shutil.copy(ca_file(nodes[0]).with_name(name), tls / name)
            n.extra_args = ["--join", f"127.0.0.1:{nodes[0].http_port}"]
            n.env["DOQ_KEY"] = str(admin_key(nodes[0]))
            start_secure(n)
        want = ["node-1", "node-2", "node-3"]
        until("three voters", lambda: sorted(
            m["node_id"] for m in https(nodes[0], "GET", "/cluster")[1]["members"] if m["role"] == "voter") == want)
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


def test_a_secure_cluster_serves_https_and_grpc_tls_only(secure_cluster: list[NodeProc]) -> None:
    n1, n2, n3 = secure_cluster
    status, body = https(n2, "POST", "/API/v1/queues", {"name": "jobs"})  # a follower forwards over HTTPS
    assert status in (200, 201), body
    with DoqClient(n3.grpc_addr, ca_file=str(ca_file(n1)), key=admin_key(n1)) as c:  # forwarded over TLS
        c.enqueue("jobs", b"over tls")
    status, body = https(n1, "GET", "/API/v1/queues/jobs/messages?ack=true")
    assert status == 200 and body["content"] == "over tls", body

    with pytest.raises(OSError):  # plain HTTP is not spoken
        urllib.request.urlopen(f"http://127.0.0.1:{n1.http_port}/readyz", timeout=10)
    with pytest.raises(urllib.error.URLError):  # and HTTPS with another CA does not verify
        https(n1, "GET", "/readyz", ca=Path(_other_ca(n1.data_dir.parent)))
    with DoqClient(n1.grpc_addr, timeout_s=5, key=admin_key(n1)) as plain, pytest.raises(Exception):  # noqa: B017
        plain.enqueue("jobs", b"plain")


def _other_ca(where: Path) -> str:
    cert, _ = generate_ca("someone else")
    path = where / "other-ca.crt"
    path.write_bytes(cert)
    return str(path)


def test_the_cli_speaks_https_with_ca_file(secure_cluster: list[NodeProc]) -> None:
    n1 = secure_cluster[0]
    res = subprocess.run([sys.executable, "-m", "doq", "cluster", "status", "--json", "--server",
                          f"https://127.0.0.1:{n1.http_port}", "--ca-file", str(ca_file(n1))],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "DOQ_KEY": str(admin_key(n1))})
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["members"]) == 3
    res = subprocess.run([sys.executable, "-m", "doq", "cluster", "status", "--server",
                          f"https://127.0.0.1:{n1.http_port}"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "DOQ_KEY": str(admin_key(n1))})
    assert res.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in res.stderr + res.stdout


@pytest.mark.parametrize("who", ["no_tls", "no_client_certificate", "another_ca", "cluster_cert_of_another_node"])
def test_without_a_certificate_of_the_cluster_no_peer_message_gets_in(
        secure_cluster: list[NodeProc], who: str, tmp_path: Path) -> None:
    n1 = secure_cluster[0]
    before = digests(secure_cluster)
    cluster = https(n1, "GET", "/cluster")[1]
    leader_id = cluster["leader_id"]
    target = next(n for n in secure_cluster if n.node_id != leader_id)
    view = https(target, "GET", "/cluster")[1]
    ca_pem = ca_file(n1).read_bytes()
    ctx = None
    if who == "no_client_certificate":
        ctx = peer_context(ca_pem)
    elif who == "another_ca":
        other_cert, other_key = generate_ca()
        cert, key = issue_node_cert(other_cert, other_key, leader_id, ["127.0.0.1"])
        ctx = peer_context(ca_pem, cert, key)
    elif who == "cluster_cert_of_another_node":  # a real member's certificate, claiming to be the leader
        third = next(n for n in secure_cluster if n.node_id not in (leader_id, target.node_id))
        tls = third.data_dir / third.node_id / "tls"
        ctx = peer_context(ca_pem, (tls / "node.crt").read_bytes(), (tls / "node.key").read_bytes())
    forged = delete_queue_append(frm=leader_id, to=target.node_id, term=view["term"] + 1,
                                 index=view["commit_index"], queue="jobs")
    refused_before = _refused_certificates(target)
    with pytest.raises(PeerRefused):
        send_frame(f"127.0.0.1:{target.raft_port}", stream_from=leader_id, to=target.node_id, messages=[forged],
                   cluster_ids=[view["cluster_id"]], ssl_context=ctx)
    # a member's certificate passes TLS and is refused for its name; the others in the TLS handshake
    assert _refused_certificates(target) == refused_before + (who == "cluster_cert_of_another_node")
    assert digests(secure_cluster) == before
    assert https(target, "GET", "/cluster")[1]["term"] == view["term"]


def test_a_process_without_the_cluster_ca_cannot_join(secure_cluster: list[NodeProc], tmp_path: Path) -> None:
    n1 = secure_cluster[0]
    members = len(https(n1, "GET", "/cluster")[1]["members"])
    rogue = NodeProc(tmp_path / "rogue", node_id="rogue", extra_args=["--secure", "--join", f"127.0.0.1:{n1.http_port}"])
    rogue.log_path = tmp_path / "rogue.log"
    rogue.launch()
    assert rogue.proc is not None and rogue.proc.wait(60) != 0
    assert "no cluster CA" in rogue.log() and "--join-token" in rogue.log()

    # with a CA of its own: the cluster's HTTPS does not verify, so it never gets in
    other_cert, other_key = generate_ca()
    install_ca(tmp_path / "rogue2" / "rogue" / "tls", other_cert, other_key)
    rogue2 = NodeProc(tmp_path / "rogue2", node_id="rogue", extra_args=["--secure", "--join", f"127.0.0.1:{n1.http_port}"])
    rogue2.log_path = tmp_path / "rogue2.log"
    rogue2.launch()
    try:
        assert rogue2.proc is not None
        until("the rogue gives up or keeps failing", lambda: rogue2.proc.poll() is not None  # type: ignore[union-attr]
              or "CERTIFICATE_VERIFY_FAILED" in rogue2.log(), 90)
    finally:
        rogue2.kill9()
    assert len(https(n1, "GET", "/cluster")[1]["members"]) == members


def test_a_non_loopback_node_runs_secure_unless_insecure(tmp_path: Path) -> None:
    wide = NodeProc(tmp_path / "a")
    wide.log_path = tmp_path / "a.log"
    wide.extra_args = ["--http-addr", f"0.0.0.0:{wide.http_port}"]  # listens on every interface
    wide.launch()
    try:
        wait_https_ready(wide)
    finally:
        wide.kill9()

    plain = NodeProc(tmp_path / "b", extra_args=["--insecure"])
    plain.log_path = tmp_path / "b.log"
    plain.extra_args += ["--http-addr", f"0.0.0.0:{plain.http_port}"]
    plain.start()
    plain.kill9()

    joiner = NodeProc(tmp_path / "c", node_id="node-2",
                      extra_args=["--advertise-host", "doq-1.example", "--join", f"127.0.0.1:{plain.http_port}"])
    joiner.log_path = tmp_path / "c.log"
    joiner.launch()
    assert joiner.proc is not None and joiner.proc.wait(60) != 0
    text = joiner.log()
    assert "runs secure" in text and "doq-1.example" in text and "--insecure" in text


def test_a_secure_node_waiting_to_join_answers_over_https_only(tmp_path: Path) -> None:
    """While an empty store waits for its cluster (`doq.service.startup_http`: identity,
    /livez, /readyz not ready), a secure node already speaks HTTPS only."""
    cert, key = generate_ca()
    n = NodeProc(tmp_path / "data", node_id="node-2")
    install_ca(tmp_path / "data" / "node-2" / "tls", cert, key)
    nobody = ExitStack()
    n.extra_args = ["--secure", "--join", nobody.enter_context(refused_addr())]  # nobody answers there: it waits
    n.launch()
    try:
        status, body = until("the identity over HTTPS", lambda: https(n, "GET", "/cluster/identity"), 60)
        assert status == 200 and body["node_id"] == "node-2" and body["empty"] is True
        assert https(n, "GET", "/readyz")[0] == 503
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{n.http_port}/cluster/identity", timeout=10)
    finally:
        n.kill9()
        nobody.close()
