"""Join tokens: how a new node enrolls in a secure cluster (docs/security.md, "Join tokens").

Like Elasticsearch's enrollment tokens. `doq join-token create` asks a member for a token:

    doqjt1.<base64url of {"v":1, "addrs":[members' HTTP addresses], "fp": CA fingerprint,
                         "id": token id (hex), "secret": secret (base64url), "exp": expiry ms}>

The leader stores only `secret_hash(fingerprint, secret)` (SHA-256 over the CA fingerprint
and the secret: a token is bound to its CA) in the replicated state (`CreateJoinToken`,
beside the client keys, never in a backup), usable once until it expires. A new node
started with `--join ADDR --join-token TOKEN`:

1. fetches the cluster CA certificate (`GET /cluster/ca`, over TLS not yet verified) and
   accepts it only if its SHA-256 fingerprint is the token's: a man in the middle cannot
   substitute another CA;
2. makes its own key and a certificate signing request (`doq.tls.certs.make_csr`);
3. over HTTPS verified with that CA, `POST /cluster/enroll {token, node_id, addresses,
   store_id, empty, cluster_id, csr}` (any member: a follower forwards it to the leader).
   The leader, if it holds the CA key, checks the token against the committed table in
   memory (nothing is proposed for an unknown, wrong, expired or used token) and the CSR,
   spends the token (`UseJoinToken`, through Raft: once, cluster-wide), adds the node as a
   member under its store id exactly as `POST /cluster/join` does (so the conf change
   admits this store and the node may vote once it holds it: `doq.node.store_identity`)
   and answers the cluster's status, the CA certificate and the node's certificate, signed
   for exactly `node_id` (common name and SAN). The CA key never leaves its node;
4. starts as a joined member with mutual TLS.

A node without a valid token (or the CA files copied by hand) cannot join.

This module is the token's format (pure). The leader's side is `doq.service.enrollment`,
the joining node's `doq.enrollment_client` (run by `doq.server_tls` at start).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

from doq.errors import InvalidArgument

PREFIX = "doqjt1."
DEFAULT_TTL_S = 3600
MAX_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class JoinToken:
    addrs: list[str]
    ca_fingerprint: str
    token_id: bytes
    secret: bytes
    expires_ms: int


def secret_hash(ca_fingerprint: str, secret: bytes) -> bytes:
    """What the replicated state keeps of a token's secret: SHA-256 over the CA's
    fingerprint (hex, as in the token) and the secret, so a token of one CA is worth
    nothing against another (a 256-bit secret needs no salt or slow hash)."""
    return hashlib.sha256(b"doq-join-token\0" + ca_fingerprint.encode() + b"\0" + secret).digest()


def encode_token(t: JoinToken) -> str:
    doc = {"v": 1, "addrs": t.addrs, "fp": t.ca_fingerprint, "id": t.token_id.hex(),
           "secret": base64.urlsafe_b64encode(t.secret).decode().rstrip("="), "exp": t.expires_ms}
    return PREFIX + base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_token(text: str) -> JoinToken:
    """Raises InvalidArgument (INVALID_JOIN_TOKEN) for anything but a token of this format."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"not a doq join token: {why}", reason="INVALID_JOIN_TOKEN")

    text = text.strip()
    if not text.startswith(PREFIX):
        raise bad(f"it does not start with {PREFIX}")
    body = text[len(PREFIX):]
    try:
        doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        secret = base64.urlsafe_b64decode(doc["secret"] + "=" * (-len(doc["secret"]) % 4))
        t = JoinToken([str(a) for a in doc["addrs"]], str(doc["fp"]), bytes.fromhex(doc["id"]), secret,
                      int(doc["exp"]))
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise bad(type(e).__name__) from None
    if doc.get("v") != 1 or len(t.token_id) != 16 or len(t.secret) != 32 or len(t.ca_fingerprint) != 64:
        raise bad("unknown version or malformed fields")
    return t
