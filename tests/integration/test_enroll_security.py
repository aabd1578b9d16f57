"""Enrollment's security against real processes (issue 18's review):

- the joiner sends a CSR and gets a certificate for exactly its node id; the CA key never
  leaves the node that made it (not in the answer, not in the joiner's files);
- `/cluster/enroll` checks the token against the committed table before it proposes
  anything: a flood of well-formed bogus tokens (unknown, wrong secret, another CA's,
  expired, used) leaves the Raft log where it was; a good enrollment is audited;
- a leader without the CA key refuses to create tokens or enroll (409 NO_CA_KEY);
- a removed member still holding its valid certificate cannot append, vote or change a
  digest, and cannot enroll again without a new token;
- an explicit `http://` join address with a join token is refused (the token would
  travel in clear).

Real: `doq serve` processes on 127.0.0.1, real TLS and mutual TLS."""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from doq.ports import free_port
from doq.raft.types import Message, MessageType
from doq.tls.certs import make_csr
from doq.tls.enrollment import JoinToken, decode_token, encode_token
from tests.integration.test_join_token import joiner, members, refused
from tests.integration.test_tls import (
    admin_key,
    ca_file,
    https,
    remove_member,
    start_secure,
    wait_https_ready,
)
from tests.support.cluster import until
from tests.support.forge import delete_queue_append, peer_context, send_frame
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def create_token(node: NodeProc, ttl_s: int = 3600) -> str:
    """`doq join-token create --ttl-s TTL_S` against `node` (the real CLI)."""
    res = subprocess.run([sys.executable, "-m", "doq", "join-token", "create", "--json", "--ttl-s", str(ttl_s),
                          "--server", f"https://127.0.0.1:{node.http_port}", "--ca-file", str(ca_file(node))],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DOQ_KEY": str(admin_key(node))})
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["token"])


def enroll_body(token: str, node_id: str, csr: bytes) -> dict[str, Any]:
    return {"token": token, "node_id": node_id, "raft_addr": f"127.0.0.1:{free_port()}",
            "grpc_addr": f"127.0.0.1:{free_port()}", "http_addr": f"127.0.0.1:{free_port()}",
            "csr": csr.decode()}


def metrics(node: NodeProc) -> str:
    ctx = ssl.create_default_context(cafile=str(ca_file(node)))
    req = urllib.request.Request(f"https://127.0.0.1:{node.http_port}/metrics",
                                 headers={"Authorization": f"Bearer {admin_key(node)}"})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return str(r.read().decode())


