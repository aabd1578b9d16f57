"""The StatefulSet's pods lose volumes: real `doq` processes started with the exact command
(`START_SCRIPT`: `doq k8s-start`) and environment the Pulumi program declares (127.0.0.1 for
the doq-internal names, free local ports, a directory per volume, a local fake of the
Kubernetes API), all at once as podManagementPolicy Parallel starts them.

1. kill -9 of a follower, its volume wiped, the pod started again: ready again (the time
   is printed), the same `GET /db/digest` as the others, no InvariantError;
2. all pods stopped, doq-0's volume wiped, all three started at once: one cluster id
   everywhere (doq-0 joined instead of bootstrapping a second cluster), every
   acknowledged write readable;
3. the same with doq-0 the leader before the stop (kill -9 of all: no handover);
4. every volume wiped: a new cluster forms.

The pods run secure with the Secrets the program generates: HTTPS (the seed asks the
others over HTTPS), mutual TLS between them, the admin key (registered by each bootstrap,
the new cluster's too).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.fake_k8s import fake_kube_api, make_credentials
from tests.deploy.pods import LocalPod, LocalStatefulSet
from tests.deploy.program import deploy
from tests.support.cluster import until

pytestmark = pytest.mark.integration
NS = "doq"
NAMES = ["doq-0", "doq-1", "doq-2"]


@dataclass
class Pods:
    by_name: dict[str, LocalPod]
    http: dict[str, int]
    volumes: dict[str, Path]
    ready_path: str

    def call(self, name: str, method: str, path: str, body: Any = None, timeout_s: float = 30) -> tuple[int, Any]:
        """As a client of pod `name`: HTTPS verified with the Secret's CA, the admin key."""
        return self.by_name[name].call(self.http[name], method, path, body, timeout_s)

    def get(self, name: str, path: str) -> tuple[int, Any]:
        try:
            return self.call(name, "GET", path, timeout_s=5)
        except OSError:
            return 0, None

    def start_all(self) -> None:
        for p in self.by_name.values():  # all at once (Parallel)
            p.start()

    def wait_ready(self, names: list[str] | None = None, timeout_s: float = 120) -> None:
        for n in names or NAMES:
            p = self.by_name[n]
            p.wait_http(self.http[n], self.ready_path, timeout_s=timeout_s)

    def leader(self) -> str:
        def agreed() -> str:
            views = {(self.get(n, "/cluster")[1] or {}).get("leader_id", "") for n in NAMES}
            return views.pop() if len(views) == 1 else ""
        return str(until("one leader all agree on", agreed, timeout_s=90))

    def voters_everywhere(self) -> bool:
        for n in NAMES:
            status, body = self.get(n, "/cluster")
            if status != 200 or sorted(m["node_id"] for m in body["members"] if m["role"] == "voter") != NAMES:
                return False
        return True

    def cluster_ids(self) -> set[str]:
        return {(self.get(n, "/cluster")[1] or {}).get("cluster_id", "?") for n in NAMES}

    def digests_equal(self) -> dict[str, Any] | None:
        got = {}
        for n in NAMES:
            status, body = self.get(n, "/db/digest")
            if status != 200:
                return None
            got[n] = (body["digest"], body["applied_index"])
        return got if len(set(got.values())) == 1 else None

    def wipe(self, name: str) -> None:
        shutil.rmtree(self.volumes[name])
        self.volumes[name].mkdir()

    def write(self, leader: str, count: int, start: int = 0) -> list[int]:
        """Enqueue `count` messages through the leader; the acknowledged ones."""
        acked = []
        for i in range(start, start + count):
            status, _ = self.call(leader, "POST", "/API/v1/queues/jobs/messages",
                              {"content": f"m-{i}", "group": "default", "priority": 1})
            if status == 201:
                acked.append(i)
        return acked

    def readable(self, name: str) -> int:
        status, body = self.get(name, "/API/v1/queues/jobs")
        assert status == 200, body
        return int(body["stats"]["total"])

    def no_failure_logged(self) -> None:
        for p in self.by_name.values():
            assert "InvariantError" not in p.log() and "stops taking requests" not in p.log(), p.log()


