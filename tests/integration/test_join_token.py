"""Join tokens against real processes (issue 18): `doq join-token create` on a secure
cluster gives a one-time token; a new node started with `--join ADDR --join-token TOKEN`
checks the cluster CA against the token's fingerprint, enrolls (the token is spent
through Raft) with a CSR for a key it made, gets the CA certificate and its own
certificate (never the CA key) and joins with mutual TLS. The same
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
from tests.integration.test_tls import (
    admin_key,
    ca_file,
    https,
    remove_member,
    start_secure,
    wait_https_ready,
)
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
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DOQ_KEY": str(admin_key(node))})
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
            "ca.crt": 0o600, "node.crt": 0o600, "node.key": 0o600}  # never the CA key

        before = members(seed)
        log = refused(joiner(seed, "node-3", token))  # the same token again
        assert "INVALID_JOIN_TOKEN" in log
        assert members(seed) == before
        assert remove_member(seed, "node-2")[0] == 200  # the seed alone again
    finally:
        n2.kill9()


def test_a_guessed_secret_or_another_clusters_token_gets_nobody_in(seed: NodeProc) -> None:
    real = decode_token(create_token(seed))
    before = members(seed)

    guessed = encode_token(type(real)(real.addrs, real.ca_fingerprints, real.token_id, b"g" * 32, real.expires_ms))
    log = refused(joiner(seed, "guess", guessed))
    assert "INVALID_JOIN_TOKEN" in log

    pinned_elsewhere = encode_token(type(real)(real.addrs, ("ab" * 32,), real.token_id, real.secret, real.expires_ms))
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


def _leader(nodes: list[NodeProc]) -> NodeProc | None:
    """The member every live node names as leader (None while they disagree or have none)."""
    views = {https(n, "GET", "/cluster")[1]["leader_id"] for n in nodes}
    leader = views.pop() if len(views) == 1 else ""
    return next((n for n in nodes if n.node_id == leader), None)


def test_members_enrolled_with_join_tokens_are_admitted_and_vote(tmp_path_factory: pytest.TempPathFactory) -> None:
    """An enrolled node is added under its store id, so the conf change admits its store
    and it takes part in elections. Two rounds: the leader is killed and the two others
    must elect one (in a cluster of three, both survivors are needed) and commit a write;
    the killed node comes back and the next leader is killed, until every member has been
    a survivor of some round."""
    data = tmp_path_factory.mktemp("jtvote") / "data"
    first = NodeProc(data, node_id="node-1")
    nodes = [start_secure(first)]
    try:
        for node_id in ("node-2", "node-3"):
            n = joiner(first, node_id, create_token(first))
            n.launch()
            wait_https_ready(n, 90)
            nodes.append(n)
        for n in nodes[1:]:
            assert "takes no part in elections until the cluster has admitted" in n.log()
            until(f"{n.node_id} admitted", lambda n=n: "the cluster admitted store" in n.log(), 90)  # type: ignore[misc]
        until("three voters", lambda: sorted(m["node_id"] for m in https(first, "GET", "/cluster")[1]["members"]
                                             if m["role"] == "voter") == ["node-1", "node-2", "node-3"], 90)
        survivors_of_some_round: set[str] = set()
        round_no = 0
        while len(survivors_of_some_round) < 3 and round_no < 4:  # two rounds unless a leader is re-elected
            round_no += 1
            name = f"after-{round_no}"
            old = until("a leader", lambda: _leader(nodes), 90)
            old.kill9()
            rest = [n for n in nodes if n is not old]
            new = until("a new leader of the two others", lambda rest=rest: _leader(rest), 120)  # type: ignore[misc]
            assert new is not old
            status, body = https(rest[0], "POST", "/API/v1/queues", {"name": name})
            assert status in (200, 201), body  # committed by the two survivors
            survivors_of_some_round |= {n.node_id for n in rest}
            old.launch()  # back with its data (no new enrollment: it holds the CA)
            wait_https_ready(old, 90)
            until(f"{old.node_id} caught up", lambda old=old, name=name: any(  # type: ignore[misc]
                q["name"] == name for q in https(old, "GET", "/API/v1/queues")[1]["queues"]), 90)
        assert survivors_of_some_round == {"node-1", "node-2", "node-3"}
    finally:
        for n in nodes:
            n.kill9()
