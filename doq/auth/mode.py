"""When a node requires client keys.

Keys are required when the node runs secure (TLS on every port too): started with
`--secure` or `--join-token`, or when any address it binds (gRPC, HTTP, Raft) or
announces (`--advertise-host`) is not a loopback address, unless it is started with
`--insecure`.
A node whose every address is loopback and that is not `--secure` (the seed's examples,
`doq serve` with no flags) requires none: only processes on the same machine reach it,
and the seed's curl lines must keep working verbatim. A key presented to such a node is
still checked (see `doq.auth.authorizer`).
"""

from __future__ import annotations

from doq.config import ServeConfig
from doq.tls.mode import decide_secure


def runs_secure(config: ServeConfig) -> bool:
    """Does this node run secure: TLS on every port (`doq.server_tls`) and client keys
    required, one decision for both (`doq.tls.mode.decide_secure`). A node enrolling with a
    join token joins a secure cluster, so it is secure too. Raises InvalidArgument for
    --secure with --insecure."""
    return decide_secure(secure=config.secure or bool(config.join_token), insecure=config.insecure,
                         listen_addrs=(config.grpc_addr, config.http_addr, config.raft_addr),
                         advertise_host=config.advertise_host)


def keys_required(config: ServeConfig) -> bool:
    return runs_secure(config)
