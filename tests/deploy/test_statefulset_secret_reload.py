"""The StatefulSet's pods (real `doq k8s-start` processes started from the Pulumi program's
command, environment and Secrets) take an updated TLS Secret while they run: a whole rolling
CA rotation — the program's `doq:caRotation` begin, reissue, unset — is carried out by
rewriting the mounted Secret as kubelet does (an atomic `..data` swap), with no pod
restarted. After each step every pod serves and trusts what the step says, writes keep
being acknowledged through every pod (forwarded to the leader over mutual TLS), and at the
end the old CA's pod certificates are refused on the Raft port. A Secret that does not hold
together is logged and not taken."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from doq.tls.certs import bundle_certs, fingerprint, generate_ca, pem_of
from tests.deploy.fake_k8s import fake_kube_api, make_credentials
from tests.deploy.pods import LocalPod, LocalStatefulSet
from tests.deploy.program import Deployment, deploy
from tests.deploy.test_statefulset_secure import _raft_answers
from tests.support.cluster import until

pytestmark = pytest.mark.integration
NS = "doq"
NAMES = ["doq-0", "doq-1", "doq-2"]
TLS_SECRET = "doq-tls"


def _served_cert(port: int, ca_file: Path) -> str:
    """The PEM certificate a pod's HTTPS port serves now (a fresh handshake)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der)


def _fingerprints(bundle: str) -> list[str]:
    return sorted(fingerprint(pem_of(c)) for c in bundle_certs(bundle.encode()))


