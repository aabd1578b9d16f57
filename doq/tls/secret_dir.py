"""The cluster's TLS material as a Kubernetes Secret mounted into every pod: `ca.crt` (the
trust bundle), `<node id>.crt` and `<node id>.key` for each pod (docs/deploy.md, "Keys and
certificates in Kubernetes").

`read_secret` reads one pod's part of it, `check_material` tells whether it holds together,
`install` writes it as the node's NODE_DIR/tls (`ca.crt`, `node.crt`, `node.key`; 0600 in a
0700 directory) and removes a `ca.key` left there: the CA key stays where the Secret was
made. `doq k8s-start` installs the Secret before the node starts, and
`doq.service.tls_admin.TlsAdmin.follow_secret` takes a Secret kubelet has updated in place
while the node runs. Nothing here logs or raises a file's content.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from doq.storage.files import private_dir, write_private
from doq.tls.certs import CA_CERT, CA_KEY, NODE_CERT, NODE_KEY, TlsSetupError, issuer_in
from doq.tls.expiry import key_matches


@dataclass(frozen=True)
class SecretMaterial:
    """One pod's files of the Secret (PEM bytes)."""

    ca_cert: bytes
    node_cert: bytes
    node_key: bytes

    @property
    def digest(self) -> str:
        """Tells two versions apart without keeping or showing the key."""
        h = hashlib.sha256()
        for part in (self.ca_cert, self.node_cert, self.node_key):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()


def read_secret(secret_dir: Path, node_id: str) -> SecretMaterial:
    """`node_id`'s files in `secret_dir`, all of one version: kubelet keeps a Secret volume's
    files behind a `..data` symlink it swaps to a new directory at each update, so they are
    read from where `..data` points (read again if it moved meanwhile). Raises ValueError
    naming a file it cannot read (never a content)."""
    names = (CA_CERT, f"{node_id}.crt", f"{node_id}.key")
    for _ in range(3):
        version = _version_dir(secret_dir)
        try:
            return SecretMaterial(*((version / name).read_bytes() for name in names))
        except OSError as e:
            failed, error = secret_dir / names[0], e
            for name in names:
                if not (version / name).exists():
                    failed = secret_dir / name
                    break
            if _version_dir(secret_dir) == version:
                break
    raise ValueError(f"--tls-secret-dir: cannot read {failed} ({type(error).__name__}): the Secret "
                     f"needs ca.crt, {node_id}.crt and {node_id}.key") from None


def _version_dir(secret_dir: Path) -> Path:
    data = secret_dir / "..data"
    return secret_dir / os.readlink(data) if data.is_symlink() else secret_dir


def check_material(ca_cert: bytes, node_cert: bytes, node_key: bytes) -> None:
    """Raise TlsSetupError unless `node_cert` is issued by a CA of the bundle `ca_cert` and
    `node_key` is its key (a file that is not PEM fails the same checks)."""
    if issuer_in(node_cert, ca_cert) is None:
        raise TlsSetupError("the node certificate is signed by none of the CAs in ca.crt")
    if not key_matches(node_cert, node_key):
        raise TlsSetupError("node.key is not the key of node.crt")


def install(tls_dir: Path, material: SecretMaterial) -> None:
    """Write `material` as `tls_dir`'s `ca.crt`, `node.crt`, `node.key` (replacing them) and
    remove `ca.key`. Raises OSError."""
    private_dir(tls_dir)
    write_private(tls_dir / CA_CERT, material.ca_cert)
    write_private(tls_dir / NODE_CERT, material.node_cert)
    write_private(tls_dir / NODE_KEY, material.node_key)
    (tls_dir / CA_KEY).unlink(missing_ok=True)
