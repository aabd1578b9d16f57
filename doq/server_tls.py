"""A node's TLS at start (for `doq.server`): whether it runs secure (`mode.decide_secure`),
its enrollment with a join token (`doq.enrollment_client`), and its material
(`certs.ensure_node_tls` in NODE_DIR/tls), with errors that tell the operator what to do."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from doq.auth.mode import runs_secure
from doq.config import ServeConfig
from doq.enrollment_client import EnrollError, enroll
from doq.errors import DoqError
from doq.node.cluster import ClusterStatus
from doq.node.member_input import check_tls_node_id
from doq.tls.certs import (
    CA_CERT,
    TLS_DIR,
    NodeTls,
    TlsSetupError,
    ensure_node_tls,
    install_enrolled,
)
from doq.tls.live import LiveTls
from doq.tls.mode import host_of, non_loopback


@dataclass(frozen=True, slots=True)
class ServingTls:
    """What a secure node serves with: its cluster material and the client ports' files."""

    node: NodeTls  # as at start; `live` has the current material (doq.tls.live)
    cert_file: Path  # client ports (gRPC and HTTP): --tls-cert, else the node's certificate
    key_file: Path
    live: LiveTls = field(init=False)

    def __post_init__(self) -> None:
        own = (self.cert_file, self.key_file) if self.cert_file != self.node.cert_file else None
        object.__setattr__(self, "live", LiveTls(self.node, own))


def config_hosts(config: ServeConfig) -> list[str]:
    """The hosts the node listens on and announces (SANs of its certificate)."""
    hosts = [host_of(a) for a in (config.grpc_addr, config.http_addr, config.raft_addr)]
    return [*hosts, config.advertise_host] if config.advertise_host else hosts


def why_secure(config: ServeConfig) -> str:
    if config.secure:
        return "--secure"
    return f"it binds or announces the non-loopback address {non_loopback(config_hosts(config))[0]!r}"


def needs_enrollment(config: ServeConfig, node_path: Path) -> bool:
    """A node started with --join-token that has no cluster CA yet enrolls first."""
    return bool(config.join_token) and not (node_path / TLS_DIR / CA_CERT).exists()


def enroll_node(config: ServeConfig, node_path: Path, *, store_id: str, empty: bool,
                cluster_id: str) -> ClusterStatus:
    """Enroll with the join token (blocking) under this node's store (`store_id`, `empty`,
    the `cluster_id` it means: as `doq.cluster_client.join_cluster`); the CA certificate,
    the node's certificate (signed by the leader for its CSR) and its own key go into
    NODE_DIR/tls (no CA key); returns the cluster's status after the add. Raises
    TlsSetupError."""
    if not config.join:
        raise TlsSetupError("--join-token needs --join ADDR (any member's HTTP address)")
    try:
        got = enroll(config.join_token, list(config.join), config.node_id,
                     replace(config.member_addrs(), store_id=store_id), empty=empty,
                     cluster_id=cluster_id, hosts=config_hosts(config))
    except (EnrollError, DoqError) as e:
        raise TlsSetupError(f"cannot enroll with the join token: {e}") from None
    install_enrolled(node_path / TLS_DIR, got.ca_cert, got.node_cert, got.node_key)
    return got.status


def node_tls(config: ServeConfig, node_path: Path) -> ServingTls | None:
    """None if the node does not run secure; else its TLS, created as needed (a node that
    bootstraps makes the cluster CA). Raises TlsSetupError with the operator's message."""
    if not runs_secure(config):
        return None
    if bool(config.tls_cert) != bool(config.tls_key):
        raise TlsSetupError("give --tls-cert and --tls-key together")
    directory = node_path / TLS_DIR
    if not config.join and not (directory / CA_CERT).exists():
        # a new secure cluster: its first node's id must be one its future peers can dial over
        # TLS (a data dir made before this check keeps its id: a lone node needs no dialling)
        try:
            check_tls_node_id(config.node_id)
        except DoqError as e:
            raise TlsSetupError(f"{e}; choose another --node-id") from None
    try:
        tls = ensure_node_tls(directory, config.node_id, config_hosts(config), may_create_ca=not config.join)
    except TlsSetupError as e:
        raise TlsSetupError(
            f"this node runs secure ({why_secure(config)}) but cannot set up TLS: {e}. A new member "
            f"gets the cluster CA with --join-token TOKEN (`doq join-token create` on a member), or "
            f"copy the cluster's ca.crt and ca.key into {directory}; or start every node with "
            "--insecure (anyone who reaches a port can then do anything)") from None
    except OSError as e:
        raise TlsSetupError(f"cannot read or write the TLS files in {directory}: {e}") from None
    if config.tls_cert:
        return ServingTls(tls, Path(config.tls_cert), Path(config.tls_key))
    return ServingTls(tls, tls.cert_file, tls.key_file)
