"""Certificate renewal and a rolling CA rotation against real processes (issue 18): three
`doq serve --secure` nodes on 127.0.0.1 (node-1 bootstrapped the cluster and holds the CA
key; node-2 and node-3 enrolled with join tokens and hold none), real TLS handshakes, the
real `doq tls` CLI.

- `doq tls renew` gives a node a new key and certificate (an enrolled node's is signed by
  node-1, which holds the CA key, whoever leads) that its HTTPS port, gRPC port and Raft port serve at the next handshake,
  same process, no restart.
- `doq tls ca-rotate begin | reissue | finish` moves the cluster from CA1 to CA2 while a
  client keeps enqueuing and consuming: no acknowledged message is lost, every failed call
  is a retryable one, the members' state digests stay equal; afterwards a connection
  presenting a CA1 certificate (a real member's, saved before the rotation) is refused in
  the TLS handshake, which it passed before `finish`, and the CA keys never left node-1.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from doq.tls.certs import fingerprint, generate_ca, issue_node_cert, make_csr
from doq_client import DoqClient
from doq_client.errors import DoqClientError
from tests.integration.test_join_token import create_token, joiner
from tests.integration.test_tls import admin_key, ca_file, https, start_secure, wait_https_ready
from tests.support.cluster import until
from tests.support.forge import PeerRefused, peer_context, send_frame
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    data = tmp_path_factory.mktemp("rotation") / "data"
    n1 = NodeProc(data, node_id="node-1")
    nodes = [n1]
    try:
        start_secure(n1)
        for node_id in ("node-2", "node-3"):
            n = joiner(n1, node_id, create_token(n1))
            nodes.append(n)
            n.launch()
            wait_https_ready(n, 90)
        until("three voters", lambda: sorted(
            m["node_id"] for m in https(n1, "GET", "/cluster")[1]["members"] if m["role"] == "voter")
            == ["node-1", "node-2", "node-3"], 120)
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


def tls_dir(n: NodeProc) -> Path:
    return n.data_dir / n.node_id / "tls"


def doq_tls(n: NodeProc, ca: Path, *args: str) -> Any:
    """`doq tls ARGS --json` against `n`, verified with `ca`; the parsed answer."""
    res = subprocess.run([sys.executable, "-m", "doq", "tls", *args, "--json", "--server",
                          f"https://127.0.0.1:{n.http_port}", "--ca-file", str(ca)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DOQ_KEY": str(admin_key(n))})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def served_serial(port: int, ca: Path, client_pair: tuple[Path, Path] | None = None) -> int:
    """The serial of the certificate served on 127.0.0.1:`port` in a new TLS handshake
    verified with `ca` (with `client_pair`: presenting that certificate, as a peer)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    if client_pair:
        ctx.load_cert_chain(*client_pair)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_a_renewed_certificate_is_served_without_a_restart(cluster: list[NodeProc], tmp_path: Path) -> None:
    n1, n2, _ = cluster
    ca = tmp_path / "ca.crt"
    shutil.copy(ca_file(n1), ca)
    peer = (tls_dir(n1) / "node.crt", tls_dir(n1) / "node.key")
    pid = n2.proc.pid if n2.proc else None
    old = file_serial(tls_dir(n2) / "node.crt")
    old_key = (tls_dir(n2) / "node.key").read_bytes()
    assert {served_serial(p, ca, c) for p, c in ((n2.http_port, None), (n2.grpc_port, None),
                                                  (n2.raft_port, peer))} == {old}

    out = doq_tls(n1, ca, "renew", "--node", "node-2")

    new = file_serial(tls_dir(n2) / "node.crt")
    assert new != old and format(new, "x") == out["nodes"][0]["node_cert"]["serial"]
    assert (tls_dir(n2) / "node.key").read_bytes() != old_key  # a new key, made on node-2
    assert not (tls_dir(n2) / "ca.key").exists()  # signed by node-1, the CA holder: no CA key came to node-2
    # every port serves it at the next handshake, from the same process
    assert served_serial(n2.http_port, ca) == new
    assert served_serial(n2.grpc_port, ca) == new
    assert served_serial(n2.raft_port, ca, peer) == new
    assert n2.proc is not None and n2.proc.poll() is None and n2.proc.pid == pid
    status, body = https(n2, "POST", "/API/v1/queues", {"name": "after-renew"}, ca=ca)  # forwarded over TLS
    assert status in (200, 201), body


def test_a_removed_or_unknown_node_gets_no_certificate(cluster: list[NodeProc]) -> None:
    n1, n2, _ = cluster
    csr, _ = make_csr("node-9", [])
    status, body = https(n1, "POST", "/cluster/tls/sign", {"node_id": "node-9", "csr": csr.decode()})
    assert (status, body["reason"]) == (404, "NOT_MEMBER"), body
    status, body = https(n1, "POST", "/cluster/tls/sign", {"node_id": "node-2", "csr": csr.decode()},
                         key="doq_000000000000_" + "x" * 43)
    assert status == 401, body
    status, body = https(n2, "POST", "/cluster/tls/sign", {"node_id": "node-3", "csr": csr.decode()})
    assert (status, body["reason"]) == (409, "NO_CA_KEY"), body  # an enrolled member holds no CA key


