"""Start the StatefulSet's pods as local processes: the exact command and environment of the
container spec the Pulumi program declares, resolved as kubelet does (downward API fields,
`$(VAR)` references), with 127.0.0.1 standing in for the DNS names and for 0.0.0.0, each
pod's ports mapped to free local ones (all pods share the same ports in Kubernetes, not on
one machine), its volume a directory, each Secret volume a directory holding the Secret's
files as kubelet writes them (mode `defaultMode`), `secretKeyRef` variables the Secret's
value, and the in-cluster API a local fake. The pods serve HTTPS (the Pulumi program makes
them secure): `LocalPod.call` speaks it, verified with the Secret's CA, with the admin key."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
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


def kubelet_env(container: dict[str, Any], pod: str, namespace: str,
                secrets: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """The container's environment as kubelet builds it: `fieldRef`s of the downward API,
    `secretKeyRef`s from `secrets` (name -> data), `$(VAR)` expanded from the variables
    defined before it (`$$` is a `$`)."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var and "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = (secrets or {})[ref["name"]][ref["key"]]
        elif "valueFrom" in var:
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
    ca_file: Path | None = None  # the CA the pods' certificates are signed with (None: plain HTTP)
    key: str = ""  # the client key of `call` (the admin key the pod was given)
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

    def _url(self, port: int, path: str) -> tuple[str, ssl.SSLContext | None]:
        if self.ca_file is None:
            return f"http://127.0.0.1:{port}{path}", None
        return f"https://127.0.0.1:{port}{path}", ssl.create_default_context(cafile=str(self.ca_file))

    def get(self, port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
        """GET without a key (as kubelet probes)."""
        url, ctx = self._url(port, path)
        try:
            with urllib.request.urlopen(url, timeout=timeout_s, context=ctx) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read()

    def call(self, port: int, method: str, path: str, body: Any = None, timeout_s: float = 30,
             key: str | None = None) -> tuple[int, Any]:
        """A JSON request as a client: HTTPS verified with the CA, `key` (default the pod's
        admin key; "" none) as the bearer token."""
        url, ctx = self._url(port, path)
        headers = {"Content-Type": "application/json"}
        if key := self.key if key is None else key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as r:
                raw = r.read()
                return int(r.status), json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return int(e.code), json.loads(e.read() or b"null")

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

    def wait_key_accepted(self, port: int, timeout_s: float = 60.0) -> None:
        """Wait until the pod accepts its key (the bootstrap registers the admin key through
        Raft once it leads: a moment after it is ready)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, body = self.call(port, "GET", "/API/v1/keys", timeout_s=5)
            except OSError as e:
                status, body = 0, str(e)
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: the key is not accepted in {timeout_s}s: {status} {body}\n{self.log()}")
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
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # Secret name -> its data
    translated: dict[str, set[str]] = field(default_factory=dict)  # pod -> variables rewritten
    secret_dirs: dict[str, Path] = field(default_factory=dict)  # Secret name -> its local volume (after pods())

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
        secret_dirs = self._secret_volumes()  # mount path -> local directory (the same for every pod)
        dns = re.compile(rf"\b({'|'.join(names)})\.{re.escape(service)}\.{re.escape(namespace)}\.svc\b(?::(\d+))?")

        def local(pod: str, value: str) -> str:
            value = dns.sub(lambda m: "127.0.0.1" + (f":{ports[m[1]][int(m[2])]}" if m[2] else ""), value)
            return re.sub(r"\b0\.0\.0\.0:(\d+)", lambda m: f"127.0.0.1:{ports[pod][int(m[1])]}", value)

        out = []
        for pod in names:
            volume = self.root / f"{data.strip('/').replace('/', '-')}-{pod}"
            volume.mkdir(parents=True, exist_ok=True)
            env = {}
            for k, v in kubelet_env(self.container, pod, namespace, self.secrets).items():
                new = str(volume) if v == data else local(pod, v)
                for mount, directory in secret_dirs.items():
                    if new == mount or new.startswith(mount + "/"):
                        new = str(directory) + new[len(mount):]
                if new != v:
                    self.translated.setdefault(pod, set()).add(k)
                env[k] = new
            bin_dir = str(Path(sys.executable).parent)  # `doq` and python of this venv
            base = {k: os.environ[k] for k in ("PYTHONPATH", "HOME", "LANG") if k in os.environ}
            argv = [*self.container["command"], *self.container.get("args", [])]
            ca = [d / "ca.crt" for d in secret_dirs.values() if (d / "ca.crt").exists()]
            out.append(LocalPod(pod, argv, {**base, "PATH": f"{bin_dir}:/usr/bin:/bin", **self.api_env, **env},
                                ports[pod], self.root / f"{pod}.log", ca[0] if ca else None, env.get("DOQ_KEY", "")))
        return out

    def _secret_volumes(self) -> dict[str, Path]:
        """Write each Secret volume's files as kubelet lays them out (`write_secret`) into a
        local directory; mount path -> directory."""
        volumes = {v["name"]: v["secret"] for v in self.statefulset["spec"]["template"]["spec"]["volumes"]
                   if "secret" in v}
        out = {}
        for m in self.container["volumeMounts"]:
            if m["name"] not in volumes:
                continue
            source = volumes[m["name"]]
            directory = self.root / f"secret-{source['secretName']}"
            write_secret(directory, self.secrets[source["secretName"]], source.get("defaultMode", 0o644))
            out[m["mountPath"]] = directory
        self.secret_dirs = {volumes[m["name"]]["secretName"]: out[m["mountPath"]]
                            for m in self.container["volumeMounts"] if m["name"] in volumes}
        return out

    def update_secret(self, name: str, data: dict[str, str]) -> None:
        """Replace Secret `name`'s files in every pod's volume at once, as kubelet does when
        the Secret changes (the pods keep running)."""
        [source] = [v["secret"] for v in self.statefulset["spec"]["template"]["spec"]["volumes"]
                    if v.get("secret", {}).get("secretName") == name]
        write_secret(self.secret_dirs[name], data, source.get("defaultMode", 0o644))


def write_secret(directory: Path, data: dict[str, str], mode: int) -> None:
    """A Secret volume as kubelet's atomic writer keeps it: the files in a fresh hidden
    directory, `..data` a symlink to it, each key a symlink through `..data`. A change
    writes a new directory and swaps `..data` in one rename, so a reader sees the old set
    or the new one, never a mix."""
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir()
    for key, value in data.items():
        path = version / key
        path.write_text(value)
        path.chmod(mode)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version.name)
    os.replace(tmp, directory / "..data")
    for key in data:
        if not (directory / key).is_symlink():
            (directory / key).symlink_to(Path("..data") / key)
    if old:
        shutil.rmtree(directory / old)
