"""gRPC credentials and SSL contexts built from a node's TLS material (`certs.NodeTls`)
or a client's CA file.

- Peer port: mutual TLS. The server requires a client certificate signed by a CA the
  node trusts (its server credentials are live: `doq.tls.live.LiveTls.server_credentials`);
  a sender presents its node certificate and checks that
  the receiver's certificate names the node id it means (`peer_channel`: the TLS target
  name is the peer's node id, a SAN of every node certificate). The receiver then checks
  that the certificate's common name is the stream's sender (doq/node/transport.py).
- Client ports: TLS with the node certificate (or the operator's `--tls-cert/--tls-key`),
  no client certificate (clients authenticate with keys); live as well.
- Clients (CLI, Python client, a follower forwarding to its leader, a node joining):
  verify the server against the cluster CA (`--ca-file`).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from doq.tls.certs import NodeTls


def peer_channel_credentials(tls: NodeTls) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=tls.ca_cert, private_key=tls.node_key,
                                        certificate_chain=tls.node_cert)


def peer_channel_options(peer_node_id: str) -> list[tuple[str, Any]]:
    """The receiver's certificate must name `peer_node_id` (not the address's host)."""
    return [("grpc.ssl_target_name_override", peer_node_id)]


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


def peer_common_name(auth_context: dict[str, Sequence[bytes]]) -> str:
    """The verified client certificate's common name in a gRPC auth context ("" if none)."""
    names = auth_context.get("x509_common_name") or ()
    return names[0].decode(errors="replace") if names else ""
