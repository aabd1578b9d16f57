"""Three `doq:0.1.0` containers run as the StatefulSet runs its pods (START_SCRIPT and the
pod's DOQ_* environment from the Pulumi program, read-only root, uid 10001, a volume each,
host network with each pod's ports mapped to free ports on 127.0.0.1, the program's Secrets
mounted read-only where the pods mount them; no API server, so no leader label): they form
the (secure) cluster; a follower is killed, its volume wiped, started
again; all are stopped, doq-0's volume wiped, all started at once. Prints the figures of
docs/deploy.md. Needs a Docker engine and the image (`docker build -t doq:0.1.0 .`):

    PYTHONPATH=.:clients/python python tests/deploy/containers.py

A tool, not a test (pytest does not collect it): the same runs with plain processes are
tests/deploy/test_statefulset_rejoin.py.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.deploy.pods import LocalPod, LocalStatefulSet, kubelet_env
from tests.deploy.program import deploy

IMAGE = "doq:0.1.0"


class Containers:
    def __init__(self, root: Path) -> None:
        d = deploy()
        local = LocalStatefulSet(d.one("StatefulSet"), root / "secrets", secrets=d.secrets, api_env={})
        self.pods = {p.name: p for p in local.pods()}
        self.script = local.container["command"][-1]
        self.kubelet_env = {p.name: kubelet_env(local.container, p.name, "doq", d.secrets) for p in self.pods.values()}
        # the Secret volumes: mount path in the pod -> the local directory with its files
        self.secret_mounts = {m["mountPath"]: root / "secrets" / f"secret-{v['secret']['secretName']}"
                              for m in local.container["volumeMounts"]
                              for v in d.pod_template["spec"]["volumes"] if v["name"] == m["name"] and "secret" in v}
        for directory in self.secret_mounts.values():
            for f in directory.iterdir():
                f.chmod(0o444)  # kubelet: root-owned, readable by the pod's fsGroup; here any uid
        self.http = {name: p.local_port(local.container, "http") for name, p in self.pods.items()}
        self.volumes = {name: root / name for name in self.pods}
        for v in self.volumes.values():
            self._fresh(v)

    @staticmethod
    def _fresh(volume: Path) -> None:
        shutil.rmtree(volume, ignore_errors=True)
        volume.mkdir(parents=True)
        volume.chmod(0o777)  # the container's uid 10001 writes it

    def wipe(self, name: str) -> None:
        self._fresh(self.volumes[name])

    def run(self, pod: LocalPod) -> None:
        subprocess.run(["docker", "rm", "-f", pod.name], capture_output=True)
        args = ["docker", "run", "-d", "--name", pod.name, "--network", "host", "--read-only",
                "--tmpfs", "/tmp", "--user", "10001:10001", "-v", f"{self.volumes[pod.name]}:/var/lib/doq"]
        for mount, directory in self.secret_mounts.items():
            args += ["-v", f"{directory}:{mount}:ro"]
        in_pod = self.kubelet_env[pod.name]
        for k, v in pod.env.items():
            if k.startswith("DOQ_") and (not k.startswith("DOQ_K8S_") or k == "DOQ_K8S_TLS_DIR"):
                # paths as the pod sees them; addresses as mapped to this machine
                args += ["-e", f"{k}={in_pod[k] if k in ('DOQ_DATA_DIR', 'DOQ_K8S_TLS_DIR', 'DOQ_ADMIN_KEY_FILE') else v}"]
        subprocess.run([*args, "--entrypoint", "/bin/sh", IMAGE, "-c", self.script], check=True, capture_output=True)

    def docker(self, *args: str) -> None:
        subprocess.run(["docker", *args], check=True, capture_output=True)

    def get(self, name: str, path: str, body: Any = None) -> tuple[int, Any]:
        """GET (POST with `body`) over HTTPS verified with the Secret's CA, with the admin key."""
        try:
            return self.pods[name].call(self.http[name], "GET" if body is None else "POST", path, body, timeout_s=5)
        except OSError:
            return 0, None

    def ready(self, names: list[str] | None = None) -> bool:
        return all(self.get(n, "/readyz")[0] == 200 for n in names or self.http)

    def three_voters(self) -> bool:
        for n in self.http:
            status, body = self.get(n, "/cluster")
            if status != 200 or sorted(m["node_id"] for m in body["members"] if m["role"] == "voter") != sorted(self.http):
                return False
        return True

    def leader(self) -> str:
        ids = {(self.get(n, "/cluster")[1] or {}).get("leader_id", "") for n in self.http}
        return ids.pop() if len(ids) == 1 and "" not in ids else ""

    def equal_digests(self) -> bool:
        got = [self.get(n, "/db/digest")[1] for n in self.http]
        return all(got) and len({(b["digest"], b["applied_index"]) for b in got}) == 1

    def cluster_ids(self) -> set[str]:
        return {(self.get(n, "/cluster")[1] or {}).get("cluster_id", "?") for n in self.http}

    def total(self, name: str) -> int:
        return int(self.get(name, "/API/v1/queues/jobs")[1]["stats"]["total"])

    def write(self, leader: str, prefix: str, count: int) -> int:
        return sum(self.get(leader, "/API/v1/queues/jobs/messages", {"content": f"{prefix}{i}"})[0] == 201
                   for i in range(count))


