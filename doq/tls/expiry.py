"""What a node's certificates are and when they expire (no secret: certificates are
public), for `GET /cluster/tls`, `doq tls status`, the metric
`doq_tls_certificate_expiry_timestamp_seconds` and the warnings ahead of expiry
(docs/security.md, "Knowing when certificates expire")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from doq.tls.certs import NodeTls, bundle_certs, fingerprint, issuer_in, key_certificate, pem_of

WARN_NODE_DAYS = 30  # as certs.RENEW_DAYS: a CA holder reissues its own at start from then on
WARN_CA_DAYS = 90
DAY_S = 86400


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Is `key_pem` the private key of `cert_pem`'s public key?"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt))


def _cn(name: x509.Name) -> str:
    got = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(got[0].value) if got else ""


@dataclass(frozen=True, slots=True)
class CertInfo:
    fingerprint: str  # SHA-256 of the DER form, hex
    subject: str  # common name
    not_after_s: int  # expiry, seconds since the epoch
    serial: int
    pem: str  # the certificate (public)

    def to_json(self, now_s: float, *, with_pem: bool = False) -> dict[str, Any]:
        doc = {"fingerprint": self.fingerprint, "subject": self.subject, "not_after_s": self.not_after_s,
               "days_left": int((self.not_after_s - now_s) // DAY_S), "serial": format(self.serial, "x")}
        return {**doc, "pem": self.pem} if with_pem else doc


def cert_info(cert: x509.Certificate) -> CertInfo:
    pem = pem_of(cert)
    return CertInfo(fingerprint(pem), _cn(cert.subject), int(cert.not_valid_after_utc.timestamp()),
                    cert.serial_number, pem.decode())


@dataclass(frozen=True, slots=True)
class TlsReport:
    """A node's certificate, its issuer, the CAs it trusts, and the CA it signs with."""

    node: CertInfo
    issuer: str  # fingerprint of the trusted CA that signed the node certificate ("" none)
    trusted: list[CertInfo]
    signing: str  # fingerprint of the CA this node signs with ("": it holds no CA key)
    next_ca: str  # fingerprint of a rotation's next CA waiting here ("": none)

    def to_json(self, now_s: float) -> dict[str, Any]:
        return {"node_cert": {**self.node.to_json(now_s), "issuer": self.issuer},
                "trusted_cas": [c.to_json(now_s, with_pem=True) for c in self.trusted],
                "signing_ca": self.signing, "next_ca": self.next_ca}

    def warnings(self, now_s: float) -> list[str]:
        """What expires soon: the node certificate within WARN_NODE_DAYS, a trusted CA
        within WARN_CA_DAYS (already expired included)."""
        out = []
        days = (self.node.not_after_s - now_s) / DAY_S
        if days < WARN_NODE_DAYS:
            out.append(f"the node certificate expires in {days:.1f} days: renew it (doq tls renew)")
        for ca in self.trusted:
            days = (ca.not_after_s - now_s) / DAY_S
            if days < WARN_CA_DAYS:
                out.append(f"the cluster CA {ca.fingerprint[:16]}... expires in {days:.1f} days: rotate it "
                           "(doq tls ca-rotate)")
        return out


def report(m: NodeTls, next_ca_key: bytes | None = None) -> TlsReport:
    node = x509.load_pem_x509_certificate(m.node_cert)
    issuer = issuer_in(m.node_cert, m.ca_cert)
    signing = key_certificate(m.ca_cert, m.ca_key)
    nxt = key_certificate(m.ca_cert, next_ca_key)
    return TlsReport(cert_info(node), fingerprint(pem_of(issuer)) if issuer else "",
                     [cert_info(c) for c in bundle_certs(m.ca_cert)],
                     fingerprint(signing) if signing else "", fingerprint(nxt) if nxt else "")