class Workload:
    """A client that enqueues (with a dedup id, so a retried enqueue stores one message)
    and consumes (lease, then ack) in a loop, opening a new client (new TLS handshakes)
    every few calls with the CA file as it is then, and after any failure."""

    def __init__(self, nodes: list[NodeProc], ca: Path, key: str) -> None:
        self.targets = [n.grpc_addr for n in nodes]
        self.ca, self.key = ca, key
        self.enqueued: set[str] = set()  # acknowledged by the cluster
        self.consumed: set[str] = set()
        self.errors: list[DoqClientError] = []
        self.calls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.unexpected: list[BaseException] = []

    def client(self) -> DoqClient:
        return DoqClient(self.targets, ca_file=str(self.ca), key=self.key, timeout_s=30)

    def run(self) -> None:
        c = self.client()
        i = 0
        try:
            while not self.stop.is_set():
                try:
                    self.step(c, i)
                    i += 1
                except DoqClientError as e:
                    self.errors.append(e)
                    c.close()
                    c = self.client()
                self.calls += 1
                if self.calls % 10 == 0:
                    c.close()
                    c = self.client()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.unexpected.append(e)
        finally:
            c.close()

    def step(self, c: DoqClient, i: int) -> None:
        content = f"m{i}"
        if content not in self.enqueued:
            c.enqueue("rot", content.encode(), dedup_id=content)
            self.enqueued.add(content)
        self.drain(c, wait_ms=0)

    def drain(self, c: DoqClient, wait_ms: int) -> int:
        got = c.dequeue("rot", max_messages=8, wait_ms=wait_ms, visibility_timeout_ms=30_000)
        for m in got:
            self.consumed.add(bytes(m.content).decode())  # delivered (an ack that fails: delivered again)
            c.ack("rot", m.id, lease_id=m.lease_id)
        return len(got)


def test_the_cluster_ca_rotates_in_rolling_steps_while_a_client_works(
        cluster: list[NodeProc], tmp_path: Path) -> None:
    n1, n2, n3 = cluster
    ca1 = tmp_path / "ca1.crt"
    shutil.copy(ca_file(n1), ca1)
    ca1_fp = fingerprint(ca1.read_bytes())
    client_ca = tmp_path / "client-ca.crt"  # the clients' --ca-file, replaced as the operator would
    shutil.copy(ca1, client_ca)
    old_pair = tmp_path / "old-node-2.crt", tmp_path / "old-node-2.key"  # a real CA1 member certificate
    shutil.copy(tls_dir(n2) / "node.crt", old_pair[0])
    shutil.copy(tls_dir(n2) / "node.key", old_pair[1])
    with DoqClient(n1.grpc_addr, ca_file=str(ca1), key=admin_key(n1)) as c:
        c.create_queue("rot")
    work = Workload(cluster, client_ca, str(admin_key(n1)))
    work.thread.start()

    def progress() -> None:  # the client keeps succeeding, with new handshakes, after each step
        want = len(work.enqueued) + 20
        until(f"{want} messages enqueued", lambda: len(work.enqueued) >= want or bool(work.unexpected), 120)
        assert not work.unexpected, work.unexpected

    progress()
    bundle = tmp_path / "bundle.crt"
    doq_tls(n1, ca1, "ca-rotate", "begin", "--out", str(bundle))
    cas = x509.load_pem_x509_certificates(bundle.read_bytes())
    assert len(cas) == 2 and fingerprint(bundle.read_bytes()) == ca1_fp  # old first, still signing
    ca2_fp = fingerprint(cas[1].public_bytes(serialization_pem()))
    for n in cluster:
        assert https(n, "GET", "/cluster/tls", ca=ca1)[1]["trusted_cas"][1]["fingerprint"] == ca2_fp
    shutil.copy(bundle, client_ca.with_suffix(".tmp"))
    client_ca.with_suffix(".tmp").replace(client_ca)
    progress()

    doq_tls(n1, bundle, "ca-rotate", "reissue")
    for n in cluster:
        st = https(n, "GET", "/cluster/tls", ca=bundle)[1]
        assert st["node_cert"]["issuer"] == ca2_fp, st
    progress()
    # until finish, the old CA is still trusted: a CA1 member certificate passes the handshake
    send_frame(f"127.0.0.1:{n3.raft_port}", stream_from="node-2", to="node-3", messages=[],
               ssl_context=peer_context(bundle.read_bytes(), old_pair[0].read_bytes(), old_pair[1].read_bytes()))

    ca2 = tmp_path / "ca2.crt"
    doq_tls(n1, bundle, "ca-rotate", "finish", "--out", str(ca2))
    assert fingerprint(ca2.read_bytes()) == ca2_fp and len(x509.load_pem_x509_certificates(ca2.read_bytes())) == 1
    shutil.copy(ca2, client_ca.with_suffix(".tmp"))
    client_ca.with_suffix(".tmp").replace(client_ca)
    progress()
    work.stop.set()
    work.thread.join(120)
    assert not work.thread.is_alive() and not work.unexpected, work.unexpected

    # no acknowledged message lost; every failed call was a retryable one
    with DoqClient([n.grpc_addr for n in cluster], ca_file=str(ca2), key=admin_key(n1)) as c:
        until("every enqueued message consumed",
              lambda: work.drain(c, wait_ms=1000) == 0 and work.enqueued <= work.consumed, 180)
    assert work.enqueued and work.enqueued <= work.consumed
    assert all(e.retryable for e in work.errors), [repr(e) for e in work.errors]
    until("equal digests", lambda: len({https(n, "GET", "/db/digest", ca=ca2)[1]["digest"] for n in cluster}) == 1)

    # every port of every member serves its new certificate (no restart), verified with CA2 alone
    for n in cluster:
        serial = file_serial(tls_dir(n) / "node.crt")
        peer = (tls_dir(n) / "node.crt", tls_dir(n) / "node.key")
        assert {served_serial(n.http_port, ca2), served_serial(n.grpc_port, ca2),
                served_serial(n.raft_port, ca2, peer)} == {serial}
    print(f"client: {work.calls} calls, {len(work.enqueued)} messages, {len(work.errors)} retryable failures:",
          sorted({type(e).__name__ + "/" + str(getattr(e, "reason", "")) for e in work.errors}))
    # the old CA is trusted nowhere: its member certificate is refused in the handshake
    status = doq_tls(n1, ca2, "status")
    assert {(n["node_cert"]["issuer"], tuple(c["fingerprint"] for c in n["trusted_cas"]))
            for n in status["nodes"]} == {(ca2_fp, (ca2_fp,))}
    with pytest.raises(PeerRefused):  # in the TLS handshake
        send_frame(f"127.0.0.1:{n3.raft_port}", stream_from="node-2", to="node-3", messages=[],
                   ssl_context=peer_context(ca2.read_bytes(), old_pair[0].read_bytes(), old_pair[1].read_bytes()))
    with pytest.raises(ssl.SSLCertVerificationError):  # and clients with only CA1 do not verify the nodes
        served_serial(n2.http_port, ca1)
    # the CA keys never left node-1; the old one is gone
    assert fingerprint((tls_dir(n1) / "ca.crt").read_bytes()) == ca2_fp
    assert not (tls_dir(n1) / "ca-next.key").exists()
    assert not any((tls_dir(n) / name).exists() for n in (n2, n3) for name in ("ca.key", "ca-next.key"))