def until(fn: Callable[[], Any], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if v := fn():
            return v
        time.sleep(0.05)
    raise SystemExit(f"not within {timeout_s}s: {fn}")


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="doq-containers-"))
    cs = Containers(root)
    try:
        t0 = time.monotonic()
        for pod in cs.pods.values():
            cs.run(pod)
        until(lambda: cs.ready() and cs.three_voters())
        print(f"formed: three containers, three voters, all ready in {time.monotonic() - t0:.2f}s")
        leader = until(cs.leader)
        assert cs.get(leader, "/API/v1/queues", {"name": "jobs", "type": "delayed"})[0] == 201
        acked = cs.write(leader, "m", 300)

        follower = next(n for n in cs.http if n != leader)
        cs.docker("kill", follower)
        cs.wipe(follower)
        acked += cs.write(leader, "n", 100)
        t0 = time.monotonic()
        cs.docker("start", follower)
        until(lambda: cs.ready([follower]))
        ready_s = time.monotonic() - t0
        until(lambda: cs.three_voters() and cs.equal_digests())
        logs = subprocess.run(["docker", "logs", follower], capture_output=True, text=True)
        print(f"wiped follower {follower}: ready {ready_s:.2f}s after docker start, a voter with an equal "
              f"digest after {time.monotonic() - t0:.2f}s; acknowledged {acked}, on it {cs.total(follower)}; "
              f"InvariantError in its log: {'InvariantError' in logs.stdout + logs.stderr}")

        [cluster_id] = cs.cluster_ids()
        for n in cs.http:
            cs.docker("stop", n)
        cs.wipe("doq-0")
        t0 = time.monotonic()
        starts = [subprocess.Popen(["docker", "start", n], stdout=subprocess.DEVNULL) for n in cs.http]
        for p in starts:
            p.wait()
        until(lambda: cs.ready() and cs.three_voters() and cs.equal_digests())
        print(f"all stopped, doq-0 wiped, all started at once: ready with equal digests in "
              f"{time.monotonic() - t0:.2f}s; one cluster id as before: {cs.cluster_ids() == {cluster_id}}; "
              f"acknowledged {acked}, readable {[cs.total(n) for n in cs.http]}")
        size = subprocess.run(["docker", "images", IMAGE, "--format", "{{.Size}}"], capture_output=True, text=True)
        print(f"image {IMAGE}: {size.stdout.strip()}")
    finally:
        for n in cs.http:
            subprocess.run(["docker", "rm", "-f", n], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
