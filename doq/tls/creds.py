"""gRPC credentials and SSL contexts built from a node's TLS material (`certs.NodeTls`)
or a client's CA file.

- Peer port (doq/node/transport.py, asyncio streams with Python's `ssl`): mutual TLS ≥ 1.2.
  The receiver requires a client certificate signed by a CA the node trusts
  (`peer_server_context`; the transport takes new contexts when the live material moves);
  a sender presents its node certificate and checks that the receiver's certificate
  names the node id it means (`peer_client_context` with `check_hostname`, the server
  name being the peer's node id, a SAN of every node certificate). The receiver then
  checks that the certificate's common name (`certificate_common_name`) is the sender
  its handshake names.
- Client ports: TLS with the node certificate (or the operator's `--tls-cert/--tls-key`),
  no client certificate (clients authenticate with keys); live as well.
- Clients (CLI, Python client, a follower forwarding to its leader, a node joining):
  verify the server against the cluster CA (`--ca-file`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import tempfile
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from doq.tls.certs import NodeTls


class _PeerContext(ssl.SSLContext):
    """An SSL context of the peer port that remembers the trust bundle it was made with."""

    trusted: bytes = b""


def _peer_context(tls: NodeTls, *, server: bool) -> ssl.SSLContext:
    ctx = _PeerContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=tls.ca_cert.decode())
    load_chain_bytes(ctx, tls.node_cert, tls.node_key)  # the bytes LiveTls checked, not the files now
    if server:
        # no session resumption on the peer wire: a resumed session skips the certificate
        # check, so it would outlive a change of the trusted CAs (the transport also refuses
        # any connection that resumed one: TLS 1.2 session ids cannot be turned off here)
        ctx.options |= ssl.OP_NO_TICKET
        ctx.num_tickets = 0
    ctx.trusted = tls.ca_cert
    return ctx


def load_chain_bytes(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`ctx.load_cert_chain` from PEM bytes (Python's `ssl` reads only paths): through an
    anonymous memory file (`os.memfd_create`, read via /proc/self/fd), else a 0600 file in
    a private temporary directory removed right after. Raises ssl.SSLError when the key is
    not the certificate's."""
    data = key_pem.rstrip(b"\n") + b"\n" + cert_pem  # one PEM file: the key, then the chain
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd("doq-peer-tls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, data)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
            return
        finally:
            os.close(fd)
    d = tempfile.mkdtemp(prefix="doq-tls-")  # 0700
    try:
        path = os.path.join(d, "chain.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with contextlib.closing(os.fdopen(fd, "wb")) as f:
            f.write(data)
        ctx.load_cert_chain(path)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def peer_server_context(tls: NodeTls) -> ssl.SSLContext:
    """The peer port's server context: the node certificate; a client certificate of a
    CA in `tls.ca_cert` required; TLS ≥ 1.2; no session tickets (TLS 1.3 and 1.2)."""
    return _peer_context(tls, server=True)


def peer_client_context(tls: NodeTls) -> ssl.SSLContext:
    """A sender's context: presents the node certificate, verifies the receiver against
    `tls.ca_cert` and that its certificate names the `server_hostname` given (the peer's
    node id); TLS ≥ 1.2."""
    ctx = _peer_context(tls, server=False)
    assert ctx.check_hostname
    return ctx


def trusted_bundle(ctx: ssl.SSLContext) -> bytes:
    """The trust bundle a peer context was made with (b"" for any other context)."""
    return getattr(ctx, "trusted", b"")


def certificate_common_name(der: bytes) -> str:
    """The one common name of a (verified) DER certificate; "" if it has none or several."""
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return ""
    value = names[0].value
    return value if isinstance(value, str) else value.decode(errors="replace")


def ca_channel_credentials(ca_pem: bytes | None) -> grpc.ChannelCredentials:
    """Verify a server against `ca_pem` (None: the system's roots)."""
    return grpc.ssl_channel_credentials(root_certificates=ca_pem)


def ssl_client_context(ca_file: str | Path | None = None, ca_pem: bytes | None = None) -> ssl.SSLContext:
    """An HTTPS client context that verifies the server (hostname included) against the
    CA in `ca_file` or `ca_pem` (neither: the system's roots)."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None,
                                     cadata=ca_pem.decode() if ca_pem else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
