"""One node's side of certificate renewal and CA rotation (doq/tls/rotation.py,
doq/tls/live.py, doq/tls/expiry.py) on real files and real `cryptography` material:
every step changes the files whole or not at all, and a step that would leave the node
unable to prove who it is (its certificate or CA key outside the trust bundle) is refused
with nothing changed. The live material refuses files that do not hold together. The
expiry report warns ahead of expiry and the metric carries every certificate's expiry."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography import x509
from prometheus_client import REGISTRY

from doq.service.tls_admin import TlsAdmin
from doq.tls import rotation
from doq.tls.certs import (
    CA_CERT,
    CA_KEY,
    CA_NEXT_KEY,
    NODE_CERT,
    NODE_KEY,
    CsrError,
    TlsSetupError,
    bundle_certs,
    ensure_node_tls,
    fingerprint,
    generate_ca,
    install_node_pair,
    issue_node_cert,
    issuer_in,
    key_certificate,
    make_csr,
    pem_of,
    read_node_tls,
)
from doq.tls.expiry import WARN_CA_DAYS, WARN_NODE_DAYS, key_matches, report
from doq.tls.live import LiveTls


def holder(tmp_path: Path) -> Path:
    """A node directory that bootstrapped a cluster: CA, CA key, node certificate."""
    d = tmp_path / "node-1" / "tls"
    ensure_node_tls(d, "node-1", ["127.0.0.1"], may_create_ca=True)
    return d


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_rotation_moves_the_signing_ca_and_keeps_every_file_private(tmp_path: Path) -> None:
    d = holder(tmp_path)
    ca1 = fingerprint((d / CA_CERT).read_bytes())
    bundle = rotation.begin_ca(read_node_tls(d))
    assert fingerprint(bundle) == ca1  # the current CA first: it still signs
    assert len(bundle_certs(bundle)) == 2 and (d / CA_NEXT_KEY).exists()
    assert rotation.begin_ca(read_node_tls(d)) == bundle  # again: the same next CA, not a third
    m = read_node_tls(d)
    assert fingerprint(key_certificate(m.ca_cert, m.ca_key) or b"") == ca1

    new_ca = rotation.promote_ca(m)
    m = read_node_tls(d)
    assert fingerprint(key_certificate(m.ca_cert, m.ca_key) or b"") == fingerprint(new_ca) != ca1
    assert fingerprint(m.ca_cert) == fingerprint(new_ca)  # the signing CA first in ca.crt
    assert not (d / CA_NEXT_KEY).exists()
    with pytest.raises(rotation.NoCaKey):
        rotation.promote_ca(m)  # nothing waiting

    csr, key = make_csr("node-1", ["127.0.0.1"])
    cert = rotation.sign(m, csr, "node-1", ["127.0.0.1"])
    assert rotation.install_renewed(m, cert, key) == fingerprint(new_ca)
    m = read_node_tls(d)
    issuer = issuer_in(m.node_cert, m.ca_cert)
    assert issuer is not None and fingerprint(pem_of(issuer)) == fingerprint(new_ca)
    rotation.set_trust(m, new_ca)
    assert len(bundle_certs((d / CA_CERT).read_bytes())) == 1
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in d.iterdir())
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_the_trust_bundle_may_not_leave_out_the_nodes_own_certificate_or_ca_key(tmp_path: Path) -> None:
    d = holder(tmp_path)
    rotation.begin_ca(read_node_tls(d))
    m = read_node_tls(d)
    ca1, ca2 = bundle_certs(m.ca_cert)
    pem = pem_of
    before = files(d)
    with pytest.raises(rotation.TrustRefused, match="signed by none"):
        rotation.set_trust(m, pem(ca2))  # node.crt is of CA1: it would lock itself out
    other, _ = generate_ca("someone else")
    with pytest.raises(rotation.TrustRefused, match="signs with the CA"):
        # node.crt of CA1 passes; but ca-next.key's CA would be left out
        rotation.set_trust(m, pem(ca1) + other)
    not_a_ca, _ = issue_node_cert(pem(ca1), m.ca_key or b"", "x", [])
    with pytest.raises(CsrError, match="not a CA"):
        rotation.set_trust(m, pem(ca1) + not_a_ca)
    with pytest.raises(CsrError, match="PEM bundle"):
        rotation.set_trust(m, b"garbage")
    assert files(d) == before  # nothing changed


def test_a_certificate_of_an_untrusted_ca_or_another_key_is_not_installed(tmp_path: Path) -> None:
    d = holder(tmp_path)
    m = read_node_tls(d)
    before = files(d)
    other_cert, other_key = generate_ca()
    csr, key = make_csr("node-1", [])
    foreign, _ = issue_node_cert(other_cert, other_key, "node-1", [])
    with pytest.raises(CsrError, match="does not trust"):
        rotation.install_renewed(m, foreign, key)
    mine = rotation.sign(m, csr, "node-1", [])
    _, wrong_key = make_csr("node-1", [])
    with pytest.raises(CsrError, match="another key"):
        rotation.install_renewed(m, mine, wrong_key)
    assert files(d) == before


def test_a_node_without_a_ca_key_neither_signs_nor_rotates(tmp_path: Path) -> None:
    d = holder(tmp_path)
    (d / CA_KEY).unlink()
    m = read_node_tls(d)
    csr, _ = make_csr("node-1", [])
    with pytest.raises(rotation.NoCaKey):
        rotation.sign(m, csr, "node-1", [])
    with pytest.raises(rotation.NoCaKey):
        rotation.begin_ca(m)


@pytest.mark.parametrize("crash_after", ["written", "key_renamed"])
def test_a_crash_inside_install_node_pair_never_leaves_a_certificate_of_another_key(
        tmp_path: Path, crash_after: str, monkeypatch: pytest.MonkeyPatch) -> None:
    d = holder(tmp_path)
    m = read_node_tls(d)
    csr, key = make_csr("node-1", ["127.0.0.1"])
    cert = rotation.sign(m, csr, "node-1", ["127.0.0.1"])
    real_replace = Path.replace
    renames = []

    def crashing_replace(self: Path, target: Path) -> Path:  # the process dies at this rename
        if self.name.endswith(".next"):
            renames.append(self.name)
            if crash_after == "written" or len(renames) == 2:
                raise SystemExit("crash")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", crashing_replace)
    with pytest.raises(SystemExit):
        install_node_pair(d, cert, key)
    monkeypatch.setattr(Path, "replace", real_replace)
    got = ensure_node_tls(d, "node-1", ["127.0.0.1"], may_create_ca=False)  # the next start
    assert key_matches(got.node_cert, got.node_key)
    assert (got.node_cert == cert) is (crash_after == "key_renamed")  # finished once the key was in place
    assert not any(p.name.endswith((".next", ".tmp")) for p in d.iterdir())


def test_live_material_takes_consistent_files_and_refuses_the_rest(tmp_path: Path) -> None:
    d = holder(tmp_path)
    live = LiveTls(read_node_tls(d))
    seen = []
    live.subscribe(seen.append)
    gen = live.generation
    _, other_key = make_csr("node-1", [])
    good_key = (d / NODE_KEY).read_bytes()
    (d / NODE_KEY).write_bytes(other_key)  # an operator's half-done copy
    with pytest.raises(TlsSetupError, match="not the key"):
        live.reload()
    assert live.generation == gen and live.current.node_key == good_key and not seen
    (d / NODE_KEY).write_bytes(good_key)
    new = live.reload()
    assert live.generation == gen + 1 and seen == [new]
    foreign_ca, foreign_key = generate_ca()
    cert, key = issue_node_cert(foreign_ca, foreign_key, "node-1", [])
    (d / NODE_CERT).write_bytes(cert)
    (d / NODE_KEY).write_bytes(key)
    with pytest.raises(TlsSetupError, match="none of the CAs"):
        live.reload()


def _node(node_id: str = "node-1") -> SimpleNamespace:
    return SimpleNamespace(node_id=node_id, cluster_admin=lambda: None)


def test_expiry_is_reported_exported_and_warned_ahead(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = holder(tmp_path)
    m = read_node_tls(d)
    node_exp = x509.load_pem_x509_certificate(m.node_cert).not_valid_after_utc.timestamp()
    ca_exp = x509.load_pem_x509_certificate(m.ca_cert).not_valid_after_utc.timestamp()
    r = report(m)
    assert r.warnings(node_exp - (WARN_NODE_DAYS + 1) * 86400) == []
    warned = r.warnings(node_exp - (WARN_NODE_DAYS - 1) * 86400)
    assert len(warned) == 1 and "node certificate expires in 29.0 days" in warned[0]
    assert any("cluster CA" in w for w in r.warnings(ca_exp - (WARN_CA_DAYS - 1) * 86400))

    clock = [node_exp - 10 * 86400]
    admin = TlsAdmin(_node(), LiveTls(m), ["127.0.0.1"], clock_s=lambda: clock[0])  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="doq.tls"):
        assert len(admin.publish()) == 1
    assert "expires in 10.0 days" in caplog.text
    assert m.node_key.decode() not in caplog.text and (m.ca_key or b"").decode() not in caplog.text
    fp = fingerprint(m.node_cert)[:16]
    assert REGISTRY.get_sample_value("doq_tls_certificate_expiry_timestamp_seconds",
                                     {"cert": "node", "fingerprint": fp}) == int(node_exp)
    assert REGISTRY.get_sample_value("doq_tls_certificate_expiry_timestamp_seconds",
                                     {"cert": "ca", "fingerprint": fingerprint(m.ca_cert)[:16]}) == int(ca_exp)
    status = admin.status()
    assert status["node_cert"]["days_left"] == 10 and status["warnings"] == admin.publish()
    assert "PRIVATE" not in str(status)


def test_status_names_the_issuer_the_trusted_cas_and_the_signing_ca(tmp_path: Path) -> None:
    d = holder(tmp_path)
    rotation.begin_ca(read_node_tls(d))
    m = read_node_tls(d)
    now = datetime.datetime.now(datetime.UTC).timestamp()
    doc = report(m, rotation.next_ca_key(d)).to_json(now)
    ca1, ca2 = (fingerprint(pem_of(c)) for c in bundle_certs(m.ca_cert))
    assert doc["node_cert"]["issuer"] == ca1 == doc["signing_ca"] and doc["next_ca"] == ca2
    assert [c["fingerprint"] for c in doc["trusted_cas"]] == [ca1, ca2]