@contextlib.contextmanager
def statefulset(tmp_path: Path) -> Iterator[Pods]:
    d = deploy()
    sts = d.one("StatefulSet")
    pod_labels = d.pod_template["metadata"]["labels"]
    make_credentials(tmp_path / "k8s")
    with fake_kube_api(tmp_path / "k8s", {(NS, n): dict(pod_labels) for n in NAMES}) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", secrets=d.secrets, api_env={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa)})
        pods = local.pods()
        c = local.container
        ready = c["readinessProbe"]["httpGet"]
        assert c["command"][-1].strip() == "exec doq k8s-start"
        out = Pods({p.name: p for p in pods}, {p.name: p.local_port(c, "http") for p in pods},
                   {p.name: Path(p.env["DOQ_DATA_DIR"]) for p in pods}, ready["path"])
        try:
            yield out
        finally:
            for p in pods:
                p.kill()


def _formed(pods: Pods) -> str:
    pods.start_all()
    pods.wait_ready()
    until("three voters seen by every pod", pods.voters_everywhere, timeout_s=90)
    leader = pods.leader()
    assert pods.call(leader, "POST", "/API/v1/queues", {"name": "jobs", "type": "delayed"})[0] == 201
    return leader


def test_a_follower_killed_and_wiped_is_ready_again_with_the_same_digest(tmp_path: Path) -> None:
    with statefulset(tmp_path) as pods:
        leader = _formed(pods)
        acked = pods.write(leader, 200)
        victim = next(n for n in NAMES if n != leader)
        pods.by_name[victim].kill()
        pods.wipe(victim)
        acked += pods.write(leader, 50, start=200)
        t0 = time.monotonic()
        pods.by_name[victim].start()
        pods.wait_ready([victim])
        ready_s = time.monotonic() - t0
        until("three voters again", pods.voters_everywhere, timeout_s=90)
        until("equal digests", pods.digests_equal, timeout_s=60)
        voter_s = time.monotonic() - t0
        print(f"\n{victim} (wiped) ready again {ready_s:.2f}s after its start, a voter with an equal digest "
              f"after {voter_s:.2f}s")
        assert len(acked) == 250 and pods.readable(victim) == 250
        assert len(pods.cluster_ids()) == 1
        pods.no_failure_logged()


@pytest.mark.parametrize("doq0_leads", [False, True], ids=["any-leader-sigterm", "doq-0-leader-kill9"])
def test_all_stopped_doq_0_wiped_all_started_at_once_is_one_cluster_with_every_write(
        tmp_path: Path, doq0_leads: bool) -> None:
    with statefulset(tmp_path) as pods:
        leader = _formed(pods)
        if doq0_leads and leader != "doq-0":
            status, body = pods.call(leader, "POST", "/cluster/transfer-leader", {"target": "doq-0"})
            assert status == 200, body
            leader = pods.leader()
            assert leader == "doq-0"
        acked = pods.write(leader, 200)
        [cluster_id] = pods.cluster_ids()
        for p in pods.by_name.values():
            if doq0_leads:
                p.kill()  # no handover: doq-0 held the newest log
            else:
                assert p.terminate(timeout_s=30) == 0, p.log()
        pods.wipe("doq-0")
        t0 = time.monotonic()
        pods.start_all()
        pods.wait_ready()
        until("three voters seen by every pod", pods.voters_everywhere, timeout_s=90)
        until("equal digests", pods.digests_equal, timeout_s=60)
        print(f"\nall three started, doq-0 wiped: one cluster, three voters, equal digests after "
              f"{time.monotonic() - t0:.2f}s")
        assert pods.cluster_ids() == {cluster_id}  # doq-0 joined: no second cluster
        log0 = pods.by_name["doq-0"].log()
        assert "(seed doq-0): join:" in log0 and "bootstrap" not in log0.split("(seed doq-0):")[-1].split("\n")[0]
        for n in NAMES:
            assert pods.readable(n) == len(acked) == 200, n
        pods.no_failure_logged()


def test_every_volume_wiped_forms_a_new_cluster(tmp_path: Path) -> None:
    with statefulset(tmp_path) as pods:
        leader = _formed(pods)
        pods.write(leader, 10)
        [old] = pods.cluster_ids()
        for p in pods.by_name.values():
            p.kill()
        for n in NAMES:
            pods.wipe(n)
        pods.start_all()
        pods.wait_ready()
        until("three voters seen by every pod", pods.voters_everywhere, timeout_s=90)
        ids = pods.cluster_ids()
        assert len(ids) == 1 and ids != {old} and "" not in ids
        assert pods.get(pods.leader(), "/API/v1/queues/jobs")[0] == 404  # nothing of the old one
        pods.no_failure_logged()
