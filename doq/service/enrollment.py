"""The leader's side of join tokens (`doq.tls.enrollment` has the token's format and the
whole flow): creating tokens and enrolling nodes, on a secure node."""

from __future__ import annotations

import os
import time
from typing import Any

from doq.errors import DoqError, FailedPrecondition, InvalidArgument
from doq.node import member_input
from doq.node.base import Node
from doq.node.cluster import MemberAddrs
from doq.node.cluster_wire import status_to_json
from doq.queues.commands import CreateJoinToken, UseJoinToken
from doq.tls.certs import NodeTls, fingerprint
from doq.tls.enrollment import (
    DEFAULT_TTL_S,
    MAX_TTL_S,
    JoinToken,
    decode_token,
    encode_token,
    secret_hash,
)


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

    async def enroll(self, token: str, node_id: str, addrs: MemberAddrs, *, empty: bool = False,
                     cluster_id: str = "") -> dict[str, Any]:
        """Spend `token` for `node_id` and add it as a member under its store
        (`addrs.store_id`, `empty`, `cluster_id`: as `ClusterAdmin.add_member`, so the
        conf change admits this store); returns the JSON answer (`status`, `ca_cert`,
        `ca_key`). The inputs are checked before the token is spent."""
        member_input.check_node_id(node_id)
        member_input.check_member_addrs(addrs)
        t = decode_token(token)
        admin = self.node.cluster_admin()
        if admin is None or self.tls.ca_key is None:
            raise FailedPrecondition("this node cannot enroll members", reason="NO_CA_KEY")
        if t.ca_fingerprint != fingerprint(self.tls.ca_cert):
            raise FailedPrecondition("the join token is of another cluster", reason="INVALID_JOIN_TOKEN")
        state_cluster = admin.cluster_status().cluster_id
        if cluster_id and cluster_id != state_cluster:  # refused before the token is spent
            raise FailedPrecondition(f"this is cluster {state_cluster or '(no id)'}, not {cluster_id}: refused",
                                     reason="CLUSTER_MISMATCH")
        _raise_result(await self.node.propose(UseJoinToken(t.token_id, secret_hash(t.secret), node_id)))
        status = await admin.add_member(node_id, addrs, empty=empty, cluster_id=cluster_id)
        return {"status": status_to_json(status), "ca_cert": self.tls.ca_cert.decode(),
                "ca_key": self.tls.ca_key.decode()}
