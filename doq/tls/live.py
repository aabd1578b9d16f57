"""A running node's TLS material, replaceable without a restart (docs/security.md,
"Rotating certificates").

`LiveTls` holds the node's current `NodeTls` (read from NODE_DIR/tls) and a generation
that grows with every change. Whoever serves or connects with the material reads it
where it uses it, so a change takes effect at the next TLS handshake:

- the gRPC client port uses dynamic credentials whose fetcher (`server_credentials`)
  hands gRPC the new certificate when the generation moved: every new connection then
  gets it, open ones keep theirs;
- the Raft transport (doq/node/transport.py) builds new SSL contexts when the generation
  moved, for its next handshakes in and out, and ends inbound connections opened under
  another trust bundle so their senders handshake again;
- subscribers (`subscribe`) are told after each change: the HTTP server's SSL context,
  the follower's forwarding.

`reload` reads the files again (after `doq.tls.rotation` or an operator replaced them);
a set of files that does not hold together (a node certificate of none of the trusted
CAs, a key that is not the certificate's) is refused and the material stays as it was.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from doq.tls.certs import NodeTls, TlsSetupError, read_node_tls
from doq.tls.expiry import key_matches
from doq.tls.secret_dir import check_material

log = logging.getLogger(__name__)


class LiveTls:
    """The node's current TLS material; thread-safe reads (gRPC calls the fetchers from its
    own threads)."""

    def __init__(self, material: NodeTls, client_files: tuple[Path, Path] | None = None) -> None:
        self._lock = threading.Lock()
        self._material = material
        self._client_files = client_files  # --tls-cert/--tls-key: the client ports' own pair
        self._client_pair = self._read_client_pair()
        self.generation = 1
        self._subscribers: list[Callable[[NodeTls], object]] = []

    @property
    def current(self) -> NodeTls:
        with self._lock:
            return self._material

    @property
    def directory(self) -> Path:
        return self._material.directory

    def _read_client_pair(self) -> tuple[bytes, bytes]:
        return self._read_client_pair_of(self._material)

    def _read_client_pair_of(self, m: NodeTls) -> tuple[bytes, bytes]:
        if self._client_files is None:
            return m.node_cert, m.node_key
        cert, key = self._client_files
        return cert.read_bytes(), key.read_bytes()

    def client_pair(self) -> tuple[bytes, bytes]:
        """(certificate, key) the client ports serve."""
        with self._lock:
            return self._client_pair

    def subscribe(self, fn: Callable[[NodeTls], object]) -> None:
        """Call `fn(material)` after each change (on the changing thread)."""
        self._subscribers.append(fn)

    def reload(self) -> NodeTls:
        """Read NODE_DIR/tls (and --tls-cert/--tls-key) again and take them if they hold
        together; raises TlsSetupError (nothing changes) if they do not."""
        try:
            new = read_node_tls(self.directory)
            client = self._read_client_pair_of(new)
        except OSError as e:
            raise TlsSetupError(f"cannot read the TLS files ({type(e).__name__}: {e.strerror})") from None
        check_material(new.ca_cert, new.node_cert, new.node_key)
        if not key_matches(*client):
            raise TlsSetupError("the --tls-key file is not the key of the --tls-cert file")
        with self._lock:
            self._material = new
            self._client_pair = client
            self.generation += 1
        for fn in self._subscribers:
            try:
                fn(new)
            except Exception:
                log.exception("a TLS subscriber failed to take the new material")
        return new

    def server_credentials(self) -> grpc.ServerCredentials:
        """Dynamic gRPC server credentials of the client port (the client pair, no client
        certificate). Each new connection gets the material current at its handshake."""
        def config() -> grpc.ServerCertificateConfiguration:
            cert, key = self.client_pair()
            return grpc.ssl_server_certificate_configuration([(key, cert)])

        served = [self.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            gen = self.generation
            if gen == served[0]:
                return None  # unchanged: gRPC keeps what it has
            served[0] = gen
            return config()

        return grpc.dynamic_ssl_server_credentials(config(), fetch, require_client_authentication=False)
