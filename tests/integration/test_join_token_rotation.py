"""Join tokens across a rolling CA rotation, against real processes (issue 18): a token
names every CA the cluster trusts when it is made, so one made after `doq tls ca-rotate
begin` enrolls a node both before `reissue` (the old CA still signs) and after it (the
new one signs); one made before `begin` names only the old CA and enrolls nobody once the
new CA signs. Real: `doq serve --secure` processes on 127.0.0.1, real TLS handshakes,
the real `doq tls` and `doq join-token` commands."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography import x509

from doq.tls.certs import fingerprint, make_csr, pem_of
from doq.tls.enrollment import decode_token
from tests.integration.test_enroll_security import enroll_body
from tests.integration.test_join_token import create_token, joiner
from tests.integration.test_tls import ca_file, https, start_secure, wait_https_ready
from tests.integration.test_tls_rotation import doq_tls, tls_dir
from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def voters(n: NodeProc, ca: Path) -> list[str]:
    return sorted(m["node_id"] for m in https(n, "GET", "/cluster", ca=ca)[1]["members"] if m["role"] == "voter")


def test_a_token_made_during_a_ca_rotation_enrolls_before_and_after_reissue(tmp_path: Path) -> None:
    data = tmp_path / "data"
    n1 = NodeProc(data, node_id="node-1")
    nodes = [n1]
    try:
        start_secure(n1)
        ca1 = tmp_path / "ca1.crt"
        shutil.copy(ca_file(n1), ca1)
        fp1 = fingerprint(ca1.read_bytes())
        before_begin = create_token(n1)
        assert decode_token(before_begin).ca_fingerprints == (fp1,)

        bundle = tmp_path / "bundle.crt"
        doq_tls(n1, ca1, "ca-rotate", "begin", "--out", str(bundle))
        fp2 = fingerprint(pem_of(x509.load_pem_x509_certificates(bundle.read_bytes())[1]))
        early, late = create_token(n1), create_token(n1)
        assert decode_token(early).ca_fingerprints == decode_token(late).ca_fingerprints == (fp1, fp2)

        n2 = joiner(n1, "node-2", early)  # enrolls while the old CA signs
        nodes.append(n2)
        n2.launch()
        wait_https_ready(n2, 90)
        assert fingerprint((tls_dir(n2) / "ca.crt").read_bytes()) == fp1  # it trusts the bundle, old first
        until("node-2 a voter", lambda: voters(n1, bundle) == ["node-1", "node-2"], 120)

        doq_tls(n1, bundle, "ca-rotate", "reissue")  # the new CA signs from now on
        n3 = joiner(n1, "node-3", late)  # a token of the same rotation: still enrolls
        nodes.append(n3)
        n3.launch()
        wait_https_ready(n3, 90)
        until("node-3 a voter", lambda: voters(n1, bundle) == ["node-1", "node-2", "node-3"], 120)
        assert https(n3, "GET", "/cluster/tls", ca=bundle)[1]["node_cert"]["issuer"] == fp2

        # a token made before `begin` names only the old CA: refused now, nothing spent or added
        csr, _ = make_csr("node-4", [])
        status, body = https(n1, "POST", "/cluster/enroll", enroll_body(before_begin, "node-4", csr), ca=bundle)
        assert (status, body["reason"]) == (409, "INVALID_JOIN_TOKEN"), body
        assert "node-4" not in voters(n1, bundle)

        ca2 = tmp_path / "ca2.crt"
        doq_tls(n1, bundle, "ca-rotate", "finish", "--out", str(ca2))  # every member's certificate is of CA2
        assert fingerprint(ca2.read_bytes()) == fp2
        status, body = https(n3, "POST", "/API/v1/queues", {"name": "after-rotation"}, ca=ca2)  # forwarded over TLS
        assert status in (200, 201), body
        until("equal digests", lambda: len({https(n, "GET", "/db/digest", ca=ca2)[1]["digest"] for n in nodes}) == 1)
    finally:
        for n in nodes:
            n.kill9()
