"""The pure parts of enrollment (issue 18): a join token never goes to a plain-http address
that is not loopback; a CSR is signed only if its self-signature verifies and its key is
ECDSA P-256, and the certificate names the node id the CA chose, whatever the request's
subject says."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from doq.enrollment_client import EnrollError, check_join_addrs
from doq.tls.certs import CsrError, csr_hosts, generate_ca, make_csr, sign_csr


@pytest.mark.parametrize("addr", ["http://10.0.0.5:8000", "HTTP://node-1.example:8000/", "http://[2001:db8::1]:8000"])
def test_a_plain_http_join_address_off_loopback_is_refused(addr: str) -> None:
    with pytest.raises(EnrollError, match="never sent over plain http"):
        check_join_addrs(["127.0.0.1:8000", addr])


@pytest.mark.parametrize("addr", ["10.0.0.5:8000", "https://10.0.0.5:8000", "http://127.0.0.1:8000",
                                  "http://localhost:8000", "http://[::1]:8000"])
def test_https_bare_and_loopback_http_join_addresses_pass(addr: str) -> None:
    check_join_addrs([addr])


def _csr(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, cn: str) -> bytes:
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def test_the_certificate_names_the_chosen_node_id_for_the_requesters_key() -> None:
    ca_cert, ca_key = generate_ca()
    csr, key_pem = make_csr("node-4", ["10.1.2.3", "n4.example"])
    cert = x509.load_pem_x509_certificate(sign_csr(ca_cert, ca_key, csr, "node-5", ["10.9.9.9"]))
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-5"
    names = {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}
    assert {"node-5", "localhost", "127.0.0.1", "10.9.9.9", "10.1.2.3", "n4.example"} <= names
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert cert.public_key() == key.public_key()
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_bad_csr_is_refused() -> None:
    with pytest.raises(CsrError):
        csr_hosts(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")
    with pytest.raises(CsrError, match="ECDSA P-256"):
        csr_hosts(_csr(rsa.generate_private_key(public_exponent=65537, key_size=2048), "x"))
    with pytest.raises(CsrError, match="ECDSA P-256"):
        csr_hosts(_csr(ec.generate_private_key(ec.SECP384R1()), "x"))
    good = _csr(ec.generate_private_key(ec.SECP256R1()), "x")
    der = bytearray(x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 1  # the signature no longer verifies
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CsrError, match="signature"):
        csr_hosts(tampered)
