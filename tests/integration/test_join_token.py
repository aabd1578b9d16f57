"""Join tokens against real processes (issue 18): `doq join-token create` on a secure
cluster gives a one-time token; a new node started with `--join ADDR --join-token TOKEN`
checks the cluster CA against the token's fingerprint, enrolls (the token is spent
through Raft), gets the CA, makes its own certificate and joins with mutual TLS. The same
token a second time, a token with a guessed secret, and a token pinning another CA get
nobody in. Real: `doq serve` processes on 127.0.0.1, real TLS, the real CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest

from doq.tls.enrollment import decode_token, encode_token
from tests.integration.test_tls import ca_file, https, start_secure, wait_https_ready
from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    node = NodeProc(tmp_path_factory.mktemp("jt") / "data")
    start_secure(node)
    try:
        yield node
    finally:
        node.kill9()


def create_token(node: NodeProc) -> str:
    res = subprocess.run([sys.executable, "-m", "doq", "join-token", "create", "--json", "--server",
                          f"https://127.0.0.1:{node.http_port}", "--ca-file", str(ca_file(node))],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["token"])


def joiner(seed: NodeProc, node_id: str, token: str) -> NodeProc:
    n = NodeProc(seed.data_dir, node_id=node_id,
                 extra_args=["--join", f"127.0.0.1:{seed.http_port}", "--join-token", token])
    n.log_path = seed.data_dir.parent / f"{node_id}.log"
    return n


def members(seed: NodeProc) -> list[str]:
    return sorted(m["node_id"] for m in https(seed, "GET", "/cluster")[1]["members"])


def refused(n: NodeProc) -> str:
    n.launch()
    assert n.proc is not None
    try:
        assert n.proc.wait(90) != 0
    finally:
        n.kill9()
    return n.log()


def test_a_node_with_a_join_token_enrolls_and_joins_with_mutual_tls(seed: NodeProc) -> None:
    token = create_token(seed)
    assert decode_token(token).addrs == [f"127.0.0.1:{seed.http_port}"]
    n2 = joiner(seed, "node-2", token)
    n2.launch()
    try:
        wait_https_ready(n2, 90)
        until("node-2 a voter", lambda: any(m["node_id"] == "node-2" and m["role"] == "voter"
                                            for m in https(seed, "GET", "/cluster")[1]["members"]))
        status, body = https(n2, "POST", "/API/v1/queues", {"name": "enrolled"})  # forwarded over TLS
        assert status in (200, 201), body
        until("equal digests", lambda: len({https(n, "GET", "/db/digest", ca=ca_file(seed))[1]["digest"]
                                            for n in (seed, n2)}) == 1)
        tls = n2.data_dir / "node-2" / "tls"
        assert (tls / "ca.crt").read_bytes() == ca_file(seed).read_bytes()
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in tls.iterdir()} == {
            "ca.crt": 0o600, "ca.key": 0o600, "node.crt": 0o600, "node.key": 0o600}

        before = members(seed)
        log = refused(joiner(seed, "node-3", token))  # the same token again
        assert "INVALID_JOIN_TOKEN" in log
        assert members(seed) == before
        assert https(seed, "DELETE", "/cluster/members/node-2")[0] == 200  # the seed alone again
    finally:
        n2.kill9()


def test_a_guessed_secret_or_another_clusters_token_gets_nobody_in(seed: NodeProc) -> None:
    real = decode_token(create_token(seed))
    before = members(seed)

    guessed = encode_token(type(real)(real.addrs, real.ca_fingerprint, real.token_id, b"g" * 32, real.expires_ms))
    log = refused(joiner(seed, "guess", guessed))
    assert "INVALID_JOIN_TOKEN" in log

    pinned_elsewhere = encode_token(type(real)(real.addrs, "ab" * 32, real.token_id, real.secret, real.expires_ms))
    log = refused(joiner(seed, "mitm", pinned_elsewhere))
    assert "refusing to join" in log  # the secret was never sent to a CA the token does not pin
    assert members(seed) == before

    # the real token was not spent by either attempt: it still enrolls a node
    n4 = joiner(seed, "node-4", encode_token(real))
    n4.launch()
    try:
        wait_https_ready(n4, 90)
    finally:
        n4.kill9()
    assert "node-4" in members(seed)
