"""Membership input rules (doq/node/member_input.py), pure."""

from __future__ import annotations

import pytest

from doq.errors import FailedPrecondition, InvalidArgument
from doq.node.cluster import MemberAddrs
from doq.node.member_input import (
    check_member_addr,
    check_new_member,
    check_node_id,
    check_tls_node_id,
)


@pytest.mark.parametrize("nid", ["node-1", "n", "doq-0.doq", "A_b-9", "x" * 63])
def test_plain_node_ids_pass(nid: str) -> None:
    assert check_node_id(nid) == nid


@pytest.mark.parametrize("nid", ["", "-x", ".", "..", "a/b", "a b", "a\nb", "é", "a\x00", "x" * 64,
                                 "node:1", "Bearer\r\nx"])
def test_malformed_node_ids_are_refused(nid: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_node_id(nid)
    assert e.value.reason == "INVALID_NODE_ID"


@pytest.mark.parametrize("nid", ["0.0.0.0", "01.2.3.4", "1", "12.34", "a..b", "a.", "node-1..x"])
def test_ids_no_tls_peer_could_dial_are_refused_for_a_secure_cluster(nid: str) -> None:
    """They pass the plain rule (a loopback cluster may use them) but cannot be a TLS server
    name: an IP address (`server_hostname` would be taken as one), an empty label."""
    assert check_node_id(nid) == nid
    with pytest.raises(InvalidArgument) as e:
        check_tls_node_id(nid)
    assert e.value.reason == "INVALID_NODE_ID"


def test_an_id_differing_only_by_case_from_a_members_is_refused_for_a_secure_cluster() -> None:
    """TLS host names ignore case, node ids do not: "Node-1"'s certificate would pass a
    dialer's check for "node-1"."""
    with pytest.raises(InvalidArgument) as e:
        check_tls_node_id("Node-1", ["node-1", "node-2"])
    assert "node-1" in str(e.value)
    assert check_tls_node_id("node-3", ["node-1", "node-2"]) == "node-3"


@pytest.mark.parametrize("nid", ["node-1", "n", "doq-0.doq", "A_b-9", "1a", "10-0-0-1", "x" * 63])
def test_dns_like_node_ids_pass_for_a_secure_cluster(nid: str) -> None:
    assert check_tls_node_id(nid, ["other"]) == nid


@pytest.mark.parametrize("addr", ["localhost:9002", "127.0.0.1:1", "[::1]:65535", "doq-0.doq.svc.cluster.local:7000",
                                  "my_host:80", "host.:8001"])
def test_host_port_addresses_pass(addr: str) -> None:
    assert check_member_addr(addr) == addr


@pytest.mark.parametrize("addr", ["", "localhost", ":80", "host:0", "host:65536", "host:+80", "host:８０",
                                  "http://host:80", "a/b:80", "ho st:80", "999.1.1.1:80", "1.2.3:80",
                                  "[::1:80", "[zz::1]:80", "::1:80", "-host:80", "a..b:80", "x" * 254 + ":80",
                                  "h\nx:80", "é:80"])
def test_malformed_addresses_are_refused(addr: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_member_addr(addr)
    assert e.value.reason == "INVALID_ADDRESS"


A = MemberAddrs("h1:1", "h1:2", "h1:3")
B = MemberAddrs("h2:1", "h2:2", "h2:3")


def test_the_same_member_again_is_a_no_op_and_a_new_one_passes() -> None:
    assert check_new_member("n1", A, {"n1": A}) is True
    assert check_new_member("n2", B, {"n1": A}) is False


def test_an_id_taken_with_other_addresses_is_a_conflict() -> None:
    with pytest.raises(FailedPrecondition) as e:
        check_new_member("n1", B, {"n1": A})
    assert e.value.reason == "MEMBER_EXISTS"


def test_an_address_of_another_member_is_a_conflict() -> None:
    with pytest.raises(FailedPrecondition) as e:
        check_new_member("n2", MemberAddrs("h2:1", "h1:2", "h2:3"), {"n1": A})
    assert e.value.reason == "ADDRESS_IN_USE"


def test_one_address_for_two_services_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        check_new_member("n2", MemberAddrs("h2:1", "h2:1", "h2:3"), {"n1": A})
