"""A local fake of the Kubernetes API for the node's leader label: a real HTTPS server on
127.0.0.1 (its own CA, made with the `openssl` command) that records every request, applies
JSON merge patches to the labels of the pods it knows, and can be told to fail."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

POD_PATH = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)")


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, object]
    status: int  # what the fake answered


def make_credentials(root: Path, *, token: str = "token-1", namespace: str = "doq") -> Path:
    """`root/serviceaccount`, a service account directory as kubelet mounts it (token,
    ca.crt, namespace), and `root/tls`, the server's key and certificate for 127.0.0.1 signed
    by that CA. Returns `root`."""
    sa = root / "serviceaccount"
    sa.mkdir(parents=True)
    tls = root / "tls"
    tls.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fake-k8s-ca",
            "-keyout", str(tls / "ca.key"), "-out", str(sa / "ca.crt"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(tls / "server.key"), "-out", str(tls / "server.csr"))
    (tls / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(tls / "server.csr"), "-CA", str(sa / "ca.crt"),
            "-CAkey", str(tls / "ca.key"), "-CAcreateserial", "-days", "2",
            "-extfile", str(tls / "ext.cnf"), "-out", str(tls / "server.crt"))
    (sa / "token").write_text(token + "\n")
    (sa / "namespace").write_text(namespace)
    return root


class FakeKubeApi:
    """Pods are `(namespace, name) -> labels`; `fail_next` holds statuses to answer (in order)
    before any patch succeeds again (0: close the connection without an answer). While
    `hold` is clear, requests wait unanswered (`held` counts them)."""

    def __init__(self, tls_dir: Path, pods: dict[tuple[str, str], dict[str, str]]) -> None:
        self.pods = pods
        self.requests: list[Recorded] = []
        self.fail_next: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.held = 0
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls_dir / "server.crt"), str(tls_dir / "server.key"))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def labels(self, namespace: str, pod: str) -> dict[str, str]:
        with self.lock:
            return dict(self.pods[(namespace, pod)])

    def wait_for(self, predicate: object, timeout_s: float = 30.0) -> None:
        """Wait until `predicate()` holds (checked after every request and every 50 ms: it may
        look at the client too), bounded."""
        assert callable(predicate)
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left > 0:
                    self.changed.wait(min(left, 0.05))
                    continue
                raise AssertionError(f"fake Kubernetes API: condition not met in {timeout_s}s; "
                                     f"requests: {self.requests}")

    def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, object]]:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"unparsable": raw.decode(errors="replace")}
        if not self.hold.is_set():
            with self.changed:
                self.held += 1
                self.changed.notify_all()
            self.hold.wait(60)
            with self.changed:
                self.held -= 1
        with self.changed:
            status = self.fail_next.pop(0) if self.fail_next else 200
            m = POD_PATH.fullmatch(path)
            if status == 200:
                if method != "PATCH" or m is None:
                    status = 405
                elif (m[1], m[2]) not in self.pods:
                    status = 404
                elif headers.get("content-type") != "application/merge-patch+json":
                    status = 415
                else:
                    labels = self.pods[(m[1], m[2])]
                    for k, v in body.get("metadata", {}).get("labels", {}).items():  # type: ignore[union-attr]
                        if v is None:
                            labels.pop(k, None)
                        else:
                            labels[k] = v
            self.requests.append(Recorded(method, path, headers, body, status))
            self.changed.notify_all()
            answer: dict[str, object] = (
                {"kind": "Pod", "metadata": {"name": m[2], "labels": dict(self.pods[(m[1], m[2])])}}
                if status == 200 and m else {"kind": "Status", "code": status})
            return status, answer

    def start(self) -> FakeKubeApi:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


def _handler(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, answer = api._answer(self.command, self.path, headers, raw)
            if status == 0:  # no answer at all
                self.close_connection = True
                return
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_PATCH = do_GET = do_POST = do_PUT = _any

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def fake_kube_api(root: Path, pods: dict[tuple[str, str], dict[str, str]]) -> Iterator[tuple[FakeKubeApi, Path]]:
    """(the running fake, the service account directory its clients use); `root` is what
    `make_credentials` made."""
    sa = root / "serviceaccount"
    api = FakeKubeApi(root / "tls", pods).start()
    try:
        yield api, sa
    finally:
        api.stop()