class Cluster:
    def __init__(self, local: LocalStatefulSet, pods: dict[str, LocalPod]) -> None:
        self.local, self.pods = local, pods
        self.http = {n: p.local_port(local.container, "http") for n, p in pods.items()}
        self.raft = {n: p.local_port(local.container, "raft") for n, p in pods.items()}
        self.pids = {n: p.proc.pid for n, p in pods.items() if p.proc}
        self.acked = 0

    def tls_status(self, name: str) -> dict[str, Any]:
        status, body = self.pods[name].call(self.http[name], "GET", "/cluster/tls", timeout_s=10)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def write_through_every_pod(self) -> None:
        """One message through each pod (a follower forwards it to the leader over TLS)."""
        for n, p in self.pods.items():
            status, body = p.call(self.http[n], "POST", "/API/v1/queues/jobs/messages",
                                  {"content": f"m-{self.acked}", "priority": 1}, timeout_s=30)
            assert status == 201, (n, status, body)
            self.acked += 1

    def wait_taken(self, step: str, secret: dict[str, str]) -> None:
        """Until every pod serves its certificate of `secret` and trusts exactly its CAs."""
        trusted = _fingerprints(secret["ca.crt"])

        def taken() -> bool:
            for n in NAMES:
                s = self.tls_status(n)
                if sorted(c["fingerprint"] for c in s["trusted_cas"]) != trusted:
                    return False
                if s["node_cert"]["fingerprint"] != fingerprint(secret[f"{n}.crt"].encode()):
                    return False
            return True

        until(f"every pod took the Secret of step {step}", taken, timeout_s=60)
        for n, p in self.pods.items():  # the handshake itself: served from the next one on
            assert _served_cert(self.http[n], p.ca_file or Path()) == secret[f"{n}.crt"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Deployment, Cluster]]:
    d = deploy()
    sts = d.one("StatefulSet")
    make_credentials(tmp_path / "k8s")
    labels = d.pod_template["metadata"]["labels"]
    with fake_kube_api(tmp_path / "k8s", {(NS, n): dict(labels) for n in NAMES}) as (api, sa):
        local = LocalStatefulSet(sts, tmp_path / "pods", secrets=d.secrets, api_env={
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
            "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa), "DOQ_K8S_TLS_POLL_S": "0.2"})
        pods = {p.name: p for p in local.pods()}
        try:
            for p in pods.values():
                p.start()
            c = local.container
            for p in pods.values():
                p.wait_http(p.local_port(c, "http"), c["readinessProbe"]["httpGet"]["path"], timeout_s=120)
            out = Cluster(local, pods)

            def formed() -> bool:
                for n in NAMES:
                    status, body = out.pods[n].call(out.http[n], "GET", "/cluster", timeout_s=5)
                    if status != 200 or not body["leader_id"] or sorted(
                            m["node_id"] for m in body["members"] if m["role"] == "voter") != NAMES:
                        return False
                return True

            until("three voters and a leader seen by every pod", formed, timeout_s=90)
            p0 = pods["doq-0"]
            status, body = p0.call(out.http["doq-0"], "POST", "/API/v1/queues", {"name": "jobs", "type": "delayed"})
            assert status == 201, body
            yield d, out
        finally:
            for p in pods.values():
                p.kill()


def test_a_rolling_ca_rotation_is_taken_from_the_updated_secret_without_restarting_a_pod(
        cluster: tuple[Deployment, Cluster]) -> None:
    default, c = cluster
    c.write_through_every_pod()
    begin = deploy({"caRotation": "begin"}, previous=default)
    reissue = deploy({"caRotation": "reissue"}, previous=begin)
    done = deploy({}, previous=reissue)
    for step, d in (("begin", begin), ("reissue", reissue), ("unset", done)):
        c.local.update_secret(TLS_SECRET, d.secrets[TLS_SECRET])
        c.wait_taken(step, d.secrets[TLS_SECRET])
        c.write_through_every_pod()
    # the old CA is trusted no more: its pod certificate is refused on the Raft port, the new one passes
    old_dir = c.local.root / "old-secret"
    old_dir.mkdir()
    for name in ("doq-1.crt", "doq-1.key"):
        (old_dir / name).write_text(default.secrets[TLS_SECRET][name])
        (old_dir / name).chmod(0o600)
    ca_file = c.pods["doq-0"].ca_file
    assert ca_file is not None and ca_file.read_text() == done.secrets[TLS_SECRET]["ca.crt"]
    assert _raft_answers(c.raft["doq-0"], ca_file, (old_dir / "doq-1.crt", old_dir / "doq-1.key")) == b""
    secret_dir = c.local.secret_dirs[TLS_SECRET]
    assert _raft_answers(c.raft["doq-0"], ca_file, (secret_dir / "doq-1.crt", secret_dir / "doq-1.key")) != b""
    # nothing restarted, nothing lost
    assert {n: p.proc.pid for n, p in c.pods.items() if p.proc and p.proc.poll() is None} == c.pids
    status, body = c.pods["doq-0"].call(c.http["doq-0"], "GET", "/API/v1/queues/jobs")
    assert status == 200 and body["stats"]["total"] == c.acked == 12, body
    for p in c.pods.values():
        assert p.log().count("took the updated TLS Secret") == 3, p.log()
        assert "PRIVATE KEY" not in p.log()


def test_a_secret_that_does_not_hold_together_is_not_taken(cluster: tuple[Deployment, Cluster]) -> None:
    default, c = cluster
    secret = default.secrets[TLS_SECRET]
    client_ca = c.local.root / "client-ca.crt"  # the client keeps trusting the real CA
    client_ca.write_text(secret["ca.crt"])
    for p in c.pods.values():
        p.ca_file = client_ca
    other_ca, _ = generate_ca()
    # a bundle of a CA that signed none of the pods' certificates, then a key of another pod
    for broken, says in (({**secret, "ca.crt": other_ca.decode()}, "signed by none of the CAs"),
                         ({**secret, "doq-0.key": secret["doq-1.key"]}, "node.key is not the key")):
        c.local.update_secret(TLS_SECRET, broken)
        until("doq-0 logged the broken Secret", lambda says=says: says in c.pods["doq-0"].log(),  # type: ignore[misc]
              timeout_s=60)
        assert _fingerprints(secret["ca.crt"]) == sorted(
            x["fingerprint"] for x in c.tls_status("doq-0")["trusted_cas"])
        c.write_through_every_pod()
    tls_dir = Path(c.pods["doq-0"].env["DOQ_DATA_DIR"]) / "doq-0" / "tls"
    assert (tls_dir / "node.key").read_text() == secret["doq-0.key"]  # nothing was installed
    assert (tls_dir / "ca.crt").read_text() == secret["ca.crt"]
    c.local.update_secret(TLS_SECRET, secret)  # back as it was: nothing to take
    c.write_through_every_pod()
    assert all(p.proc and p.proc.poll() is None for p in c.pods.values())
    assert "took the updated TLS Secret" not in c.pods["doq-0"].log()
