"""The browser guard of a node that requires no keys, on a real loopback `doq serve`:
a cross-site form POST (the attack: `/cluster/join` with a remote address) and a DNS-
rebound Host are refused with 403 and change nothing; the node's own page (same origin),
curl-like clients and the seed's curl lines pass. The rule itself is tested as a pure
function too."""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from doq.service.http.browser_guard import refusal
from tests.support.proc import NodeProc, running_node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(Path(tmp_path_factory.mktemp("guard")) / "data") as n:
        yield n


def request(node: NodeProc, method: str, path: str, headers: dict[str, str],
            body: bytes = b"") -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw and r.getheader("Content-Type", "").endswith("json") else {})
    finally:
        conn.close()


@pytest.mark.integration
def test_a_cross_site_form_post_is_refused_and_changes_nothing(node: NodeProc) -> None:
    form = b"node_id=mallory&raft_addr=203.0.113.9:9000&grpc_addr=203.0.113.9:10000&http_addr=203.0.113.9:8000"
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
        status, doc = request(node, "POST", "/cluster/join",
                              {"Content-Type": "application/x-www-form-urlencoded", **headers}, form)
        assert status == 403 and doc["reason"] == "CROSS_ORIGIN", headers
    status, doc = request(node, "GET", "/cluster", {})
    assert status == 200 and [m["node_id"] for m in doc["members"]] == ["node-1"]


@pytest.mark.integration
def test_a_rebound_host_is_refused_and_the_nodes_own_origin_passes(node: NodeProc) -> None:
    status, doc = request(node, "GET", "/API/v1/queues", {"Host": f"evil.example:{node.http_port}"})
    assert status == 403 and doc["reason"] == "HOST_NOT_LOCAL"
    same = f"127.0.0.1:{node.http_port}"
    status, _ = request(node, "POST", "/API/v1/queues", {"Host": same, "Origin": f"http://{same}",
                                                          "Content-Type": "application/json"},
                        json.dumps({"name": "guarded", "type": "delayed"}).encode())
    assert status == 201
    for host in (f"localhost:{node.http_port}", same):
        assert request(node, "GET", "/API/v1/queues/guarded", {"Host": host})[0] == 200


@pytest.mark.integration
def test_curl_without_browser_headers_passes(node: NodeProc) -> None:
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                          f"http://localhost:{node.http_port}/API/v1/queues", "-H", "Content-Type: application/json",
                          "-d", '{"name": "curl_q", "type": "delayed"}'], capture_output=True, text=True, timeout=60)
    assert out.stdout == "201"


@pytest.mark.parametrize("headers,loopback,expected", [
    ({b"host": b"127.0.0.1:8000"}, True, None),
    ({b"host": b"localhost:8000", b"origin": b"http://localhost:8000"}, True, None),
    ({b"host": b"[::1]:8000"}, True, None),
    ({b"host": b"evil.example:8000"}, True, "HOST_NOT_LOCAL"),
    ({b"host": b"10.0.0.5:8000"}, False, None),  # --insecure on a LAN address: any Host
    ({b"host": b"10.0.0.5:8000", b"origin": b"http://10.0.0.5:8000"}, False, None),
    ({b"host": b"10.0.0.5:8000", b"origin": b"http://evil.example"}, False, "CROSS_ORIGIN"),
    ({b"host": b"127.0.0.1:8000", b"origin": b"http://127.0.0.1:9999"}, True, "CROSS_ORIGIN"),
    ({b"host": b"127.0.0.1:8000", b"sec-fetch-site": b"cross-site"}, True, "CROSS_ORIGIN"),
    ({b"host": b"127.0.0.1:8000", b"sec-fetch-site": b"same-origin"}, True, None),
])
def test_the_rule(headers: dict[bytes, bytes], loopback: bool, expected: str | None) -> None:
    got = refusal(headers, loopback)
    assert (got[0] if got else None) == expected
