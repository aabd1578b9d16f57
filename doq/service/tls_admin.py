"""A secure node's certificate operations (docs/security.md, "Rotating certificates"),
behind the admin routes of `doq.service.http.tls_routes` and the `doq tls` commands:

- `status`: this node's certificate, its issuer, the CAs it trusts, its signing CA and
  the warnings ahead of expiry;
- `renew`: a new key made here and a certificate for it, signed by the member `signer`
  names (default: this node if it holds the signing CA key, else the leader) through
  `POST /cluster/tls/sign` with the caller's admin key, over HTTPS verified with this
  node's trust bundle; served from the next handshake on, no restart (`doq.tls.live`);
- `sign` (a member holding the CA key; no leadership needed): a certificate for a
  current member's CSR, for exactly that node id and the hosts of its member addresses
  (and the names it asks for, none of them another member's id);
- `set_trust`, `begin_ca`, `promote_ca`, `reload`: this node's trust bundle and CA
  rotation steps (`doq.tls.rotation`);
- `follow_secret` (a pod started with `--tls-secret-dir`): a Kubernetes Secret updated in
  place is taken without a restart.

Operations on one node run one at a time. The expiry of every certificate is exported as
`doq_tls_certificate_expiry_timestamp_seconds{cert,fingerprint}` and a warning is logged
at start, after every change and every `WARN_EVERY_S` while something expires soon
(`doq.tls.expiry`). Nothing here logs, counts or answers a private key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import Gauge

from doq.errors import DoqError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from doq.node.base import Node
from doq.tls import rotation
from doq.tls.certs import CsrError, NodeTls, TlsSetupError, csr_hosts, key_certificate, make_csr
from doq.tls.creds import ssl_client_context
from doq.tls.expiry import report
from doq.tls.live import LiveTls
from doq.tls.mode import host_of
from doq.tls.secret_dir import SecretMaterial, check_material, install, read_secret

log = logging.getLogger("doq.tls")

TLS_EXPIRY = Gauge("doq_tls_certificate_expiry_timestamp_seconds",
                   "When a certificate of this node expires (seconds since the epoch): cert=node (its own) "
                   "or ca (each CA it trusts)", ["cert", "fingerprint"])
WARN_EVERY_S = 6 * 3600
SIGN_TIMEOUT_S = 30.0


class TlsAdmin:
    """See the module docstring. `hosts`: the hosts this node listens on and announces
    (SANs of its certificate)."""

    def __init__(self, node: Node, live: LiveTls, hosts: list[str],
                 clock_s: Callable[[], float] = time.time) -> None:
        self.node = node
        self.live = live
        self.hosts = hosts
        self._clock_s = clock_s
        self._lock = asyncio.Lock()
        live.subscribe(lambda _m: self.publish())

    # -- what there is -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        m = self.live.current
        now = self._clock_s()
        r = report(m, rotation.next_ca_key(m.directory))
        return {"node_id": self.node.node_id, **r.to_json(now), "warnings": r.warnings(now)}

    def publish(self) -> list[str]:
        """Set the expiry gauges and log a warning per certificate that expires soon;
        returns the warnings."""
        m = self.live.current
        now = self._clock_s()
        r = report(m, rotation.next_ca_key(m.directory))
        TLS_EXPIRY.clear()
        TLS_EXPIRY.labels("node", r.node.fingerprint[:16]).set(r.node.not_after_s)
        for ca in r.trusted:
            TLS_EXPIRY.labels("ca", ca.fingerprint[:16]).set(ca.not_after_s)
        warnings = r.warnings(now)
        for w in warnings:
            log.warning("node %s: %s", self.node.node_id, w)
        return warnings

    async def watch(self) -> None:
        """Publish now and every WARN_EVERY_S (a task for the node's lifetime)."""
        while True:
            try:
                self.publish()
            except Exception:
                log.exception("cannot read this node's certificates")
            await asyncio.sleep(WARN_EVERY_S)

    # -- changes -------------------------------------------------------------------------

    def _reload(self) -> NodeTls:
        try:
            return self.live.reload()
        except TlsSetupError as e:  # files an operator left inconsistent: nothing taken
            raise FailedPrecondition(f"the TLS files do not hold together: {e}", reason="TLS_FILES") from None

    async def reload(self) -> dict[str, Any]:
        """Take the files of NODE_DIR/tls (and --tls-cert/--tls-key) as they are now."""
        async with self._lock:
            self._reload()
            return self.status()

    async def follow_secret(self, secret_dir: Path, poll_s: float) -> None:
        """Take the Secret mounted at `secret_dir` (`doq.tls.secret_dir`) each time kubelet
        updates it, checking every `poll_s` (a task for the node's lifetime). A version
        that differs from what the node serves is checked first: one that does not hold
        together (a certificate of no CA in the bundle, a key not its certificate's) or
        cannot be read is logged once and not installed, and the node keeps its material.
        A version that holds together is installed as NODE_DIR/tls and served from the
        next handshake on, as `doq tls reload` would."""
        node_id = self.node.node_id
        seen = ""
        while True:
            try:
                material = await asyncio.to_thread(read_secret, secret_dir, node_id)
            except ValueError as e:
                if seen != "unreadable":
                    log.warning("node %s: %s; keeping the TLS material it has", node_id, e)
                seen = "unreadable"
            else:
                if material.digest != seen:
                    seen = material.digest
                    async with self._lock:
                        await asyncio.to_thread(self._take_secret, material, secret_dir)
            await asyncio.sleep(poll_s)

    def _take_secret(self, material: SecretMaterial, secret_dir: Path) -> None:
        m = self.live.current
        if (material.ca_cert, material.node_cert, material.node_key) == (m.ca_cert, m.node_cert, m.node_key):
            return
        try:
            check_material(material.ca_cert, material.node_cert, material.node_key)
        except TlsSetupError as e:
            log.warning("node %s: the TLS Secret in %s changed but does not hold together (%s); "
                        "keeping the TLS material it has", self.node.node_id, secret_dir, e)
            return
        install(m.directory, material)
        try:
            self.live.reload()
        except TlsSetupError as e:  # e.g. --tls-cert/--tls-key no longer a pair: nothing taken
            log.warning("node %s: the TLS Secret in %s was installed but not taken (%s)",
                        self.node.node_id, secret_dir, e)
            return
        log.info("node %s: took the updated TLS Secret in %s", self.node.node_id, secret_dir)

    async def renew(self, authorization: str, signer: str = "") -> dict[str, Any]:
        """A new key and certificate for this node, served from the next handshake on;
        signed by member `signer` ("": this node if it holds the signing CA key, else the
        leader)."""
        async with self._lock:
            m = self.live.current
            csr, key = make_csr(self.node.node_id, self.hosts)
            if signer == self.node.node_id or (not signer and key_certificate(m.ca_cert, m.ca_key) is not None):
                cert = self._sign_here(m, csr, self.node.node_id)
            else:
                cert = await self._sign_at(signer, m, csr, authorization)
            try:
                rotation.install_renewed(m, cert, key)
            except CsrError as e:
                raise FailedPrecondition(str(e), reason="CERT_NOT_TRUSTED") from None
            self._reload()
            return self.status()

    def _sign_here(self, m: NodeTls, csr: bytes, node_id: str, hosts: list[str] | None = None) -> bytes:
        try:
            return rotation.sign(m, csr, node_id, self.hosts if hosts is None else hosts)
        except rotation.NoCaKey as e:
            raise FailedPrecondition(str(e), reason="NO_CA_KEY") from None
        except CsrError as e:
            raise InvalidArgument(str(e), reason="INVALID_CSR") from None

    async def _sign_at(self, signer: str, m: NodeTls, csr: bytes, authorization: str) -> bytes:
        admin = self.node.cluster_admin()
        status = admin.cluster_status() if admin else None
        target = signer or (status.leader_id if status else "")
        addr = next((mb.addrs.http_addr for mb in status.members if mb.node_id == target), "") if status else ""
        if not target or target == self.node.node_id:
            raise FailedPrecondition(
                f"this node ({self.node.node_id}) holds no CA key and no leader is known to sign its certificate: "
                "name the member that holds tls/ca.key (doq tls renew finds it)", reason="NO_CA_KEY")
        if not addr:
            raise NotFound(f"{target[:64]!r} is not a member with an HTTP address", reason="NOT_MEMBER")
        body = json.dumps({"node_id": self.node.node_id, "csr": csr.decode()}).encode()
        return await asyncio.to_thread(_post_sign, addr, body, authorization, m.ca_cert)

    async def sign(self, node_id: str, csr: bytes) -> bytes:
        """A certificate for member `node_id`'s CSR from this node's signing CA (a member
        as this node's configuration has it)."""
        admin = self.node.cluster_admin()
        members = {mb.node_id: mb for mb in admin.cluster_status().members} if admin else {}
        member = members.get(node_id)
        if member is None:
            raise NotFound(f"{node_id[:64]!r} is not a member: only members renew their certificates "
                           "(a new node joins with a join token)", reason="NOT_MEMBER")
        try:
            _, asked = csr_hosts(csr)
        except CsrError as e:
            raise InvalidArgument(str(e), reason="INVALID_CSR") from None
        taken = sorted(h for h in asked if h in members and h != node_id)
        if taken:
            raise InvalidArgument(f"the request names the host {taken[0]!r}, the id of another member",
                                  reason="INVALID_CSR")
        a = member.addrs
        hosts = [host_of(x) for x in (a.raft_addr, a.grpc_addr, a.http_addr) if x]
        return self._sign_here(self.live.current, csr, node_id, hosts)

    async def set_trust(self, bundle: bytes) -> dict[str, Any]:
        async with self._lock:
            try:
                rotation.set_trust(self.live.current, bundle)
            except rotation.TrustRefused as e:
                raise FailedPrecondition(str(e), reason="TRUST_REFUSED") from None
            except CsrError as e:
                raise InvalidArgument(str(e), reason="INVALID_TRUST_BUNDLE") from None
            self._reload()
            return self.status()

    async def begin_ca(self) -> dict[str, Any]:
        async with self._lock:
            try:
                bundle = rotation.begin_ca(self.live.current)
            except rotation.NoCaKey as e:
                raise FailedPrecondition(str(e), reason="NO_CA_KEY") from None
            self._reload()
            return {**self.status(), "bundle": bundle.decode()}

    async def promote_ca(self) -> dict[str, Any]:
        async with self._lock:
            try:
                cert = rotation.promote_ca(self.live.current)
            except rotation.NoCaKey as e:
                raise FailedPrecondition(str(e), reason="NO_ROTATION") from None
            self._reload()
            return {**self.status(), "ca_cert": cert.decode()}


def _post_sign(target: str, body: bytes, authorization: str, ca_pem: bytes) -> bytes:
    """POST /cluster/tls/sign at the signer (blocking; run in a thread)."""
    url = (target if "://" in target else f"https://{target}") + "/cluster/tls/sign"
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=SIGN_TIMEOUT_S, context=ssl_client_context(ca_pem=ca_pem)) as r:
            return str(json.loads(r.read())["node_cert"]).encode()
    except urllib.error.HTTPError as e:
        try:
            doc = json.loads(e.read() or b"{}")
        except ValueError:
            doc = {}
        err: DoqError = (Unavailable if e.code == 503 else FailedPrecondition)(
            f"{target} refused to sign: {doc.get('detail', f'HTTP {e.code}')}",
            reason=str(doc.get("reason") or "SIGN_REFUSED"))
        raise err from None
    except (OSError, ValueError, KeyError) as e:
        raise Unavailable(f"cannot reach the signer at {target} to sign the certificate: "
                          f"{getattr(e, 'reason', type(e).__name__)}", reason="SIGNER_UNREACHABLE") from None
