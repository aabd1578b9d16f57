"""The client key never travels in clear and never follows a redirect to another origin.

Real parts: `doq` CLI processes, the Python client, and small HTTP servers on 127.0.0.1
(one answers a redirect to another port, the other records what it receives). A
non-loopback plain-http or plaintext-gRPC target (192.0.2.1, TEST-NET-1: nothing is
there) is refused before any connection, with a message that says to use TLS.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from doq.ports import free_port

pytestmark = pytest.mark.integration

KEY = "doq_0123456789ab_" + "s" * 43
FAR = "192.0.2.1"  # TEST-NET-1: not loopback, never answers


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    redirect_to = ""

    def _any(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()} | {":path": self.path})
        if self.redirect_to:
            self.send_response(307)
            self.send_header("Location", self.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"keys": [], "queues": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _any

    def log_message(self, *args: Any) -> None:
        pass


def _serve(redirect_to: str = "") -> tuple[http.server.ThreadingHTTPServer, list[dict[str, str]], int]:
    seen: list[dict[str, str]] = []
    handler = type("H", (_Recorder,), {"seen": seen, "redirect_to": redirect_to})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen, port


@pytest.fixture
def redirect_pair() -> Iterator[tuple[int, list[dict[str, str]], list[dict[str, str]]]]:
    """(port of a server redirecting to another origin, what it saw, what the other origin saw)."""
    target, target_seen, target_port = _serve()
    front, front_seen, front_port = _serve(redirect_to=f"http://localhost:{target_port}")  # another origin
    try:
        yield front_port, front_seen, target_seen
    finally:
        front.shutdown()
        target.shutdown()


def _doq(*args: str, key: str = KEY) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOQ_KEY": key}
    return subprocess.run([sys.executable, "-m", "doq", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["keys", "list"], ["queues", "list"], ["cluster", "status"]])
def test_the_cli_refuses_to_send_a_key_over_plain_http_to_a_remote_host(command: list[str]) -> None:
    r = _doq(*command, "--server", f"http://{FAR}:8000", "--connect-timeout", "60")
    assert r.returncode != 0
    assert "in clear" in r.stderr and f"https://{FAR}:8000" in r.stderr, r.stderr
    assert KEY not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_the_cli_sends_the_key_to_loopback_http_but_not_across_a_redirect(redirect_pair: Any) -> None:
    front_port, front_seen, target_seen = redirect_pair
    r = _doq("keys", "list", "--json", "--server", f"http://127.0.0.1:{front_port}")
    assert r.returncode == 0, r.stderr
    assert front_seen and front_seen[0].get("authorization") == f"Bearer {KEY}"  # loopback http: sent
    assert target_seen and "authorization" not in target_seen[0]  # the other origin: never


def test_cluster_client_refuses_plain_http_and_strips_the_key_on_a_cross_origin_redirect(
        redirect_pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from doq import cluster_client as cc

    monkeypatch.setenv("DOQ_KEY", KEY)
    with pytest.raises(cc.ClusterError) as e:
        cc.request_json(f"http://{FAR}:8000", "GET", "/cluster", timeout_s=60)
    assert not e.value.retryable and e.value.reason == "KEY_IN_CLEAR" and "https://" in str(e.value)
    front_port, front_seen, target_seen = redirect_pair
    assert cc.request_json(f"127.0.0.1:{front_port}", "GET", "/API/v1/keys").body == {"keys": [], "queues": []}
    assert front_seen[0].get("authorization") == f"Bearer {KEY}"
    assert "authorization" not in target_seen[0]


def test_a_joining_node_with_a_key_does_not_send_it_in_clear(tmp_path: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "doq", "serve", "--data-dir", str(tmp_path), "--node-id", "node-2",
         "--grpc-addr", f"127.0.0.1:{free_port()}", "--http-addr", f"127.0.0.1:{free_port()}",
         "--raft-addr", f"127.0.0.1:{free_port()}", "--join", f"{FAR}:8000"],
        env={**os.environ, "DOQ_KEY": KEY}, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "in clear" in r.stdout + r.stderr, r.stdout + r.stderr
    assert KEY.split("_", 2)[2] not in r.stdout + r.stderr


def test_the_python_client_refuses_a_key_over_plaintext_grpc_to_a_remote_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from doq_client import AsyncDoqClient, DoqClient, InvalidArgument
    from doq_client.client import _open_channel

    for make in (lambda: DoqClient(f"{FAR}:10000", key=KEY), lambda: AsyncDoqClient(f"127.0.0.1:1,{FAR}:10000", key=KEY)):
        with pytest.raises(InvalidArgument) as e:
            make()
        assert e.value.reason == "KEY_IN_CLEAR" and "ca_file" in str(e.value) and KEY not in str(e.value)
    monkeypatch.setenv("DOQ_KEY", KEY)  # the key from the environment, too
    with pytest.raises(InvalidArgument):
        DoqClient("[2001:db8::1]:10000")
    with pytest.raises(InvalidArgument):  # a leader learned later (its address from the cluster)
        _open_channel(f"{FAR}:10000", None, KEY)
    DoqClient("localhost:10000", key=KEY).close()  # loopback: fine (nothing sent until a call)
    DoqClient(f"{FAR}:10000", key="").close()  # no key ("" overrides $DOQ_KEY): fine
    monkeypatch.delenv("DOQ_KEY")
    DoqClient(f"{FAR}:10000").close()


def test_the_open_identity_request_carries_no_key(redirect_pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /cluster/identity` (open: a start probe reads it) goes without the key, so a
    probe of a plain-http member is not refused for a key it does not need."""
    from doq import cluster_client as cc
    from doq.client_cli import _Opener, use_key

    monkeypatch.setenv("DOQ_KEY", KEY)
    _, _, target_seen = redirect_pair
    srv, seen, port = _serve()
    try:
        use_key(None)  # as the CLI does: every urllib request of the process would carry it
        with pytest.raises(cc.ClusterError) as e:  # not refused for the key: it is not sent
            cc.get_identity(f"http://{FAR}:8000", timeout_s=0.5)
        assert e.value.reason != "KEY_IN_CLEAR"
        with pytest.raises(cc.ClusterError):
            cc.get_identity(f"127.0.0.1:{port}")  # answers {} (not an identity): refused as a bad answer
        assert seen and "authorization" not in seen[0]
    finally:
        srv.shutdown()
        import urllib.request
        _Opener.key = ""  # this test process's opener: as before
        urllib.request.install_opener(None)  # type: ignore[arg-type]
