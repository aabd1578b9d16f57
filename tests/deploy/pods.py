"""Start the StatefulSet's pods as local processes: the exact command and environment of the
container spec the Pulumi program declares, resolved as kubelet does (downward API fields,
`$(VAR)` references), with 127.0.0.1 standing in for the DNS names and for 0.0.0.0, each
pod's ports mapped to free local ones (all pods share the same ports in Kubernetes, not on
one machine), its volume a directory, and the in-cluster API a local fake."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.proc import free_port

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubelet_env(container: dict[str, Any], pod: str, namespace: str) -> dict[str, str]:
    """The container's environment as kubelet builds it: `fieldRef`s of the downward API,
    `$(VAR)` expanded from the variables defined before it (`$$` is a `$`)."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = _REF.sub(
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), var.get("value", ""))
    return env


@dataclass
class LocalPod:
    """One pod of the StatefulSet as a local process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[int, int]  # container port -> local port
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def local_port(self, container: dict[str, Any], port: int | str) -> int:
        """A probe's or a Service's port (a number or a container port's name), locally."""
        if isinstance(port, str):
            [port] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
        return self.ports[int(port)]

    def start(self) -> LocalPod:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def get(self, port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read()

    def wait_http(self, port: int, path: str, timeout_s: float = 60.0) -> bytes:
        """Wait for `path` to answer 200 (bounded), failing at once if the process died."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, body = self.get(port, path)
                if status == 200:
                    return body
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {path} not 200 in {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self, timeout_s: float) -> int:
        """SIGTERM (as kubelet stops a pod) and wait up to `timeout_s`."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class LocalStatefulSet:
    """The pods of `statefulset` (a manifest) on this machine. `api_env` is the in-cluster
    API as the pods see it (KUBERNETES_SERVICE_HOST/PORT and where the token is)."""

    statefulset: dict[str, Any]
    root: Path
    api_env: dict[str, str]
    translated: dict[str, set[str]] = field(default_factory=dict)  # pod -> variables rewritten

    @property
    def container(self) -> dict[str, Any]:
        [c] = self.statefulset["spec"]["template"]["spec"]["containers"]
        return c  # type: ignore[no-any-return]

    def pods(self) -> list[LocalPod]:
        sts = self.statefulset
        namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        service = sts["spec"]["serviceName"]
        names = [f"{name}-{i}" for i in range(sts["spec"]["replicas"])]
        ports = {pod: {p["containerPort"]: free_port() for p in self.container["ports"]} for pod in names}
        [data] = [m["mountPath"] for m in self.container["volumeMounts"] if m["name"] == "data"]
        dns = re.compile(rf"\b({'|'.join(names)})\.{re.escape(service)}\.{re.escape(namespace)}\.svc\b(?::(\d+))?")

        def local(pod: str, value: str) -> str:
            value = dns.sub(lambda m: "127.0.0.1" + (f":{ports[m[1]][int(m[2])]}" if m[2] else ""), value)
            return re.sub(r"\b0\.0\.0\.0:(\d+)", lambda m: f"127.0.0.1:{ports[pod][int(m[1])]}", value)

        out = []
        for pod in names:
            volume = self.root / f"{data.strip('/').replace('/', '-')}-{pod}"
            volume.mkdir(parents=True, exist_ok=True)
            env = {}
            for k, v in kubelet_env(self.container, pod, namespace).items():
                new = str(volume) if v == data else local(pod, v)
                if new != v:
                    self.translated.setdefault(pod, set()).add(k)
                env[k] = new
            bin_dir = str(Path(sys.executable).parent)  # `doq` and python of this venv
            base = {k: os.environ[k] for k in ("PYTHONPATH", "HOME", "LANG") if k in os.environ}
            argv = [*self.container["command"], *self.container.get("args", [])]
            out.append(LocalPod(pod, argv, {**base, "PATH": f"{bin_dir}:/usr/bin:/bin", **self.api_env, **env},
                                ports[pod], self.root / f"{pod}.log"))
        return out
