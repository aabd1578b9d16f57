"""The joining node's side of join tokens (`doq.tls.enrollment` has the token's format and
the whole flow): fetch the cluster CA pinned by the token, then `POST /cluster/enroll`
with a certificate signing request for a key made here (the key never leaves the node).
A join address given as `http://` is refused unless it is loopback: the token would
travel in clear.
Blocking (urllib): a starting node runs it in a thread. A client of the cluster's HTTP
API, beside `doq.cluster_client`; the node's own code never imports it."""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from doq.cluster_client import ClusterError, request_json, status_from_json
from doq.node.cluster import ClusterStatus, MemberAddrs
from doq.tls.certs import bundle_certs, fingerprint, make_csr, pem_of
from doq.tls.enrollment import decode_token
from doq.tls.mode import is_loopback


class EnrollError(Exception):
    """Enrollment failed: a message for the operator."""


def fetch_ca(addr: str, want_fingerprints: Sequence[str], timeout_s: float = 10.0) -> bytes:
    """The cluster CA certificates from `addr` (HOST:PORT or https URL) whose fingerprints
    are among `want_fingerprints` (`GET /cluster/ca` answers the trust bundle: those of its
    certificates, at least one)."""
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
        pinned = pinned_ca(pem, want_fingerprints)
    except ValueError:
        raise EnrollError(f"{url} did not answer a certificate") from None
    if pinned is None:
        pins = ", ".join(f[:16] + "..." for f in want_fingerprints)
        raise EnrollError(f"the CA certificate of {url} is not the join token's (fingerprint "
                          f"{fingerprint(pem)[:16]}..., the token pins {pins}): refusing to join")
    return pinned


def pinned_ca(bundle_pem: bytes, want_fingerprints: Sequence[str]) -> bytes | None:
    """The certificates of the bundle whose fingerprints are among `want_fingerprints`, as
    one PEM bundle (None: none). Only those are trusted until the enrollment answers, over
    HTTPS verified with them (a bundle of a CA rotation holds two; a certificate the token
    does not name is not trusted)."""
    pins = set(want_fingerprints)
    pinned = [pem_of(c) for c in bundle_certs(bundle_pem) if fingerprint(pem_of(c)) in pins]
    return b"".join(pinned) or None


@dataclass(frozen=True, slots=True)
class Enrolled:
    """What an enrollment gives a node: the cluster's status after the add, the CA
    certificate, the node's certificate and the key it made for it (PEM)."""

    status: ClusterStatus
    ca_cert: bytes
    node_cert: bytes
    node_key: bytes


def check_join_addrs(join_addrs: list[str]) -> None:
    """Refuse (EnrollError) an explicit `http://` join address that is not loopback: a join
    token sent there would cross the network in clear."""
    for addr in join_addrs:
        scheme, sep, rest = addr.strip().partition("://")
        if sep and scheme.lower() == "http":
            host = rest.split("/", 1)[0].rpartition(":")[0] or rest.split("/", 1)[0]
            if not is_loopback(host.strip("[]")):
                raise EnrollError(f"--join {addr}: a join token is never sent over plain http (it would cross "
                                  "the network in clear); give the member's address as HOST:PORT or https://")


def enroll(token: str, join_addrs: list[str], node_id: str, addrs: MemberAddrs, *, empty: bool = False,
           cluster_id: str = "", hosts: list[str] | None = None, timeout_s: float = 60.0) -> Enrolled:
    """Enroll this node with `token` through the first reachable address (`join_addrs`,
    then the token's). The request names this node's store (`addrs.store_id`), whether it
    is `empty`, and the `cluster_id` it means to join ("" : any), as
    `doq.cluster_client.join_cluster` does, and carries a CSR for a new key naming
    `node_id` and `hosts` (the hosts it listens on and announces). Raises EnrollError."""
    t = decode_token(token)
    check_join_addrs(join_addrs)
    csr, node_key = make_csr(node_id, hosts or [])
    last = "no address to join through"
    deadline = time.monotonic() + timeout_s
    while True:
        for addr in [*join_addrs, *t.addrs]:
            try:
                ca = fetch_ca(addr, t.ca_fingerprints)
                ctx = ssl.create_default_context(cadata=ca.decode())
                body: dict[str, Any] = {"token": token, "node_id": node_id, "raft_addr": addrs.raft_addr,
                                        "grpc_addr": addrs.grpc_addr, "http_addr": addrs.http_addr}
                if addrs.store_id:
                    body["store_id"] = addrs.store_id
                if empty:
                    body["empty"] = True
                if cluster_id:
                    body["cluster_id"] = cluster_id
                body["csr"] = csr.decode()
                answer = request_json(_url(addr), "POST", "/cluster/enroll", body, timeout_s=30, ssl_context=ctx)
                doc = answer.body
                status = status_from_json(doc["status"])
                if cluster_id and status.cluster_id != cluster_id:
                    raise EnrollError(f"{addr} answered for cluster {status.cluster_id}, not {cluster_id}: "
                                      "refusing to join")
                node_cert = doc["node_cert"].encode()
                if pinned_ca(doc["ca_cert"].encode(), t.ca_fingerprints) is None:
                    raise EnrollError(f"{addr} answered another CA than the token's: refusing to join")
                return Enrolled(status, doc["ca_cert"].encode(), node_cert, node_key)
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
