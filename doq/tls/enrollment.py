"""Join tokens: how a new node enrolls in a secure cluster (docs/security.md, "Join tokens").

Like Elasticsearch's enrollment tokens. `doq join-token create` asks a member for a token:

    doqjt1.<base64url of {"v":2, "addrs":[members' HTTP addresses], "fps": [CA fingerprints],
                         "id": token id (hex), "secret": secret (base64url), "exp": expiry ms}>

`fps` are the fingerprints of every CA the creating node trusted (its trust bundle, the
signing CA first): one CA, or two during a CA rotation, so a token made after `ca-rotate
begin` enrolls whichever of them signs when it is used (before or after `reissue`). A
token of the first format (`"v":1`, one fingerprint `"fp"`) still loads, as `fps` of one.

The leader stores only `secret_hash(fps, secret)` (SHA-256 over the fingerprints and the
secret: a token is bound to its CAs; for one CA the same hash as the first format's) in
the replicated state (`CreateJoinToken`, beside the client keys, never in a backup),
usable once until it expires; it enrolls with a token only while it signs with one of the
token's CAs. A new node started with `--join ADDR --join-token TOKEN`:

1. fetches the cluster CA certificates (`GET /cluster/ca`, over TLS not yet verified) and
   trusts only those whose SHA-256 fingerprint is one of the token's: a man in the middle
   cannot substitute another CA;
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
from collections.abc import Sequence
from dataclasses import dataclass

from doq.errors import InvalidArgument

PREFIX = "doqjt1."
DEFAULT_TTL_S = 3600
MAX_TTL_S = 7 * 24 * 3600


MAX_FINGERPRINTS = 8  # CAs one token may name (a rotation's bundle holds two)
_HEX = set("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class JoinToken:
    addrs: list[str]
    ca_fingerprints: tuple[str, ...]  # the CAs trusted at its creation, the signing one first
    token_id: bytes
    secret: bytes
    expires_ms: int


def secret_hash(ca_fingerprints: Sequence[str] | str, secret: bytes) -> bytes:
    """What the replicated state keeps of a token's secret: SHA-256 over the CAs'
    fingerprints (hex, as in the token, in its order) and the secret, so a token of some
    CAs is worth nothing against others (a 256-bit secret needs no salt or slow hash). For
    one CA it is the hash tokens of the first format were stored under."""
    fps = ca_fingerprints if isinstance(ca_fingerprints, str) else ",".join(ca_fingerprints)
    return hashlib.sha256(b"doq-join-token\0" + fps.encode() + b"\0" + secret).digest()


def encode_token(t: JoinToken) -> str:
    doc = {"v": 2, "addrs": t.addrs, "fps": list(t.ca_fingerprints), "id": t.token_id.hex(),
           "secret": base64.urlsafe_b64encode(t.secret).decode().rstrip("="), "exp": t.expires_ms}
    return PREFIX + base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_token(text: str) -> JoinToken:
    """Raises InvalidArgument (INVALID_JOIN_TOKEN) for anything but a token of this format
    (either version)."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"not a doq join token: {why}", reason="INVALID_JOIN_TOKEN")

    text = text.strip()
    if not text.startswith(PREFIX):
        raise bad(f"it does not start with {PREFIX}")
    body = text[len(PREFIX):]
    try:
        doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        version = doc.get("v")
        secret = base64.urlsafe_b64decode(doc["secret"] + "=" * (-len(doc["secret"]) % 4))
        fps = (str(doc["fp"]),) if version == 1 else tuple(str(f) for f in doc["fps"])
        t = JoinToken([str(a) for a in doc["addrs"]], fps, bytes.fromhex(doc["id"]), secret, int(doc["exp"]))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
        raise bad(type(e).__name__) from None
    if (version not in (1, 2) or len(t.token_id) != 16 or len(t.secret) != 32
            or not 1 <= len(fps) <= MAX_FINGERPRINTS or len(set(fps)) != len(fps)
            or not all(len(f) == 64 and set(f) <= _HEX for f in fps)):
        raise bad("unknown version or malformed fields")
    return t
