"""The StatefulSet's three pods, started from the Pulumi program's own command, environment
and Secrets (laid out as kubelet mounts them; real `doq k8s-start` processes on 127.0.0.1),
form a secure cluster: the seed asks the others over HTTPS, every port speaks TLS with the
pods' certificates from the Secret, the Pulumi admin key is the cluster's key, a client
without a key is refused on HTTP and gRPC, a client that trusts another CA cannot connect,
plain HTTP gets no answer, and the Raft port refuses a TLS client without a pod
certificate (while a pod certificate gets through: the control)."""

from __future__ import annotations

import json
import shlex
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.tls.certs import generate_ca
from tests.deploy.fake_k8s import fake_kube_api, make_credentials
from tests.deploy.pods import LocalStatefulSet
from tests.deploy.program import deploy
from tests.support.cluster import until

pytestmark = pytest.mark.integration
NS = "doq"
NAMES = ["doq-0", "doq-1", "doq-2"]
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS


def _raft_answers(port: int, ca_file: Path, client: tuple[Path, Path] | None) -> bytes:
    """Open TLS to a Raft port (verifying the server as node doq-0), with `client` (cert,
    key) or no client certificate, send the HTTP/2 preface and return what comes back
    (b"" when the server refused and closed)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.set_alpn_protocols(["h2"])
    if client:
        ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="doq-0") as s:
                s.sendall(H2_PREFACE)
                return s.recv(1024)
        except (ssl.SSLError, ConnectionError):
            return b""


def test_the_pods_form_a_secure_cluster_and_refuse_whoever_has_no_key_or_certificate(tmp_path: Path) -> None:
    d = deploy()
    sts = d.one("StatefulSet")
    pod_labels = d.pod_template["metadata"]["labels"]
    make_credentials(tmp_path / "k8s")
    with fake_kube_api(tmp_path / "k8s", {(NS, n): dict(pod_labels) for n in NAMES}) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", secrets=d.secrets, api_env={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa)})
        pods = {p.name: p for p in local.pods()}
        c = local.container
        http = {n: p.local_port(c, "http") for n, p in pods.items()}
        try:
            for p in pods.values():
                p.start()
            for n, p in pods.items():
                p.wait_http(http[n], c["readinessProbe"]["httpGet"]["path"], timeout_s=120)
            # the seed heard every other pod over HTTPS (verified with the Secret's CA)
            assert "doq-0 (seed doq-0): bootstrap: every other replica answered that its store is empty" \
                in pods["doq-0"].log()

            def three_voters() -> bool:
                for n, p in pods.items():
                    status, body = p.call(http[n], "GET", "/cluster", timeout_s=5)
                    if status != 200 or sorted(m["node_id"] for m in body["members"] if m["role"] == "voter") != NAMES:
                        return False
                return True

            until("three voters seen by every pod (with the Pulumi admin key)", three_voters, timeout_s=90)
            doq0 = pods["doq-0"]
            ca_file, key = doq0.ca_file, doq0.key
            assert ca_file is not None and key == d.secrets["doq-admin-key"]["admin.key"]

            for n, p in pods.items():
                # the pod serves the Secret's certificate; no CA key and no generated admin key anywhere
                tls = Path(p.env["DOQ_DATA_DIR"]) / n / "tls"
                assert (tls / "node.crt").read_text() == d.secrets["doq-tls"][f"{n}.crt"]
                assert not (tls / "ca.key").exists()
                assert not (Path(p.env["DOQ_DATA_DIR"]) / "admin.key").exists()
                # a client without a key is refused; with the key it is served
                for method, path in (("GET", "/cluster"), ("POST", "/API/v1/queues"), ("POST", "/db/backup")):
                    status, body = p.call(http[n], method, path, {"name": "q", "type": "delayed"}
                                          if path.endswith("queues") else {"since": 0}, key="", timeout_s=10)
                    assert status == 401, (n, path, status, body)
                # health stays open (kubelet's probes carry no key)
                assert p.get(http[n], "/livez")[0] == 200

            leader = until("a leader", lambda: doq0.call(http["doq-0"], "GET", "/cluster")[1]["leader_id"], timeout_s=60)
            assert pods[leader].call(http[leader], "POST", "/API/v1/queues", {"name": "jobs", "type": "delayed"})[0] == 201

            # gRPC: TLS with the CA; no key -> UNAUTHENTICATED, the key -> served
            creds = grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
            with grpc.secure_channel(f"127.0.0.1:{doq0.local_port(c, 'grpc')}", creds) as ch:
                stub = pb_grpc.DOQStub(ch)
                with pytest.raises(grpc.RpcError) as e:
                    stub.ListServers(pb.ListServersRequest(), timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                servers = stub.ListServers(pb.ListServersRequest(), timeout=10,
                                           metadata=[("authorization", f"Bearer {key}")]).servers
                assert sorted(s.id for s in servers) == NAMES

            # the `clusterStatus` output's command, run as `kubectl exec doq-0 --` runs it: in
            # the pod's environment ($DOQ_KEY), its ports and the Secret's mount mapped here
            [tls_mount] = [v["value"] for v in c["env"] if v["name"] == "DOQ_K8S_TLS_DIR"]
            argv = shlex.split(d.outputs["clusterStatus"].split(" -- ", 1)[1])
            argv = [a.replace("127.0.0.1:8000", f"127.0.0.1:{http['doq-0']}")
                    .replace(tls_mount, doq0.env["DOQ_K8S_TLS_DIR"]) for a in argv]
            assert argv[0] == "doq" and doq0.env["DOQ_K8S_TLS_DIR"] in " ".join(argv)
            status = subprocess.run(argv + ["--json"], env=doq0.env, capture_output=True, text=True, timeout=60)
            assert status.returncode == 0, status.stderr
            voters = sorted(m["node_id"] for m in json.loads(status.stdout)["members"] if m["role"] == "voter")
            assert voters == NAMES
            without_key = subprocess.run(argv, env={k: v for k, v in doq0.env.items() if k != "DOQ_KEY"},
                                         capture_output=True, text=True, timeout=60)
            assert without_key.returncode != 0 and "401" in without_key.stderr + without_key.stdout

            # a client that trusts another CA cannot connect; plain HTTP gets no answer
            other_ca, _ = generate_ca()
            wrong = ssl.create_default_context(cadata=other_ca.decode())
            with pytest.raises(urllib.error.URLError) as refused:
                urllib.request.urlopen(f"https://127.0.0.1:{http['doq-0']}/livez", timeout=10, context=wrong)
            assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
            with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                urllib.request.urlopen(f"http://127.0.0.1:{http['doq-0']}/livez", timeout=10)

            # the Raft port: mutual TLS with a pod certificate of the Secret's CA, nothing else
            raft = doq0.local_port(c, "raft")
            assert _raft_answers(raft, ca_file, None) == b""
            secret_dir = Path(doq0.env["DOQ_K8S_TLS_DIR"])
            assert _raft_answers(raft, ca_file, (secret_dir / "doq-1.crt", secret_dir / "doq-1.key")) != b""
        finally:
            for p in pods.values():
                p.kill()
