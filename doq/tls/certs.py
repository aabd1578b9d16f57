"""The cluster CA and node certificates, made with the `cryptography` library.

Layout (in the node directory, `tls/`, 0700; every file 0600, doq/storage/files.py):
- `ca.crt` the cluster CA's certificate (PEM): every member trusts it, clients verify
  the node's certificate with it (`--ca-file`);
- `ca.key` the CA's private key: a node that holds it can issue node certificates (the
  node that bootstrapped the cluster, and a node the operator copied it to by hand; a
  member that enrolled with a join token never receives it: the CA signs its CSR);
- `node.crt`, `node.key` this node's certificate (CN = node id; SANs: the node id,
  localhost, 127.0.0.1, ::1, the host names and IPs it listens on and announces) and key.
  It serves the client ports and both ends of the mutual TLS between peers.

`ca.crt` is a trust bundle: one CA certificate, or several while a CA rotation is under
way (`doq.tls.rotation`). The *signing CA* is the bundle's certificate whose public key
is `ca.key`'s (`key_certificate`); on a node that holds it, it comes first in the bundle. A
rotation's next CA key waits in `ca-next.key` on the node that made it.

Keys are ECDSA P-256 (fast handshakes). The CA lives `CA_DAYS`, a node certificate
`NODE_DAYS`; a node certificate is issued again at start when it is missing, expires
within `RENEW_DAYS`, or does not cover the node's current addresses, if the CA key is
present (docs/security.md, "Rotating certificates").
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from doq.storage.files import private_dir, tighten, write_private

CA_DAYS = 3650
NODE_DAYS = 825
RENEW_DAYS = 30
TLS_DIR = "tls"
CA_CERT, CA_KEY, NODE_CERT, NODE_KEY = "ca.crt", "ca.key", "node.crt", "node.key"
CA_NEXT_KEY = "ca-next.key"
NEXT = ".next"  # a node pair being installed: node.key.next, node.crt.next (install_node_pair)
MAX_BUNDLE_CERTS = 8
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAX_CSR_NAMES = 64


class TlsSetupError(Exception):
    """The node cannot set up TLS (no CA, unreadable files): a message for the operator."""


@dataclass(frozen=True, slots=True)
class NodeTls:
    """A node's TLS material (PEM bytes) and where it lives."""

    directory: Path
    ca_cert: bytes
    node_cert: bytes
    node_key: bytes
    ca_key: bytes | None  # None: this node cannot issue certificates

    @property
    def ca_file(self) -> Path:
        return self.directory / CA_CERT

    @property
    def cert_file(self) -> Path:
        return self.directory / NODE_CERT

    @property
    def key_file(self) -> Path:
        return self.directory / NODE_KEY


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def generate_ca(name: str = "doq cluster CA") -> tuple[bytes, bytes]:
    """A new self-signed CA: (certificate PEM, private key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    seen: set[str] = set()
    for h in hosts:
        h = h.strip("[]")
        if not h or h in seen or h in ("0.0.0.0", "::"):
            continue
        seen.add(h)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def _sign_node_cert(ca_cert_pem: bytes, ca_key_pem: bytes, node_id: str, hosts: Iterable[str],
                    public_key: ec.EllipticCurvePublicKey) -> bytes:
    """A certificate (PEM) for `public_key` signed by the CA: common name `node_id`, valid
    for server and client use, SANs the node id, the loopback names and `hosts`."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "doq's CA keys are ECDSA"
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca_cert.subject).public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=NODE_DAYS), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_san([node_id, *LOOPBACK_NAMES, *hosts])),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def issue_node_cert(ca_cert_pem: bytes, ca_key_pem: bytes, node_id: str,
                    hosts: Iterable[str]) -> tuple[bytes, bytes]:
    """A certificate for `node_id` signed by the CA, valid for server and client use, with
    the node id and `hosts` (names or IPs) as SANs: (certificate PEM, private key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _sign_node_cert(ca_cert_pem, ca_key_pem, node_id, hosts, key.public_key()), _key_pem(key)


def make_csr(node_id: str, hosts: Iterable[str]) -> tuple[bytes, bytes]:
    """A new ECDSA P-256 key and a certificate signing request for it (common name
    `node_id`, SANs the node id and `hosts`): (CSR PEM, private key PEM). What a joining
    node sends; its key never leaves it."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .add_extension(x509.SubjectAlternativeName(_san([node_id, *hosts])), critical=False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), _key_pem(key)


class CsrError(ValueError):
    """A certificate signing request doq does not sign (the message says why)."""


