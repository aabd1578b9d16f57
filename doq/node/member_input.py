"""Membership input, checked before anything reaches the Raft log (pure: no I/O).

A node id or a member address ends up in Raft messages, gRPC metadata (`doq-raft-to`),
HTTP headers (`X-Doq-Leader`), file names (DATA_DIR/NODE_ID) and logs; a malformed one
that got in once stays in the replicated configuration for good. So every way in
(`POST /cluster/join`, `ClusterAdmin.add_member`, `doq serve --node-id`, `doq cluster
remove|transfer-leader`) calls these functions; reachability is not checked (a member
may be down when it is added).

- Node id: 1..63 characters of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
  Enrollment into a secure cluster also needs a name its peers can dial over TLS
  (`check_tls_node_id`: not an IP address, no empty label, not another member's id in
  other case).
- Member address: `HOST:PORT`, port 1..65535; HOST a DNS name (labels of
  `A-Z a-z 0-9 _ -`, 1..63 each, at most 253 in all), an IPv4 address, or an IPv6
  address in brackets. No scheme, path, user or spaces.
- A new member may not reuse the id of a member with other addresses, nor any address of
  another member.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping

from doq.errors import FailedPrecondition, InvalidArgument
from doq.node.cluster import MemberAddrs

NODE_ID_MAX = 63
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""The node id rule as a regular expression (the OpenAPI document shows it)."""
ADDR_MAX = 261  # a 253-character name, ":" and a 5-digit port, or a bracketed IPv6 address
ADDR_PATTERN = r"^([A-Za-z0-9_.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$"
"""The syntax of a member address (the whole rule is `check_member_addr`)."""

_NODE_ID = re.compile(NODE_ID_PATTERN)
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IPV4ISH = re.compile(r"[0-9.]+")


def check_node_id(node_id: str, what: str = "node id") -> str:
    """`node_id` if valid, else InvalidArgument (400, INVALID_NODE_ID) saying why."""
    if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
        shown = repr(node_id)[:80]
        raise InvalidArgument(
            f"invalid {what} {shown}: 1..{NODE_ID_MAX} characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit", reason="INVALID_NODE_ID")
    return node_id


def check_tls_node_id(node_id: str, members: Collection[str] = ()) -> str:
    """`node_id` (valid for `check_node_id`) if a secure cluster can give it a certificate
    its peers can dial: the Raft wire's TLS server name is the node id, which must then be
    a DNS-like name (not an IP address: `0.0.0.0`, `01.2.3.4`; no empty label: `a..b`,
    `a.`) and, TLS host names ignoring case, not another member's id in other case (its
    certificate would pass for that member). Else InvalidArgument (400, INVALID_NODE_ID)."""
    check_node_id(node_id)
    if _IPV4ISH.fullmatch(node_id):
        raise InvalidArgument(f"invalid node id {node_id!r} for a secure cluster: digits and dots only "
                              "(an IP address is not a TLS server name)", reason="INVALID_NODE_ID")
    if "" in node_id.split("."):
        raise InvalidArgument(f"invalid node id {node_id!r} for a secure cluster: an empty label "
                              "(a TLS server name has none)", reason="INVALID_NODE_ID")
    folded = node_id.casefold()
    twin = sorted(m for m in members if m != node_id and m.casefold() == folded)
    if twin:
        raise InvalidArgument(f"invalid node id {node_id!r} for a secure cluster: member {twin[0]!r} differs "
                              "only by case (TLS host names ignore case)", reason="INVALID_NODE_ID")
    return node_id


def check_member_addr(addr: str, what: str = "address") -> str:
    """`addr` (HOST:PORT, see the module docstring) if valid, else InvalidArgument
    (400, INVALID_ADDRESS) saying why."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"invalid {what} {repr(addr)[:80]}: {why}", reason="INVALID_ADDRESS")

    if not isinstance(addr, str) or not addr or len(addr) > ADDR_MAX:
        raise bad(f"HOST:PORT of at most {ADDR_MAX} characters expected")
    host, sep, port = addr.rpartition(":")
    if not sep or not host:
        raise bad("HOST:PORT expected")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise bad("the port must be 1..65535")
    if host.startswith("["):
        if not host.endswith("]"):
            raise bad("an IPv6 address goes in brackets: [ADDR]:PORT")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise bad("not an IPv6 address") from None
        return addr
    if _IPV4ISH.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise bad("not an IPv4 address") from None
        return addr
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise bad("the host must be a DNS name, an IPv4 address or [IPv6]")
    return addr


def check_member_addrs(addrs: MemberAddrs) -> MemberAddrs:
    """All three addresses of a member checked (`check_member_addr`)."""
    check_member_addr(addrs.raft_addr, "raft_addr")
    check_member_addr(addrs.grpc_addr, "grpc_addr")
    check_member_addr(addrs.http_addr, "http_addr")
    return addrs


def check_new_member(node_id: str, addrs: MemberAddrs, members: Mapping[str, MemberAddrs]) -> bool:
    """Check a member to add against the current `members` (id -> addresses). True if it
    is already a member with these addresses (adding it again changes nothing); raises
    InvalidArgument (400) for a malformed id or address, FailedPrecondition (409,
    MEMBER_EXISTS / ADDRESS_IN_USE) for a duplicate."""
    check_node_id(node_id)
    check_member_addrs(addrs)
    current = members.get(node_id)
    if current is not None:
        if current == addrs:
            return True
        raise FailedPrecondition(f"{node_id} is already a member with other addresses; remove it first",
                                 reason="MEMBER_EXISTS")
    mine = {addrs.raft_addr, addrs.grpc_addr, addrs.http_addr}
    if len(mine) != 3:
        raise InvalidArgument("raft_addr, grpc_addr and http_addr must differ", reason="INVALID_ADDRESS")
    for other, theirs in sorted(members.items()):
        taken = mine & {theirs.raft_addr, theirs.grpc_addr, theirs.http_addr}
        if taken:
            raise FailedPrecondition(
                f"{sorted(taken)[0]} is already an address of member {other}; remove it first",
                reason="ADDRESS_IN_USE")
    return False