def counter(node: NodeProc, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(r"^" + name + r"\{" + re.escape(want) + r"\} ([0-9.e+]+)$", metrics(node), re.M)
    return float(m.group(1)) if m else 0.0


def view(node: NodeProc) -> dict[str, Any]:
    status, body = https(node, "GET", "/cluster")
    assert status == 200, body
    return dict(body)


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    node = NodeProc(tmp_path_factory.mktemp("enrollsec") / "data")
    start_secure(node)
    try:
        yield node
    finally:
        node.kill9()


def test_the_answer_is_a_certificate_for_exactly_the_node_id_never_the_ca_key(seed: NodeProc) -> None:
    token = create_token(seed)
    # the request's subject claims the seed's id: the certificate names the enrolled id only
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-1")]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName("ghost.example")]), critical=False)
           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    bad_csr, _ = make_csr("ghost", ["node-1"])  # a SAN of another member's id: refused, token not spent
    status, body = https(seed, "POST", "/cluster/enroll", enroll_body(token, "ghost", bad_csr))
    assert (status, body["reason"]) == (400, "INVALID_CSR"), body
    status, body = https(seed, "POST", "/cluster/enroll", enroll_body(token, "ghost", b"not a csr"))
    assert (status, body["reason"]) == (400, "INVALID_CSR"), body

    status, body = https(seed, "POST", "/cluster/enroll", enroll_body(token, "ghost", csr))
    assert status == 200, body
    assert set(body) == {"status", "ca_cert", "node_cert"}
    ca_key = (seed.data_dir / "node-1" / "tls" / "ca.key").read_text()
    assert "PRIVATE KEY" not in json.dumps(body) and ca_key.strip() not in json.dumps(body)
    cert = x509.load_pem_x509_certificate(body["node_cert"].encode())
    ca = x509.load_pem_x509_certificate(ca_file(seed).read_bytes())
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ghost"
    sans = {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}
    assert "ghost" in sans and "node-1" not in sans and "ghost.example" in sans
    assert cert.public_key() == key.public_key()  # the key the requester made, certified

    log = until("the member add audited", lambda: next(
        (json.loads(line.split("doq.audit: ", 1)[1]) for line in seed.log().splitlines()
         if '"audit":"member.add"' in line and '"target":"ghost"' in line), None))
    assert log["key"] == "jointoken:" + decode_token(token).token_id.hex() and log["result"] == "ok"
    assert counter(seed, "doq_audit_events_total", action="member.add", result="ok") >= 1
    assert decode_token(token).secret.hex() not in seed.log()
    assert remove_member(seed, "ghost")[0] == 200


def test_a_flood_of_bogus_tokens_proposes_nothing(seed: NodeProc) -> None:
    real = decode_token(create_token(seed, ttl_s=1))
    spent = create_token(seed)
    csr, _ = make_csr("flood", [])
    status, body = https(seed, "POST", "/cluster/enroll", enroll_body(spent, "spender", csr))
    assert status == 200, body
    assert remove_member(seed, "spender")[0] == 200
    until("the token's expiry passed", lambda: time.time() * 1000 > real.expires_ms + 1)
    good = create_token(seed)
    before = until("a settled log", lambda: (lambda v: v if v["commit_index"] == v["applied_index"] else None)(
        view(seed)))

    def forged(i: int) -> str:
        kind = i % 5
        if kind == 0:  # unknown id
            return encode_token(JoinToken(real.addrs, real.ca_fingerprints, os.urandom(16), os.urandom(32),
                                          real.expires_ms + 10**9))
        if kind == 1:  # a known id, a guessed secret
            g = decode_token(good)
            return encode_token(JoinToken(g.addrs, g.ca_fingerprints, g.token_id, os.urandom(32), g.expires_ms))
        if kind == 2:  # another CA's
            g = decode_token(good)
            return encode_token(JoinToken(g.addrs, ("cd" * 32,), g.token_id, g.secret, g.expires_ms))
        if kind == 3:  # expired
            return encode_token(real)
        return spent  # used

    for i in range(100):
        status, body = https(seed, "POST", "/cluster/enroll", enroll_body(forged(i), f"bogus-{i}", csr))
        assert (status, body["reason"]) == (409, "INVALID_JOIN_TOKEN"), (i, body)
    after = view(seed)
    assert (after["commit_index"], after["applied_index"], after["term"]) == (
        before["commit_index"], before["applied_index"], before["term"])  # nothing proposed
    assert members(seed) == ["node-1"]
    # the flood spent nothing: the good token still enrolls
    status, body = https(seed, "POST", "/cluster/enroll", enroll_body(good, "late", csr))
    assert status == 200, body
    assert view(seed)["commit_index"] > before["commit_index"]
    assert remove_member(seed, "late")[0] == 200


def test_an_http_join_address_with_a_token_is_refused(seed: NodeProc) -> None:
    token = create_token(seed)
    n = NodeProc(seed.data_dir, node_id="cleartext",
                 extra_args=["--join", f"http://192.0.2.10:{seed.http_port}", "--join-token", token])
    n.log_path = seed.data_dir.parent / "cleartext.log"
    log = refused(n)
    assert "never sent over plain http" in log and token not in log
    assert members(seed) == ["node-1"]
    # the token was not spent: it still enrolls a node through an https address
    ok = joiner(seed, "node-9", token)
    ok.launch()
    try:
        wait_https_ready(ok, 90)
        assert "node-9" in members(seed)
        assert remove_member(seed, "node-9")[0] == 200  # the seed alone again
    finally:
        ok.kill9()


def _refused_total(node: NodeProc, reason: str) -> float:
    return counter(node, "doq_raft_messages_refused_total", reason=reason)


def _digests(nodes: list[NodeProc]) -> set[str]:
    return {https(n, "GET", "/db/digest", ca=ca_file(nodes[0]))[1]["digest"] for n in nodes}


def test_a_removed_member_with_its_valid_certificate_changes_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    data = tmp_path_factory.mktemp("removed") / "data"
    first = NodeProc(data, node_id="node-1")
    nodes = [start_secure(first)]
    try:
        used: dict[str, str] = {}
        for node_id in ("node-2", "node-3"):
            used[node_id] = create_token(first)
            n = joiner(first, node_id, used[node_id])
            n.launch()
            wait_https_ready(n, 90)
            nodes.append(n)
        until("three voters", lambda: sorted(m["node_id"] for m in view(first)["members"] if m["role"] == "voter")
              == ["node-1", "node-2", "node-3"], 90)
        n1, n2, n3 = nodes
        for n in (n2, n3):  # enrolled members hold no CA key
            assert not (data / n.node_id / "tls" / "ca.key").exists()
            assert sorted(p.name for p in (data / n.node_id / "tls").iterdir()) == ["ca.crt", "node.crt", "node.key"]

        # the leader must hold the CA key to enroll: a leader that does not refuses clearly
        until("node-1 leads", lambda: view(n1)["leader_id"] == "node-1", 90)
        status, body = https(n1, "POST", "/cluster/transfer-leader", {"target": "node-2"})
        assert status == 200, body
        until("node-2 leads", lambda: view(n2)["leader_id"] == "node-2" and view(n2)["role"] == "leader", 90)
        status, body = https(n2, "POST", "/cluster/join-tokens", {"ttl_s": 60})
        assert (status, body["reason"]) == (409, "NO_CA_KEY"), body
        assert "transfer-leader" in body["detail"]
        status, body = https(n1, "POST", "/cluster/transfer-leader", {"target": "node-1"})
        assert status == 200, body
        until("node-1 leads again", lambda: view(n1)["role"] == "leader", 90)

        status, body = https(n1, "POST", "/API/v1/queues", {"name": "canary"})
        assert status in (200, 201), body
        cert_dir = data / "node-3" / "tls"
        stolen = {p.name: p.read_bytes() for p in cert_dir.iterdir()}  # its still valid certificate
        assert remove_member(n1, "node-3")[0] == 200
        n3.kill9()
        rest = [n1, n2]
        until("two members", lambda: all(sorted(m["node_id"] for m in view(n)["members"]) == ["node-1", "node-2"]
                                          for n in rest), 90)
        before = until("equal digests", lambda: (lambda d: d if len(d) == 1 else None)(_digests(rest)))
        term = view(n1)["term"]
        cluster_id = view(n1)["cluster_id"]
        ctx = peer_context(stolen["ca.crt"], stolen["node.crt"], stolen["node.key"])
        for target in rest:
            count0 = _refused_total(target, "not_member")
            commit = view(target)["commit_index"]
            append = delete_queue_append(frm="node-3", to=target.node_id, term=term + 1, index=commit, queue="canary")
            vote = Message(type=MessageType.VOTE, to=target.node_id, frm="node-3", term=term + 5, log_term=term + 4,
                           index=commit + 100)
            pre = Message(type=MessageType.PRE_VOTE, to=target.node_id, frm="node-3", term=term + 6,
                          log_term=term + 4, index=commit + 100)
            # the stream's TLS handshake passes (a valid certificate of the cluster CA, CN node-3)...
            send_frame(f"127.0.0.1:{target.raft_port}", stream_from="node-3", to=target.node_id,
                       messages=[append, vote, pre], cluster_ids=[cluster_id], ssl_context=ctx)
            # ...but node-3 is no member: every message is dropped before Raft
            until(f"{target.node_id} refused node-3's messages",
                  lambda target=target, count0=count0: _refused_total(target, "not_member") >= count0 + 3)  # type: ignore[misc]
        after = until("equal digests", lambda: (lambda d: d if len(d) == 1 else None)(_digests(rest)))
        assert after == before
        for n in rest:
            assert view(n)["term"] == term  # no vote was granted, no term raised
            assert https(n, "GET", "/API/v1/queues/canary")[0] == 200

        # it cannot come back with the token it once spent (its data dir lost or not)...
        shutil.rmtree(data / "node-3")
        again = joiner(n1, "node-3", used["node-3"])
        again.log_path = data.parent / "node-3-again.log"
        assert "INVALID_JOIN_TOKEN" in refused(again)
        assert sorted(m["node_id"] for m in view(n1)["members"]) == ["node-1", "node-2"]
        # ...only with a new one
        back = joiner(n1, "node-3", create_token(n1))
        nodes.append(back)
        back.launch()
        wait_https_ready(back, 90)
        until("node-3 a member again", lambda: "node-3" in members(n1), 90)
    finally:
        for n in nodes:
            n.kill9()