def csr_hosts(csr_pem: bytes) -> tuple[ec.EllipticCurvePublicKey, list[str]]:
    """The public key and the SAN names (DNS names, IPs) a CSR asks for, after checking
    its self-signature and that its key is ECDSA P-256. Raises CsrError."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise CsrError("not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise CsrError("the certificate signing request's signature does not verify")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CsrError("the certificate signing request's key must be ECDSA P-256")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return key, []
    names = [*san.get_values_for_type(x509.DNSName), *(str(a) for a in san.get_values_for_type(x509.IPAddress))]
    if len(names) > MAX_CSR_NAMES or any(len(n) > 253 for n in names):
        raise CsrError(f"the certificate signing request names more than {MAX_CSR_NAMES} hosts or a too long one")
    return key, names


def sign_csr(ca_cert_pem: bytes, ca_key_pem: bytes, csr_pem: bytes, node_id: str,
             hosts: Iterable[str] = ()) -> bytes:
    """The CA's certificate (PEM) for the key of `csr_pem`, for `node_id` whatever the
    request's subject says: common name `node_id`, SANs the node id, the loopback names,
    `hosts` (the caller's choice) and the names the request asks for (the caller vets
    those first: `csr_hosts`). Raises CsrError."""
    key, asked = csr_hosts(csr_pem)
    return _sign_node_cert(ca_cert_pem, ca_key_pem, node_id, [*hosts, *asked], key)


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate's DER form, hex (what a join token pins)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _covers(cert_pem: bytes, ca_cert_pem: bytes, node_id: str, hosts: Iterable[str]) -> bool:
    """Is `cert_pem` a certificate of a CA of the bundle `ca_cert_pem` for `node_id`, valid beyond `RENEW_DAYS`,
    naming every host?"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False
    if issuer_in(cert_pem, ca_cert_pem) is None:
        return False
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_DAYS):
        return False
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names or names[0].value != node_id:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(n.value) for n in san}
    return all(str(g.value) in have for g in _san([node_id, *hosts]))


def install_ca(directory: Path, ca_cert: bytes, ca_key: bytes | None) -> None:
    """Write the cluster CA into `directory` (0700; files 0600)."""
    private_dir(directory)
    write_private(directory / CA_CERT, ca_cert)
    if ca_key is not None:
        write_private(directory / CA_KEY, ca_key)


def install_enrolled(directory: Path, ca_cert: bytes, node_cert: bytes, node_key: bytes) -> None:
    """Write what an enrollment gave a node (the CA certificate, its own certificate, and
    the key it made itself) into `directory` (0700; files 0600): no CA key."""
    private_dir(directory)
    write_private(directory / NODE_KEY, node_key)
    write_private(directory / NODE_CERT, node_cert)
    write_private(directory / CA_CERT, ca_cert)


