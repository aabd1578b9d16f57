"""TLS decisions and material (doq/tls): when a node runs secure (pure), and the cluster
CA and node certificates made with `cryptography`, written 0600 in a 0700 directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography import x509

from doq.errors import InvalidArgument
from doq.tls.certs import (
    TlsSetupError,
    ensure_node_tls,
    fingerprint,
    generate_ca,
    install_ca,
)
from doq.tls.mode import decide_secure, is_loopback

LOOP = ("127.0.0.1:10000", "127.0.0.1:8000", "localhost:9000")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.1", "doq-0.doq", "192.168.1.2"])
def test_wildcards_and_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_only_loopback_and_no_flag_is_plain_like_the_seed() -> None:
    assert decide_secure(secure=False, insecure=False, listen_addrs=LOOP) is False


def test_secure_flag_turns_tls_on_whatever_the_addresses() -> None:
    assert decide_secure(secure=True, insecure=False, listen_addrs=LOOP) is True


def test_a_non_loopback_address_or_advertised_host_is_secure_unless_insecure() -> None:
    wide = ("0.0.0.0:10000", "127.0.0.1:8000", "127.0.0.1:9000")
    assert decide_secure(secure=False, insecure=False, listen_addrs=wide) is True
    assert decide_secure(secure=False, insecure=False, listen_addrs=LOOP, advertise_host="doq-0.doq") is True
    assert decide_secure(secure=False, insecure=True, listen_addrs=wide) is False


def test_both_flags_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        decide_secure(secure=True, insecure=True, listen_addrs=LOOP)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_bootstrapping_node_makes_a_ca_and_its_certificate_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        tls = ensure_node_tls(tmp_path / "tls", "node-1", ["doq-0.doq", "10.1.2.3"], may_create_ca=True)
    finally:
        os.umask(old)
    assert mode(tmp_path / "tls") == 0o700
    assert {p.name: mode(p) for p in (tmp_path / "tls").iterdir()} == {
        "ca.crt": 0o600, "ca.key": 0o600, "node.crt": 0o600, "node.key": 0o600}
    cert = x509.load_pem_x509_certificate(tls.node_cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(tls.ca_cert))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in san} >= {"node-1", "localhost", "127.0.0.1", "doq-0.doq", "10.1.2.3"}
    assert tls.ca_key is not None


def test_a_restart_keeps_the_certificate_and_new_addresses_reissue_it(tmp_path: Path) -> None:
    first = ensure_node_tls(tmp_path, "n1", ["a.example"], may_create_ca=True)
    again = ensure_node_tls(tmp_path, "n1", ["a.example"], may_create_ca=True)
    assert again.node_cert == first.node_cert and again.ca_cert == first.ca_cert
    moved = ensure_node_tls(tmp_path, "n1", ["b.example"], may_create_ca=True)
    assert moved.node_cert != first.node_cert and moved.ca_cert == first.ca_cert


def test_a_joiner_without_the_cluster_ca_cannot_set_up_tls(tmp_path: Path) -> None:
    with pytest.raises(TlsSetupError):
        ensure_node_tls(tmp_path, "n2", [], may_create_ca=False)


def test_a_joiner_with_the_cluster_ca_issues_its_own_certificate(tmp_path: Path) -> None:
    ca_cert, ca_key = generate_ca()
    install_ca(tmp_path, ca_cert, ca_key)
    tls = ensure_node_tls(tmp_path, "n2", [], may_create_ca=False)
    assert tls.ca_cert == ca_cert
    x509.load_pem_x509_certificate(tls.node_cert).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert))


def test_fingerprints_differ_per_ca_and_are_stable() -> None:
    a, _ = generate_ca()
    b, _ = generate_ca()
    assert fingerprint(a) == fingerprint(a) and fingerprint(a) != fingerprint(b)
    assert len(fingerprint(a)) == 64


@pytest.mark.parametrize("node_id", ["10.0.0.1", "01.2.3.4", "a..b"])
def test_a_new_secure_cluster_refuses_a_node_id_no_peer_could_dial(tmp_path: Path, node_id: str) -> None:
    """Bootstrapping a secure cluster (no CA yet, no --join) with an id that is not a TLS
    server name (IP-like, an empty label) fails before any material is made; a good id
    bootstraps, and a data dir that already has its CA keeps its id (a lone node)."""
    from doq.config import ServeConfig
    from doq.server_tls import node_tls
    from doq.tls.certs import TLS_DIR, TlsSetupError

    with pytest.raises(TlsSetupError, match="choose another --node-id"):
        node_tls(ServeConfig(node_id=node_id, secure=True), tmp_path / node_id)
    assert not (tmp_path / node_id / TLS_DIR / "ca.crt").exists()
    assert node_tls(ServeConfig(node_id="node-1", secure=True), tmp_path / "node-1") is not None
    made = tmp_path / node_id / TLS_DIR
    made.mkdir(parents=True)
    for name in ("ca.crt", "ca.key"):
        (made / name).write_bytes((tmp_path / "node-1" / TLS_DIR / name).read_bytes())
    assert node_tls(ServeConfig(node_id=node_id, secure=True), tmp_path / node_id) is not None