def serialization_pem() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.PEM


def test_the_operators_own_client_certificate_is_reloaded_without_a_restart(tmp_path: Path) -> None:
    """`--tls-cert/--tls-key` (a certificate of the operator's CA on the client ports):
    replaced on disk, `doq tls reload` makes both client ports serve it at the next
    handshake; a key that is not the certificate's is refused and the node keeps serving."""
    org_ca, org_key = generate_ca("the operator's CA")
    ca = tmp_path / "org-ca.crt"
    ca.write_bytes(org_ca)
    cert, key = tmp_path / "client-port.crt", tmp_path / "client-port.key"

    def install(pair: tuple[bytes, bytes]) -> int:
        cert.write_bytes(pair[0])
        key.write_bytes(pair[1])
        return x509.load_pem_x509_certificate(pair[0]).serial_number

    first = install(issue_node_cert(org_ca, org_key, "doq.example", ["127.0.0.1"]))
    n = NodeProc(tmp_path / "data", extra_args=["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        n.extra_args = ["--secure", *n.extra_args]
        n.launch()
        until("ready over HTTPS", lambda: https(n, "GET", "/readyz", ca=ca)[0] == 200, 60)
        until("admin key", lambda: admin_key(n) is not None and https(n, "GET", "/cluster/tls", ca=ca)[0] == 200, 60)
        assert served_serial(n.http_port, ca) == served_serial(n.grpc_port, ca) == first
        second = install(issue_node_cert(org_ca, org_key, "doq.example", ["127.0.0.1"]))
        assert served_serial(n.http_port, ca) == first  # not before the reload
        status, body = https(n, "POST", "/cluster/tls/reload", ca=ca)
        assert status == 200, body
        assert served_serial(n.http_port, ca) == served_serial(n.grpc_port, ca) == second
        _, other_key = issue_node_cert(org_ca, org_key, "doq.example", ["127.0.0.1"])
        key.write_bytes(other_key)  # a half-done copy
        status, body = https(n, "POST", "/cluster/tls/reload", ca=ca)
        assert (status, body["reason"]) == (409, "TLS_FILES") and other_key.decode() not in json.dumps(body)
        assert served_serial(n.http_port, ca) == served_serial(n.grpc_port, ca) == second
        assert n.proc is not None and n.proc.poll() is None
    finally:
        n.kill9()
