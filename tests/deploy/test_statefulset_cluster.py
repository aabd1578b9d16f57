"""The StatefulSet's three pods form the cluster by themselves: three real `doq serve`
processes started at once (podManagementPolicy Parallel) with the exact command and
environment of the container spec the Pulumi program declares (127.0.0.1 standing in for
the doq-internal DNS names, a local fake of the Kubernetes API). doq-0 bootstraps, the
others join through doq-internal; the leader labels its pod (what the `doq` Service
selects); SIGTERM of the leader (a rolling update) hands leadership over and the label
follows; the restarted pod rejoins as itself from its volume. The pods run secure with the
Secrets the program generates (HTTPS, mutual TLS between them, the admin key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.fake_k8s import FakeKubeApi, fake_kube_api, make_credentials
from tests.deploy.pods import LocalPod, LocalStatefulSet
from tests.deploy.program import deploy
from tests.support.cluster import until

pytestmark = pytest.mark.integration
NS = "doq"


def test_three_pods_form_the_cluster_and_the_leader_label_follows_the_leader(tmp_path: Path) -> None:
    d = deploy()  # the defaults: 3 replicas
    sts = d.one("StatefulSet")
    pod_labels = d.pod_template["metadata"]["labels"]
    selector = d.one("Service", "doq")["spec"]["selector"]
    make_credentials(tmp_path / "k8s")
    pods_in_api = {(NS, f"doq-{i}"): dict(pod_labels) for i in range(3)}
    with fake_kube_api(tmp_path / "k8s", pods_in_api) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", secrets=d.secrets, api_env={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa)})
        pods = local.pods()
        by_name = {p.name: p for p in pods}
        c = local.container
        ready = c["readinessProbe"]["httpGet"]
        http = {p.name: p.local_port(c, "http") for p in pods}
        _call = pods[0].call  # HTTPS verified with the Secret's CA, the admin key

        def selected(a: FakeKubeApi) -> set[str]:
            """The pods the doq Service selects now."""
            return {pod for (_, pod), labels in a.pods.items()
                    if all(labels.get(k) == v for k, v in selector.items())}

        def members(p: LocalPod) -> dict[str, dict[str, Any]]:
            status, body = _call(http[p.name], "GET", "/cluster")
            return {m["node_id"]: m for m in body["members"]} if status == 200 else {}

        def leader_of(p: LocalPod) -> str:
            status, body = _call(http[p.name], "GET", "/cluster")
            return str(body["leader_id"]) if status == 200 else ""

        try:
            for p in pods:  # all at once
                p.start()
            for p in pods:
                p.wait_http(p.local_port(c, ready["port"]), ready["path"], timeout_s=120)
            assert "doq-0 (seed doq-0): bootstrap: every other replica answered that its store is empty" in by_name["doq-0"].log()

            # one cluster of three voters, each known by its doq-internal name (127.0.0.1 here)
            def formed() -> bool:
                views = [members(p) for p in pods]
                return all(sorted(v) == ["doq-0", "doq-1", "doq-2"]
                           and all(m["role"] == "voter" for m in v.values()) for v in views)

            until("three voters seen by every pod", formed, timeout_s=90)
            for name, m in members(pods[0]).items():
                ports = by_name[name].ports
                assert (m["http_addr"], m["raft_addr"], m["grpc_addr"]) == (
                    f"127.0.0.1:{ports[8000]}", f"127.0.0.1:{ports[9000]}", f"127.0.0.1:{ports[10000]}")

            # the doq Service selects exactly the leader
            leader = until("a leader", lambda: leader_of(pods[0]), timeout_s=90)
            api.wait_for(lambda: selected(api) == {leader}, timeout_s=30)
            assert _call(http[leader], "POST", "/API/v1/queues", {"name": "jobs", "type": "delayed"})[0] == 201
            assert _call(http[leader], "POST", "/API/v1/queues/jobs/messages", {"content": "x"})[0] == 201

            # a rolling update stops the leader: it hands over, the label follows
            old = by_name[leader]
            grace_s = d.pod_template["spec"]["terminationGracePeriodSeconds"]
            assert old.terminate(timeout_s=grace_s) == 0, old.log()
            rest = [p for p in pods if p is not old]

            def new_leader() -> str:
                """The leader both others agree on, if it is not the stopped pod."""
                views = {leader_of(p) for p in rest}
                return views.pop() if len(views) == 1 and views.isdisjoint({"", leader}) else ""

            new = until("a new leader", new_leader, timeout_s=90)
            api.wait_for(lambda: selected(api) == {new}, timeout_s=30)

            # the pod restarts: same command, same volume: it rejoins as itself
            old.start()
            old.wait_http(http[old.name], ready["path"], timeout_s=120)
            assert sorted(members(old)) == ["doq-0", "doq-1", "doq-2"]
            until("the restarted pod serves the data", lambda: _call(http[old.name], "GET", "/API/v1/queues/jobs")[0] == 200, timeout_s=90)
            assert selected(api) == {until("a leader", lambda: leader_of(old), timeout_s=90)}
        finally:
            for p in pods:
                p.kill()
