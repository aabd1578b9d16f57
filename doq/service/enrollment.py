"""The CA's side of join tokens (`doq.tls.enrollment` has the token's format and the
whole flow): creating tokens and enrolling nodes, on a secure node that holds the
cluster CA key (docs/security.md, "Join tokens").

Both are the leader's (they propose Raft commands; a follower forwards `POST
/cluster/enroll` to the leader), and both need the CA key: a leader without `ca.key`
(after a failover to a member that enrolled) refuses them with 409 `NO_CA_KEY`, naming
what to do (move leadership to a member that holds it).

An enrollment is checked in this order, and proposes nothing until every check passed:
the inputs (node id, addresses, CSR and its names), the token's CA, the token against the
committed table in memory (id known, hash right, not expired), the node id not a member
already. Then it spends the token (`UseJoinToken`), adds the member, signs the CSR for
exactly that node id, and audits the member add (`doq.audit`, key `jointoken:<id>`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from doq.auth import audit
from doq.errors import AlreadyExists, DoqError, FailedPrecondition, InvalidArgument
from doq.node import member_input
from doq.node.base import Node
from doq.node.cluster import ClusterAdmin, MemberAddrs
from doq.node.cluster_wire import status_to_json
from doq.queues.commands import CreateJoinToken, UseJoinToken
from doq.queues.join_tokens import TokenRecord, accepts
from doq.tls import rotation
from doq.tls.certs import (
    CsrError,
    NodeTls,
    bundle_certs,
    csr_hosts,
    fingerprint,
    key_certificate,
    pem_of,
)
from doq.tls.enrollment import (
    DEFAULT_TTL_S,
    MAX_TTL_S,
    JoinToken,
    decode_token,
    encode_token,
    secret_hash,
)
from doq.tls.live import LiveTls
from doq.tls.mode import host_of

Tokens = Callable[[], dict[bytes, TokenRecord]]


def _raise_result(result: object) -> None:
    if isinstance(result, DoqError):
        raise result


def _invalid_token() -> FailedPrecondition:
    return FailedPrecondition("the join token is unknown, used, expired or wrong", reason="INVALID_JOIN_TOKEN")


class Enrollment:
    """The server side, on a secure node: creating tokens and enrolling nodes. `tokens`
    is the committed join-token table (`StateStore.join_tokens`)."""

    def __init__(self, node: Node, tls: NodeTls | LiveTls, tokens: Tokens) -> None:
        self.node = node
        self._tls = tls  # a LiveTls: the material current at each call (a CA rotation changes it)
        self.tokens = tokens

    @property
    def tls(self) -> NodeTls:
        return self._tls.current if isinstance(self._tls, LiveTls) else self._tls

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the CA this node signs with (the bundle's first without a
        CA key): what a token pins."""
        tls = self.tls
        signer = key_certificate(tls.ca_cert, tls.ca_key) if tls.ca_key is not None else None
        return fingerprint(signer or tls.ca_cert)

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """The fingerprints of every CA this node trusts, the signing one first: what a
        new token names (two during a CA rotation, so it enrolls before and after the
        new CA starts signing)."""
        signing = self.fingerprint
        trusted = [fingerprint(pem_of(c)) for c in bundle_certs(self.tls.ca_cert)]
        return (signing, *[f for f in dict.fromkeys(trusted) if f != signing])

    @property
    def ca_cert(self) -> bytes:
        return self.tls.ca_cert

    def _ca_key(self) -> bytes:
        if self.tls.ca_key is None:
            raise FailedPrecondition(
                f"this node ({self.node.node_id}) does not hold the cluster CA key (tls/ca.key), so it "
                "cannot create join tokens or sign certificates: move leadership to the member that "
                "holds it (POST /cluster/transfer-leader {\"target\": ID}; usually the node that "
                "bootstrapped the cluster)", reason="NO_CA_KEY")
        return self.tls.ca_key

    async def create_token(self, ttl_s: int = DEFAULT_TTL_S) -> str:
        """A new one-time token valid `ttl_s` seconds (proposed through Raft: the caller
        must be the leader)."""
        if not 1 <= ttl_s <= MAX_TTL_S:
            raise InvalidArgument(f"ttl_s must be 1..{MAX_TTL_S}", reason="INVALID_TTL")
        self._ca_key()
        token_id, secret = os.urandom(16), os.urandom(32)
        expires_ms = int(time.time() * 1000) + ttl_s * 1000
        fps = self.fingerprints
        _raise_result(await self.node.propose(CreateJoinToken(token_id, secret_hash(fps, secret), expires_ms)))
        admin = self.node.cluster_admin()
        addrs = [m.addrs.http_addr for m in admin.cluster_status().members] if admin else []
        return encode_token(JoinToken([a for a in addrs if a], fps, token_id, secret, expires_ms))

    def _check(self, t: JoinToken, node_id: str, addrs: MemberAddrs, csr: bytes,
               admin: ClusterAdmin) -> list[str]:
        """Every check that needs no Raft (module docstring); returns the hosts to sign."""
        if self.fingerprint not in t.ca_fingerprints:
            raise FailedPrecondition("the join token is of another cluster, or of a CA this cluster no longer "
                                     "signs with (a token made before a CA rotation's begin cannot enroll after "
                                     "its reissue): create a new one", reason="INVALID_JOIN_TOKEN")
        now_ms = int(time.time() * 1000)
        if not accepts(self.tokens().get(t.token_id), secret_hash(t.ca_fingerprints, t.secret), now_ms):
            raise _invalid_token()
        try:
            _, asked = csr_hosts(csr)
        except CsrError as e:
            raise InvalidArgument(str(e), reason="INVALID_CSR") from None
        members = {m.node_id for m in admin.cluster_status().members}
        member_input.check_tls_node_id(node_id, members)
        if node_id in members:
            raise AlreadyExists(f"{node_id} is a member already: remove it first (DELETE /cluster/members/"
                                f"{node_id}) to enroll a node under its id", reason="MEMBER_EXISTS")
        hosts = [host_of(a) for a in (addrs.raft_addr, addrs.grpc_addr, addrs.http_addr)]
        folded = {m.casefold() for m in members}  # TLS host names ignore case
        taken = sorted(h for h in (*asked, *hosts) if h.casefold() in folded)  # it could pass for that member
        if taken:
            raise InvalidArgument(f"the enrollment names the host {taken[0]!r}, the id of another member: "
                                  "a certificate naming it would pass for that member", reason="INVALID_CSR")
        return hosts

    async def enroll(self, token: str, node_id: str, addrs: MemberAddrs, csr: bytes, *, empty: bool = False,
                     cluster_id: str = "") -> dict[str, Any]:
        """Spend `token` for `node_id`, add it as a member under its store
        (`addrs.store_id`, `empty`, `cluster_id`: as `ClusterAdmin.add_member`, so the
        conf change admits this store) and sign its CSR; returns the JSON answer
        (`status`, `ca_cert`, `node_cert`). Nothing is proposed unless every check passed
        (module docstring)."""
        member_input.check_node_id(node_id)
        member_input.check_member_addrs(addrs)
        t = decode_token(token)
        admin = self.node.cluster_admin()
        if admin is None:
            raise FailedPrecondition("this node cannot enroll members", reason="NO_CA_KEY")
        self._ca_key()
        hosts = self._check(t, node_id, addrs, csr, admin)
        state_cluster = admin.cluster_status().cluster_id
        if cluster_id and cluster_id != state_cluster:  # refused before the token is spent
            raise FailedPrecondition(f"this is cluster {state_cluster or '(no id)'}, not {cluster_id}: refused",
                                     reason="CLUSTER_MISMATCH")
        try:
            cert = rotation.sign(self.tls, csr, node_id, hosts)
        except rotation.NoCaKey as e:
            raise FailedPrecondition(str(e), reason="NO_CA_KEY") from None
        who = f"jointoken:{t.token_id.hex()}"
        try:
            _raise_result(await self.node.propose(UseJoinToken(t.token_id, secret_hash(t.ca_fingerprints, t.secret),
                                                               node_id)))
            status = await admin.add_member(node_id, addrs, empty=empty, cluster_id=cluster_id)
        except DoqError as e:
            audit.record("member.add", who, node_id, e.reason, self.node.node_id)
            raise
        audit.record("member.add", who, node_id, "ok", self.node.node_id)
        return {"status": status_to_json(status), "ca_cert": self.tls.ca_cert.decode(), "node_cert": cert.decode()}
