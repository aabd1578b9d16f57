"""When a node requires client keys.

Keys are required when the node is started with `--secure`, or when any address it binds
(gRPC, HTTP, Raft) is not a loopback address, unless it is started with `--insecure`.
A node whose every address is loopback and that is not `--secure` (the seed's examples,
`doq serve` with no flags) requires none: only processes on the same machine reach it,
and the seed's curl lines must keep working verbatim. A key presented to such a node is
still checked (see `doq.auth.authorizer`).
"""

from __future__ import annotations

import ipaddress

from doq.config import ServeConfig


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keys_required(config: ServeConfig) -> bool:
    if config.secure:
        return True
    if config.insecure:
        return False
    addrs = (config.grpc_addr, config.http_addr, config.raft_addr)
    return not all(is_loopback_host(a.rpartition(":")[0]) for a in addrs)
