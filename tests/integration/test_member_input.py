"""Membership input against a real node (issue 18: fuzzing the join route once let 8
garbage members in and the leader log "Illegal header value" 1,387 times): malformed
node ids and addresses get a 400 problem+json, a duplicate id or address a 409, and
neither changes the configuration nor fills the log. Real: one `doq serve` process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster_view
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

GARBAGE_IDS = ["", "a b", "x" * 64, "no/de", "é", "-lead", "a\r\nX-Evil: 1", "n\x00"]
GARBAGE_ADDRS = ["", "nohost", "h:0", "h:70000", "http://h:1", "h h:1", "[::1:5", "300.1.1.1:5", "h:1/x",
                 "h\n:1", "x" * 300 + ":1"]


def post(url: str, body: Any) -> tuple[int, str, dict[str, Any]]:
    req = urllib.request.Request(url + "/cluster/join", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers["Content-Type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], json.loads(e.read())


def body(nid: str = "node-9", raft: str = "127.0.0.1:1", grpc: str = "127.0.0.1:2",
         http: str = "127.0.0.1:3") -> dict[str, str]:
    return {"node_id": nid, "raft_addr": raft, "grpc_addr": grpc, "http_addr": http}


def test_malformed_or_duplicate_members_are_refused_and_change_nothing(tmp_path: Path) -> None:
    node = NodeProc(tmp_path / "data")
    node.log_path = tmp_path / "node.log"
    node.start()
    try:
        before = cluster_view(node.http_url)["members"]
        refusals = []
        for nid in GARBAGE_IDS:
            refusals.append(post(node.http_url, body(nid=nid)))
        for addr in GARBAGE_ADDRS:
            for field in ("raft", "grpc", "http"):
                refusals.append(post(node.http_url, body(**{field: addr})))
        for status, ctype, doc in refusals:
            assert status == 400, (status, doc)
            assert ctype.startswith("application/problem+json") and doc["detail"], doc

        own = before[0]
        status, ctype, doc = post(node.http_url, body(raft=own["raft_addr"]))
        assert status == 409 and doc["reason"] == "ADDRESS_IN_USE", doc
        status, ctype, doc = post(node.http_url, body(nid="node-1", raft="127.0.0.1:9"))
        assert status == 409 and doc["reason"] == "MEMBER_EXISTS", doc
        assert cluster_view(node.http_url)["members"] == before
    finally:
        node.kill9()
    lines = node.log().splitlines()
    assert len(lines) < 50, lines[-20:]  # one line per start at most, nothing per refusal
