"""Renewing node certificates and rotating the cluster CA, one node's files at a time
(docs/security.md, "Rotating certificates"). The network side (which node does what,
in which order) is `doq.service.tls_admin` and `doq tls`; this module changes the files
of one node's `tls/` directory, each change whole or not at all, and refuses (CsrError,
nothing changed) a change that would leave the node unable to prove who it is:

- `begin_ca` (on the CA holder): a new CA; its key waits in `ca-next.key` (it never
  leaves this node), its certificate joins the trust bundle after the current CA (which
  still signs);
- `promote_ca` (on the CA holder): the next CA signs from now on (`ca.key`); the old key
  is gone;
- `set_trust` (on any member): the trust bundle becomes the given CAs; refused if the
  node's own certificate, or a CA key it holds, is of none of them;
- `sign` (on the CA holder): a certificate for a member's CSR from the signing CA;
- `install_renewed` (on any member): a new certificate for the key it made, checked
  against the node's trust bundle, then installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from doq.tls.certs import (
    CA_KEY,
    CA_NEXT_KEY,
    CsrError,
    NodeTls,
    check_trust_bundle,
    fingerprint,
    generate_ca,
    install_node_pair,
    issuer_in,
    join_bundle,
    key_certificate,
    pem_of,
    replace_bundle,
    replace_file,
    sign_csr,
    signing_first,
)
from doq.tls.expiry import key_matches


class NoCaKey(CsrError):
    """This node holds no (next) CA key for the operation."""


class TrustRefused(CsrError):
    """The trust bundle would leave this node's certificate or CA key out."""


def next_ca_key(directory: Path) -> bytes | None:
    p = directory / CA_NEXT_KEY
    return p.read_bytes() if p.exists() else None


def begin_ca(m: NodeTls) -> bytes:
    """Make the next CA here (idempotent: an existing next CA is kept); returns the trust
    bundle, current signing CA first, then the next."""
    if key_certificate(m.ca_cert, m.ca_key) is None:
        raise NoCaKey("this node holds no key of a trusted CA (tls/ca.key), so it cannot start a CA rotation")
    if key_certificate(m.ca_cert, next_ca_key(m.directory)) is not None:
        return m.ca_cert
    cert, key = generate_ca()
    replace_file(m.directory / CA_NEXT_KEY, key)
    bundle = signing_first(join_bundle(m.ca_cert, cert), m.ca_key)
    replace_bundle(m.directory, bundle)
    return bundle


def promote_ca(m: NodeTls) -> bytes:
    """The next CA signs from now on: `ca-next.key` becomes `ca.key` (the old CA key is
    gone); returns the new signing CA's certificate. NoCaKey without a next CA waiting."""
    nxt = next_ca_key(m.directory)
    cert = key_certificate(m.ca_cert, nxt)
    if nxt is None or cert is None:
        raise NoCaKey("no CA rotation is under way on this node (no tls/ca-next.key of a trusted CA): "
                      "start one with `doq tls ca-rotate begin`")
    replace_bundle(m.directory, signing_first(m.ca_cert, nxt))
    replace_file(m.directory / CA_KEY, nxt)
    (m.directory / CA_NEXT_KEY).unlink()
    return cert


def set_trust(m: NodeTls, bundle_pem: bytes) -> bytes:
    """Trust exactly the CAs of `bundle_pem` (signing CA first); returns what was written."""
    cas = check_trust_bundle(bundle_pem)
    bundle = b"".join(pem_of(c) for c in cas)
    if issuer_in(m.node_cert, bundle) is None:
        raise TrustRefused("this node's certificate is signed by none of these CAs: renew it from one of them "
                       "first (doq tls renew; in a CA rotation, `doq tls ca-rotate reissue`)")
    for name, key in ((CA_KEY, m.ca_key), (CA_NEXT_KEY, next_ca_key(m.directory))):
        if key is not None and key_certificate(m.ca_cert, key) is not None and key_certificate(bundle, key) is None:
            raise TrustRefused(f"this node signs with the CA of tls/{name}, which the bundle leaves out: keep it")
    bundle = signing_first(bundle, m.ca_key)
    replace_bundle(m.directory, bundle)
    return bundle


def sign(m: NodeTls, csr_pem: bytes, node_id: str, hosts: Iterable[str]) -> bytes:
    """A certificate for the CSR's key, for `node_id` and `hosts`, from the signing CA."""
    signer = key_certificate(m.ca_cert, m.ca_key)
    if signer is None or m.ca_key is None:
        raise NoCaKey("this node holds no key of a trusted CA (tls/ca.key), so it cannot sign certificates")
    return sign_csr(signer, m.ca_key, csr_pem, node_id, hosts)


def install_renewed(m: NodeTls, cert: bytes, key: bytes) -> str:
    """Install a new certificate and its key (made here: `certs.make_csr`) once they check
    out: a certificate of a CA this node trusts, for this key. Returns the issuing CA's
    fingerprint. CsrError (nothing installed) otherwise."""
    issuer = issuer_in(cert, m.ca_cert)
    if issuer is None:
        raise CsrError("the new certificate is signed by a CA this node does not trust yet: give it the trust "
                       "bundle first (`doq tls ca-rotate begin` does, for every member)")
    if not key_matches(cert, key):
        raise CsrError("the signer answered a certificate of another key")
    install_node_pair(m.directory, cert, key)
    return fingerprint(pem_of(issuer))
