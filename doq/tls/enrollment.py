"""Join tokens: how a new node enrolls in a secure cluster (docs/security.md, "Join tokens").

Like Elasticsearch's enrollment tokens. `doq join-token create` asks a member for a token:

    doqjt1.<base64url of {"v":1, "addrs":[members' HTTP addresses], "fp": CA fingerprint,
                         "id": token id (hex), "secret": secret (base64url), "exp": expiry ms}>

The leader stores only the secret's SHA-256 in the replicated state (`CreateJoinToken`),
usable once until it expires. A new node started with `--join ADDR --join-token TOKEN`:

1. fetches the cluster CA certificate (`GET /cluster/ca`, over TLS not yet verified) and
   accepts it only if its SHA-256 fingerprint is the token's: a man in the middle cannot
   substitute another CA;
2. over HTTPS verified with that CA, `POST /cluster/enroll {token, node_id, addresses}`:
   the leader spends the token (`UseJoinToken`, through Raft: once, cluster-wide), adds
   the node as a member and answers the cluster's status with the CA certificate and
   key, from which the node issues its own certificate (as Elasticsearch's enrollment
   hands the CA to a new node);
3. starts as a joined member with mutual TLS.

A node without a valid token (or the CA files copied by hand) cannot join.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from doq.errors import DoqError, FailedPrecondition, InvalidArgument
from doq.node import member_input
from doq.node.base import Node
from doq.node.cluster import ClusterStatus, MemberAddrs
from doq.queues.commands import CreateJoinToken, UseJoinToken
from doq.tls.certs import NodeTls, fingerprint

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


def secret_hash(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


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


def _raise_result(result: object) -> None:
    if isinstance(result, DoqError):
        raise result


class Enrollment:
    """The server side, on a secure node: creating tokens and enrolling nodes."""

    def __init__(self, node: Node, tls: NodeTls) -> None:
        self.node = node
        self.tls = tls

    @property
    def ca_cert(self) -> bytes:
        return self.tls.ca_cert

    async def create_token(self, ttl_s: int = DEFAULT_TTL_S) -> str:
        """A new one-time token valid `ttl_s` seconds (proposed through Raft: the caller
        must be the leader)."""
        if not 1 <= ttl_s <= MAX_TTL_S:
            raise InvalidArgument(f"ttl_s must be 1..{MAX_TTL_S}", reason="INVALID_TTL")
        if self.tls.ca_key is None:
            raise FailedPrecondition("this node does not hold the cluster CA key: create the token on "
                                     "the node that bootstrapped the cluster", reason="NO_CA_KEY")
        token_id, secret = os.urandom(16), os.urandom(32)
        expires_ms = int(time.time() * 1000) + ttl_s * 1000
        _raise_result(await self.node.propose(CreateJoinToken(token_id, secret_hash(secret), expires_ms)))
        admin = self.node.cluster_admin()
        addrs = [m.addrs.http_addr for m in admin.cluster_status().members] if admin else []
        return encode_token(JoinToken([a for a in addrs if a], fingerprint(self.tls.ca_cert), token_id, secret,
                                      expires_ms))

    async def enroll(self, token: str, node_id: str, addrs: MemberAddrs) -> dict[str, Any]:
        """Spend `token` for `node_id` and add it as a member; returns the JSON answer
        (`status`, `ca_cert`, `ca_key`). The inputs are checked before the token is spent."""
        member_input.check_node_id(node_id)
        member_input.check_member_addrs(addrs)
        t = decode_token(token)
        admin = self.node.cluster_admin()
        if admin is None or self.tls.ca_key is None:
            raise FailedPrecondition("this node cannot enroll members", reason="NO_CA_KEY")
        if t.ca_fingerprint != fingerprint(self.tls.ca_cert):
            raise FailedPrecondition("the join token is of another cluster", reason="INVALID_JOIN_TOKEN")
        _raise_result(await self.node.propose(UseJoinToken(t.token_id, secret_hash(t.secret), node_id)))
        from doq.cluster_client import status_to_json

        status = await admin.add_member(node_id, addrs)
        return {"status": status_to_json(status), "ca_cert": self.tls.ca_cert.decode(),
                "ca_key": self.tls.ca_key.decode()}


# -- the joining side ------------------------------------------------------------------

class EnrollError(Exception):
    """Enrollment failed: a message for the operator."""


def fetch_ca(addr: str, want_fingerprint: str, timeout_s: float = 10.0) -> bytes:
    """The cluster CA certificate from `addr` (HOST:PORT or https URL), accepted only if
    its fingerprint is `want_fingerprint`."""
    url = _url(addr) + "/cluster/ca"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # not trusted yet: the fingerprint decides
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=ctx) as r:
            pem = r.read()
    except (OSError, ValueError) as e:
        raise EnrollError(f"cannot fetch the cluster CA from {url}: {getattr(e, 'reason', e)}") from None
    try:
        got = fingerprint(pem)
    except ValueError:
        raise EnrollError(f"{url} did not answer a certificate") from None
    if got != want_fingerprint:
        raise EnrollError(f"the CA certificate of {url} is not the join token's (fingerprint {got[:16]}..., "
                          f"the token pins {want_fingerprint[:16]}...): refusing to join")
    return pem


def enroll(token: str, join_addrs: list[str], node_id: str, addrs: MemberAddrs,
           timeout_s: float = 60.0) -> tuple[ClusterStatus, bytes, bytes]:
    """Enroll this node with `token` through the first reachable address (`join_addrs`,
    then the token's): (cluster status, CA certificate, CA key). Raises EnrollError."""
    from doq.cluster_client import ClusterError, request_json, status_from_json

    t = decode_token(token)
    last = "no address to join through"
    deadline = time.monotonic() + timeout_s
    while True:
        for addr in [*join_addrs, *t.addrs]:
            try:
                ca = fetch_ca(addr, t.ca_fingerprint)
                ctx = ssl.create_default_context(cadata=ca.decode())
                body = {"token": token, "node_id": node_id, "raft_addr": addrs.raft_addr,
                        "grpc_addr": addrs.grpc_addr, "http_addr": addrs.http_addr}
                answer = request_json(_url(addr), "POST", "/cluster/enroll", body, timeout_s=30, ssl_context=ctx)
                doc = answer.body
                return status_from_json(doc["status"]), doc["ca_cert"].encode(), doc["ca_key"].encode()
            except ClusterError as e:
                if not e.retryable:
                    raise EnrollError(f"enrollment through {addr} refused: {e}") from None
                last = str(e)
            except EnrollError as e:
                if "refusing" in str(e):
                    raise
                last = str(e)
            except (KeyError, TypeError, ValueError) as e:
                raise EnrollError(f"{addr}: not an enrollment answer ({e!r})") from None
        if time.monotonic() > deadline:
            raise EnrollError(f"could not enroll in {timeout_s:g}s: {last}")
        time.sleep(0.5)


def _url(addr: str) -> str:
    addr = addr.strip().rstrip("/")
    return addr if "://" in addr else f"https://{addr}"