def bundle_certs(bundle_pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle, in order (ValueError if there is none)."""
    return x509.load_pem_x509_certificates(bundle_pem)


def pem_of(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issuer_in(cert_pem: bytes, bundle_pem: bytes) -> x509.Certificate | None:
    """The CA of the bundle that signed `cert_pem` (None: none of them)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = bundle_certs(bundle_pem)
    except ValueError:
        return None
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return ca
        except (ValueError, TypeError, InvalidSignature):
            continue
    return None


def _public_der(key: object) -> bytes:
    assert isinstance(key, ec.EllipticCurvePublicKey), "doq's keys are ECDSA"
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_certificate(bundle_pem: bytes, key_pem: bytes | None) -> bytes | None:
    """The certificate (PEM) of the bundle whose public key is `key_pem`'s (None: none,
    or no key). On a CA holder with `ca.key`, the signing CA."""
    if key_pem is None:
        return None
    key = serialization.load_pem_private_key(key_pem, password=None)
    want = _public_der(key.public_key())
    for ca in bundle_certs(bundle_pem):
        if _public_der(ca.public_key()) == want:
            return pem_of(ca)
    return None



def check_trust_bundle(bundle_pem: bytes) -> list[x509.Certificate]:
    """The CA certificates of a trust bundle, checked: 1..MAX_BUNDLE_CERTS certificates,
    each a CA (basic constraints). Raises CsrError with the reason."""
    try:
        cas = bundle_certs(bundle_pem)
    except ValueError:
        raise CsrError("not a PEM bundle of CA certificates") from None
    if not 1 <= len(cas) <= MAX_BUNDLE_CERTS:
        raise CsrError(f"a trust bundle holds 1..{MAX_BUNDLE_CERTS} CA certificates")
    for ca in cas:
        try:
            is_ca = ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise CsrError(f"{fingerprint(pem_of(ca))[:16]}... is not a CA certificate")
    return cas


def join_bundle(*bundles: bytes) -> bytes:
    """The certificates of `bundles`, in order, each once (by fingerprint)."""
    out: list[bytes] = []
    seen: set[str] = set()
    for b in bundles:
        for ca in bundle_certs(b):
            pem = pem_of(ca)
            fp = fingerprint(pem)
            if fp not in seen:
                seen.add(fp)
                out.append(pem)
    return b"".join(out)


def signing_first(bundle_pem: bytes, ca_key: bytes | None) -> bytes:
    """The bundle with the certificate of `ca_key` (the signing CA) first, if present."""
    first = key_certificate(bundle_pem, ca_key)
    return join_bundle(first, bundle_pem) if first else bundle_pem


def _replace(path: Path, data: bytes) -> None:
    """Write `path` (0600) whole or not at all: a temporary file renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    write_private(tmp, data)
    tmp.replace(path)


def install_node_pair(directory: Path, cert: bytes, key: bytes) -> None:
    """Replace the node's certificate and key. Both are written whole first
    (`node.key.next`, `node.crt.next`), then renamed key first: a crash between the two
    renames is finished at the next load (`_finish_pair`), so the files never end up a
    certificate of another key."""
    _replace(directory / (NODE_CERT + NEXT), cert)
    _replace(directory / (NODE_KEY + NEXT), key)
    (directory / (NODE_KEY + NEXT)).replace(directory / NODE_KEY)
    (directory / (NODE_CERT + NEXT)).replace(directory / NODE_CERT)


def _finish_pair(directory: Path) -> None:
    """Finish or drop an `install_node_pair` a crash interrupted."""
    key_next, cert_next = directory / (NODE_KEY + NEXT), directory / (NODE_CERT + NEXT)
    if cert_next.exists() and not key_next.exists():  # the key was renamed: finish
        cert_next.replace(directory / NODE_CERT)
    else:  # nothing renamed yet (or nothing to do): the old pair stands
        cert_next.unlink(missing_ok=True)
        key_next.unlink(missing_ok=True)


def replace_bundle(directory: Path, bundle_pem: bytes) -> None:
    """Replace `ca.crt` (whole or not at all)."""
    _replace(directory / CA_CERT, bundle_pem)


def replace_file(path: Path, data: bytes) -> None:
    """Replace a file of `tls/` (0600, whole or not at all)."""
    _replace(path, data)


def read_node_tls(directory: Path) -> NodeTls:
    """The material in `directory` as it is now (OSError if a file is missing)."""
    ca_key_path = directory / CA_KEY
    return NodeTls(directory, (directory / CA_CERT).read_bytes(), (directory / NODE_CERT).read_bytes(),
                   (directory / NODE_KEY).read_bytes(), ca_key_path.read_bytes() if ca_key_path.exists() else None)


def ensure_node_tls(directory: Path, node_id: str, hosts: Iterable[str], *, may_create_ca: bool) -> NodeTls:
    """Load, and create what is missing of, the node's TLS material in `directory`.

    No CA there: a new one is generated if `may_create_ca` (a node bootstrapping a
    cluster), else TlsSetupError. The node certificate is (re)issued when missing, about
    to expire, or not naming every host, if the CA key is present; otherwise the existing
    one is used as it is (TlsSetupError if there is none)."""
    hosts = list(hosts)
    private_dir(directory)
    for p in directory.iterdir():
        tighten(p)
    _finish_pair(directory)
    ca_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    if not ca_path.exists():
        if not may_create_ca:
            raise TlsSetupError(f"no cluster CA in {directory}")
        cert, key = generate_ca()
        install_ca(directory, cert, key)
    ca_cert = ca_path.read_bytes()
    ca_key = ca_key_path.read_bytes() if ca_key_path.exists() else None
    cert_path, key_path = directory / NODE_CERT, directory / NODE_KEY
    have = cert_path.read_bytes() if cert_path.exists() and key_path.exists() else None
    if have is None or not _covers(have, ca_cert, node_id, hosts):
        if ca_key is None:
            if have is None:
                raise TlsSetupError(f"no certificate for node {node_id} in {directory} and no CA key "
                                    "to issue one")
        else:
            signer = key_certificate(ca_cert, ca_key)
            if signer is None:
                raise TlsSetupError(f"{directory / CA_KEY} is the key of none of the CA certificates in "
                                    f"{ca_path}")
            cert, key = issue_node_cert(signer, ca_key, node_id, hosts)
            install_node_pair(directory, cert, key)
    return NodeTls(directory, ca_cert, cert_path.read_bytes(), key_path.read_bytes(), ca_key)
