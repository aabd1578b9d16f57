"""Start and stop real `doq serve` processes on 127.0.0.1 for integration tests.

A secure node (`--secure`, or `--join-token`: TLS on every port and keys required) is
spoken to over HTTPS and gRPC over TLS, verified with the cluster CA it holds in
`<data_dir>/<node_id>/tls/ca.crt` (`NodeProc.ca_file`, `ssl_context`, `grpc_channel`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from doq.ports import free_port

_BIND_ATTEMPTS = 5
_PORT_TAKEN = ("Address already in use", "address already in use", "Failed to bind")


@contextlib.contextmanager
def refused_addr() -> Iterator[str]:
    """An address on 127.0.0.1 where nothing listens while the block runs: this process
    holds its port bound without listening, so a connection there is refused and no other
    process can take the port (a port merely chosen free could be taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _lost_a_port(log: str) -> bool:
    """The node's log says it could not listen on one of its ports."""
    return any(s in log for s in _PORT_TAKEN)


@dataclass
class NodeProc:
    """A `doq serve` child process and its addresses."""

    data_dir: Path
    node_id: str = "node-1"
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    raft_port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    umask: int | None = None  # the child's umask (None: this process's)
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    _started: bool = field(default=False, repr=False)  # was ready once: its ports are its identity

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def secure(self) -> bool:
        """Started secure: TLS on every port, keys required (the node's own rule for these
        flags on 127.0.0.1, `doq.auth.mode.runs_secure`)."""
        return "--insecure" not in self.extra_args and any(
            a in ("--secure", "--join-token") for a in self.extra_args)

    @property
    def ca_file(self) -> Path:
        """The cluster CA certificate this node holds (made on a bootstrap, received when
        it enrolled with a join token)."""
        return self.data_dir / self.node_id / "tls" / "ca.crt"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.http_port}"

    def ssl_context(self, ca_file: Path | None = None) -> ssl.SSLContext | None:
        """What verifies this node over HTTPS (None for a plain node): `ca_file`, else the CA
        it holds."""
        if not self.secure:
            return None
        return ssl.create_default_context(cafile=str(ca_file or self.ca_file))

    def urlopen(self, req: urllib.request.Request | str, timeout: float = 60) -> Any:
        """urllib.request.urlopen of this node, over HTTPS verified with its CA when secure."""
        return urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context())

    def grpc_channel(self, ca_file: Path | None = None) -> grpc.Channel:
        """A channel to this node's gRPC port: TLS verified with `ca_file` (default: the CA it
        holds) when it is secure, plain otherwise."""
        if not self.secure:
            return grpc.insecure_channel(self.grpc_addr)
        creds = grpc.ssl_channel_credentials(root_certificates=(ca_file or self.ca_file).read_bytes())
        return grpc.secure_channel(self.grpc_addr, creds)

    def start(self, timeout_s: float = 90.0) -> NodeProc:
        """Launch the process and wait until it is ready (killed if it does not get ready:
        a failed start leaves no process behind). The wait ends as soon as `/readyz`
        answers; its bound is wide because a loaded machine once took over 30 s to bring a
        lone `doq serve` up to its first log line.

        A port chosen free can be taken by another process before the node binds it (suites
        run side by side): a first start that fails for want of one of its ports is tried
        again on fresh ports; a restart (its addresses are part of the cluster) is tried
        again on the same ports, which the other listener may have left meanwhile."""
        first = not self._started
        for attempt in range(_BIND_ATTEMPTS):
            log_mark = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
            self.launch()
            try:
                self.wait_ready(timeout_s)
            except RuntimeError:
                self.kill9()
                if attempt + 1 == _BIND_ATTEMPTS or not _lost_a_port(self.log()[log_mark:]):
                    raise
                if first:
                    self.grpc_port, self.http_port, self.raft_port = free_port(), free_port(), free_port()
                else:
                    time.sleep(1)
                continue
            except BaseException:
                self.kill9()
                raise
            return self
        raise AssertionError("unreachable")

    def launch(self) -> NodeProc:
        """Start the process without waiting (a restarted cluster member is ready only once
        a quorum of its cluster runs: launch them all, then `wait_ready` each)."""
        if self.log_path is None:
            self.log_path = self.data_dir / f"{self.node_id}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "doq", "serve",
            "--node-id", self.node_id,
            "--data-dir", str(self.data_dir),
            "--grpc-addr", self.grpc_addr,
            "--http-addr", f"127.0.0.1:{self.http_port}",
            "--raft-addr", f"127.0.0.1:{self.raft_port}",
            *self.extra_args,
        ]
        logf = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                     umask=-1 if self.umask is None else self.umask)
        logf.close()
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"doq serve exited with {self.proc.returncode}:\n{self.log()}")
            try:  # a secure joiner holds the CA only once it has enrolled
                if not self.secure or self.ca_file.exists():
                    with self.urlopen(self.http_url + "/readyz", timeout=1) as r:
                        if r.status == 200:
                            self._started = True
                            return
            except (OSError, ssl.SSLError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"doq serve not ready in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def kill9(self) -> None:
        """SIGKILL the process (only ours, by pid) and reap it."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)


@contextlib.contextmanager
def running_node(data_dir: Path, **kw: object) -> Iterator[NodeProc]:
    node = NodeProc(data_dir, **kw).start()  # type: ignore[arg-type]
    try:
        yield node
    finally:
        node.kill9()
