"""`doq serve` processes on 127.0.0.1 for chaos runs, and where their leader is.

A `NodeProcess` keeps its ports and data directory across restarts, so a restarted node
comes back at the same addresses with its own data. Signals go only to the pid of the
process this object started. `Cluster` starts one node (a one-node cluster) or several
(the first bootstraps, the others `--join` it) and finds the leader through `GET /cluster`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doq.ports import free_port

#: how a node is started unless told otherwise: this interpreter, `-m doq`
DEFAULT_SERVER_CMD = (sys.executable, "-m", "doq")
HTTP_TIMEOUT_S = 1.0


class HarnessError(RuntimeError):
    """The run could not be carried out (a node would not start, no cluster formed)."""


@dataclass
class NodeProcess:
    """One `doq serve` child process, its fixed addresses and its data directory."""

    node_id: str
    data_dir: Path
    join: str = ""  # HTTP HOST:PORT of a member to join ("" = bootstrap / own data)
    server_cmd: Sequence[str] = DEFAULT_SERVER_CMD
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    raft_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.node_id}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start the process (appending to its log) and wait until `/readyz` answers 200."""
        if self.alive:
            raise HarnessError(f"{self.node_id} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*self.server_cmd, "serve", "--node-id", self.node_id, "--data-dir", str(self.data_dir),
               "--grpc-addr", self.grpc_addr, "--http-addr", self.http_addr,
               "--raft-addr", f"127.0.0.1:{self.raft_port}"]
        if self.join:
            cmd += ["--join", self.join]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.paused = False
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise HarnessError(f"{self.node_id} exited during start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.http_addr}/readyz", timeout=HTTP_TIMEOUT_S) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise HarnessError(f"{self.node_id} not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def kill9(self) -> None:
        """SIGKILL our process and reap it (a paused process dies too)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP our process."""
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT our process."""
        if self.alive and self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode(errors="replace")
        except OSError:
            return ""

    def cluster_status(self) -> dict[str, Any] | None:
        """This node's `GET /cluster` JSON, or None (down, paused, no answer). Raises
        HarnessError if the server has no such endpoint (a doq without clustering)."""
        if not self.alive or self.paused:
            return None
        try:
            with urllib.request.urlopen(f"http://{self.http_addr}/cluster", timeout=HTTP_TIMEOUT_S) as r:
                doc = json.load(r)
                return doc if isinstance(doc, dict) else None
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise HarnessError(f"{self.node_id} has no GET /cluster: this doq runs no cluster") from None
            return None
        except (OSError, ValueError):
            return None


class Cluster:
    """`n` nodes under `root` (node-1 bootstraps; the others join it)."""

    def __init__(self, root: Path, n: int, server_cmd: Sequence[str] = DEFAULT_SERVER_CMD) -> None:
        self.nodes: list[NodeProcess] = []
        for i in range(1, n + 1):
            join = self.nodes[0].http_addr if self.nodes else ""
            self.nodes.append(NodeProcess(f"node-{i}", root / "data", join, server_cmd))

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start every node; with several, wait until they formed one cluster (all voters,
        a leader): a fault injected while one is still a learner could leave no quorum."""
        for node in self.nodes:
            node.start(ready_timeout_s)
        if len(self.nodes) > 1:
            self._wait_formed(ready_timeout_s)

    def _wait_formed(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        want = {n.node_id for n in self.nodes}
        seen: Any = None
        while time.monotonic() < deadline:
            seen = self.nodes[0].cluster_status()
            voters = {str(m.get("node_id")) for m in (seen or {}).get("members", []) if m.get("role") == "voter"}
            if seen and voters >= want and seen.get("leader_id"):  # learners promoted
                return
            time.sleep(0.2)
        raise HarnessError(f"the {len(self.nodes)} nodes did not form one cluster within "
                           f"{timeout_s:.0f} s (GET /cluster of node-1: {seen!r})")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill9()

    def by_id(self, node_id: str) -> NodeProcess | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def leader(self) -> NodeProcess | None:
        """The leader as a live node reports it; a lone node is its own leader."""
        if len(self.nodes) == 1:
            return self.nodes[0] if self.nodes[0].alive and not self.nodes[0].paused else None
        for node in self.nodes:
            status = node.cluster_status()
            if status and status.get("leader_id"):
                leader = self.by_id(str(status["leader_id"]))
                if leader is not None and leader.alive and not leader.paused:
                    return leader
        return None

    def wait_leader(self, timeout_s: float) -> NodeProcess | None:
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader()
            if leader is not None or time.monotonic() >= deadline:
                return leader
            time.sleep(0.1)
