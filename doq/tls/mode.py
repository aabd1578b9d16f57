"""When a node runs secure (pure).

- `--secure`: secure, whatever the addresses.
- `--insecure`: not secure (the operator's explicit choice; docs/security.md says what it
  gives up).
- neither: secure as soon as one listen address (gRPC, HTTP, Raft) or the advertised
  host is not loopback; when every address is loopback (the seed's commands), not secure,
  so those commands keep working verbatim over plain HTTP and gRPC.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from doq.errors import InvalidArgument

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def host_of(addr: str) -> str:
    """The host part of HOST:PORT ([IPv6] without brackets)."""
    return addr.rpartition(":")[0].strip("[]")


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback IPs (127.0.0.0/8, ::1); "" and the wildcard
    addresses (0.0.0.0, ::) bind every interface, so they are not loopback."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def non_loopback(hosts: Iterable[str]) -> list[str]:
    """The hosts that are not loopback, in order."""
    return [h for h in hosts if not is_loopback(h)]


def decide_secure(*, secure: bool, insecure: bool, listen_addrs: Iterable[str], advertise_host: str = "") -> bool:
    """Does the node run secure (see the module docstring)? InvalidArgument for both flags."""
    if secure and insecure:
        raise InvalidArgument("give --secure or --insecure, not both")
    if secure or insecure:
        return secure
    hosts = [host_of(a) for a in listen_addrs] + ([advertise_host] if advertise_host else [])
    return bool(non_loopback(hosts))
