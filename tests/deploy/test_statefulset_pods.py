"""The program's start command is the one that runs: a pod of the StatefulSet the Pulumi
program declares, started as a local `doq serve` with the exact command and environment of
its container spec (127.0.0.1 standing in for the DNS names, a local fake of the Kubernetes
API), answers its probes on the paths and ports they name, labels itself as the leader the
`doq` Service selects, unlabels itself on SIGTERM within the grace period, and restarts
from its volume as itself. It runs secure with the Secrets the program generates: HTTPS
probes, gRPC over TLS, the admin key registered by its bootstrap, a keyless client refused."""

from __future__ import annotations

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


def test_a_one_pod_statefulset_runs_as_declared(tmp_path: Path) -> None:
    d = deploy({"replicas": 1})
    sts = d.one("StatefulSet")
    pod_labels = d.pod_template["metadata"]["labels"]
    leader_selector = d.one("Service", "doq")["spec"]["selector"]
    make_credentials(tmp_path / "k8s")
    with fake_kube_api(tmp_path / "k8s", {(NS, "doq-0"): dict(pod_labels)}) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", secrets=d.secrets, api_env={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa)})
        [pod] = local.pods()
        assert "$(" not in " ".join(pod.argv)  # kubelet would expand $(VAR) in the command: none there
        # only addresses and the volume's path differ from what kubelet gives the pod
        assert local.translated == {"doq-0": {"DOQ_DATA_DIR", "DOQ_GRPC_ADDR", "DOQ_HTTP_ADDR", "DOQ_RAFT_ADDR",
                                              "DOQ_ADVERTISE_HOST", "DOQ_JOIN", "DOQ_K8S_TLS_DIR",
                                              "DOQ_ADMIN_KEY_FILE"}}
        assert pod.ca_file is not None and pod.key.startswith("doq_")
        c = local.container
        probes = [c["startupProbe"], c["livenessProbe"], c["readinessProbe"]]
        try:
            pod.start()
            for probe in probes:  # each answers 200 on the path and port it names, over HTTPS
                assert probe["httpGet"]["scheme"] == "HTTPS"
                pod.wait_http(pod.local_port(c, probe["httpGet"]["port"]), probe["httpGet"]["path"])
            assert "doq k8s-start: doq-0 (seed doq-0): bootstrap: no other replica" in pod.log()
            # the leader (a lone node leads) labels its pod: the doq Service selects it
            api.wait_for(lambda: all(api.pods[(NS, "doq-0")].get(k) == v for k, v in leader_selector.items()))
            http = pod.local_port(c, "http")
            # the Pulumi admin key is the cluster's first key; without a key nothing is allowed
            status, body = pod.call(http, "POST", "/API/v1/queues", {"name": "kept", "type": "delayed"}, key="")
            assert status == 401, body
            pod.wait_key_accepted(http)
            assert pod.call(http, "POST", "/API/v1/queues", {"name": "kept", "type": "delayed"})[0] == 201
            assert not (Path(pod.env["DOQ_DATA_DIR"]) / "admin.key").exists()  # none generated
            # it announces its doq-internal name (here 127.0.0.1) with the container ports
            assert pod.ca_file is not None
            creds = grpc.ssl_channel_credentials(root_certificates=pod.ca_file.read_bytes())
            with grpc.secure_channel(f"127.0.0.1:{pod.local_port(c, 'grpc')}", creds) as ch:
                [me] = pb_grpc.DOQStub(ch).ListServers(pb.ListServersRequest(), timeout=10,
                                                       metadata=[("authorization", f"Bearer {pod.key}")]).servers
            assert (me.id, me.http_addr, me.raft_addr) == (
                "doq-0", f"127.0.0.1:{http}", f"127.0.0.1:{pod.local_port(c, 'raft')}")

            grace_s = d.pod_template["spec"]["terminationGracePeriodSeconds"]
            assert pod.terminate(timeout_s=grace_s) == 0, pod.log()  # before kubelet's SIGKILL
            assert api.pods[(NS, "doq-0")] == pod_labels  # unlabelled, the rest kept

            pod.start()  # the container restarts: same command, same volume
            pod.wait_http(http, c["readinessProbe"]["httpGet"]["path"])
            assert pod.call(http, "GET", "/API/v1/queues/kept")[0] == 200
            api.wait_for(lambda: api.pods[(NS, "doq-0")].get("doq.io/leader") == "true")
        finally:
            pod.kill()
