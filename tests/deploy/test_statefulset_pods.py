"""The program's start command is the one that runs: a pod of the StatefulSet the Pulumi
program declares, started as a local `doq serve` with the exact command and environment of
its container spec (127.0.0.1 standing in for the DNS names, a local fake of the Kubernetes
API), answers its probes on the paths and ports they name, labels itself as the leader the
`doq` Service selects, unlabels itself on SIGTERM within the grace period, and restarts
from its volume as itself."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.deploy.fake_k8s import fake_kube_api, make_credentials
from tests.deploy.pods import LocalStatefulSet
from tests.deploy.program import deploy

pytestmark = pytest.mark.integration
NS = "doq"


def _post(port: int, path: str, body: dict[str, object]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


def test_a_one_pod_statefulset_runs_as_declared(tmp_path: Path) -> None:
    d = deploy({"replicas": 1})
    sts = d.one("StatefulSet")
    pod_labels = d.pod_template["metadata"]["labels"]
    leader_selector = d.one("Service", "doq")["spec"]["selector"]
    make_credentials(tmp_path / "k8s")
    with fake_kube_api(tmp_path / "k8s", {(NS, "doq-0"): dict(pod_labels)}) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa)})
        [pod] = local.pods()
        assert "$(" not in " ".join(pod.argv)  # kubelet would expand $(VAR) in the command: none there
        # only addresses and the volume's path differ from what kubelet gives the pod
        assert local.translated == {"doq-0": {"DOQ_DATA_DIR", "DOQ_GRPC_ADDR", "DOQ_HTTP_ADDR", "DOQ_RAFT_ADDR",
                                              "DOQ_ADVERTISE_HOST", "DOQ_JOIN"}}
        c = local.container
        probes = [c["startupProbe"], c["livenessProbe"], c["readinessProbe"]]
        try:
            pod.start()
            for probe in probes:  # each answers 200 on the path and port it names
                pod.wait_http(pod.local_port(c, probe["httpGet"]["port"]), probe["httpGet"]["path"])
            assert "doq k8s-start: doq-0 (seed doq-0): bootstrap: no other replica" in pod.log()
            # the leader (a lone node leads) labels its pod: the doq Service selects it
            api.wait_for(lambda: all(api.pods[(NS, "doq-0")].get(k) == v for k, v in leader_selector.items()))
            http = pod.local_port(c, "http")
            assert _post(http, "/API/v1/queues", {"name": "kept", "type": "delayed"}) == 201
            # it announces its doq-internal name (here 127.0.0.1) with the container ports
            with grpc.insecure_channel(f"127.0.0.1:{pod.local_port(c, 'grpc')}") as ch:
                [me] = pb_grpc.DOQStub(ch).ListServers(pb.ListServersRequest(), timeout=10).servers
            assert (me.id, me.http_addr, me.raft_addr) == (
                "doq-0", f"127.0.0.1:{http}", f"127.0.0.1:{pod.local_port(c, 'raft')}")

            grace_s = d.pod_template["spec"]["terminationGracePeriodSeconds"]
            assert pod.terminate(timeout_s=grace_s) == 0, pod.log()  # before kubelet's SIGKILL
            assert api.pods[(NS, "doq-0")] == pod_labels  # unlabelled, the rest kept

            pod.start()  # the container restarts: same command, same volume
            pod.wait_http(http, c["readinessProbe"]["httpGet"]["path"])
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/API/v1/queues/kept", timeout=10) as r:
                assert r.status == 200
            api.wait_for(lambda: api.pods[(NS, "doq-0")].get("doq.io/leader") == "true")
        finally:
            pod.kill()
