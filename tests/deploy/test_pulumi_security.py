"""The Pulumi program is secure by default (issue 18, item 8), run with Pulumi's mocks (its
dynamic resources created for real, as `pulumi up` would): the cluster CA, the pods'
certificates and the admin key it generates, how the Secrets reach the pods, that doq's own
code takes them as they are (no certificate issued again, no CA key anywhere in a pod), the
NetworkPolicy of the Raft port, and what a later `pulumi up` keeps or replaces."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from doq.auth.bootstrap import read_admin_key_file
from doq.auth.mode import runs_secure
from doq.auth.tokens import key_id_of
from doq.config import ServeConfig, add_serve_arguments, load_config
from doq.k8s_start import install_tls
from doq.server_tls import config_hosts
from doq.tls.certs import CA_KEY, TLS_DIR, ensure_node_tls
from tests.deploy.pods import kubelet_env
from tests.deploy.program import ROOT, Deployment, deploy, load_program

NS = "doq"
PODS = ["doq-0", "doq-1", "doq-2"]

@pytest.fixture(scope="module")
def default() -> Deployment:
    return deploy()

def _serve_config(d: Deployment, pod: str) -> ServeConfig:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return load_config(p.parse_args([]), kubelet_env(d.container, pod, NS, d.secrets))

def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())

def _public(pem_key: str) -> bytes:
    key = serialization.load_pem_private_key(pem_key.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

def _cert_public(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())

def test_every_pod_runs_secure_and_nothing_turns_it_off(default: Deployment) -> None:
    source = (ROOT / "pulumi" / "__main__.py").read_text()
    assert "DOQ_INSECURE" not in source and "--insecure" not in source
    env_names = {v["name"] for v in default.container["env"]}
    assert "DOQ_INSECURE" not in env_names
    for pod in PODS:
        config = _serve_config(default, pod)
        assert runs_secure(config) and config.secure and not config.insecure

def test_the_tls_secret_holds_the_ca_certificate_and_each_pods_certificate_never_the_ca_key(
        default: Deployment) -> None:
    files = default.secrets["doq-tls"]
    assert sorted(files) == sorted(["ca.crt", *(f"{p}.crt" for p in PODS), *(f"{p}.key" for p in PODS)])
    ca = _cert(files["ca.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    ca_public = _cert_public(ca)
    for pod in PODS:
        cert = _cert(files[f"{pod}.crt"])
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == pod  # the peer door's check
        names = {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}
        # its node id, its doq-internal name (peers, joins), the leader Service (clients), loopback
        assert {pod, f"{pod}.doq-internal.{NS}.svc", f"doq.{NS}.svc", "127.0.0.1", "localhost"} <= names
        assert _public(files[f"{pod}.key"]) == _cert_public(cert)
        assert _public(files[f"{pod}.key"]) != ca_public
    # the CA's private key is in the stack's state only: no Secret, no output holds it
    every_value = [v for data in default.secrets.values() for v in data.values()]
    every_value += [v for v in default.outputs.values() if isinstance(v, str)]
    for value in every_value:
        if "PRIVATE KEY" in value:
            assert _public(value) != ca_public
    assert default.dynamic["doq-cluster-tls"]["ca_key"] and _public(default.dynamic["doq-cluster-tls"]["ca_key"]) == ca_public

def test_doq_takes_the_secret_as_it_is_with_no_ca_key_in_the_pod(default: Deployment, tmp_path: Path) -> None:
    """What `doq k8s-start --tls-secret-dir` and then `doq serve` do with the mounted files:
    the pod's certificate names every host the node listens on and announces, so doq uses
    it (it could not issue another: the pod has no CA key)."""
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    for name, value in default.secrets["doq-tls"].items():
        (secret_dir / name).write_text(value)
    for pod in PODS:
        config = replace(_serve_config(default, pod), data_dir=str(tmp_path / "data"))
        ca_file = install_tls(config, secret_dir)
        node_tls = ensure_node_tls(ca_file.parent, config.node_id, config_hosts(config), may_create_ca=False)
        assert node_tls.ca_key is None and not (ca_file.parent / CA_KEY).exists()
        assert node_tls.node_cert.decode() == default.secrets["doq-tls"][f"{pod}.crt"]  # not issued again
        assert node_tls.ca_cert.decode() == default.secrets["doq-tls"]["ca.crt"]
        assert ca_file.parent.name == TLS_DIR

def test_the_secrets_are_mounted_read_only_where_the_pods_read_them(default: Deployment, tmp_path: Path) -> None:
    spec = default.pod_template["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in default.container["volumeMounts"]}
    secret_mounts = {volumes[n]["secret"]["secretName"]: mounts[n] for n in volumes if "secret" in volumes[n]}
    assert sorted(secret_mounts) == ["doq-admin-key", "doq-tls"]
    for name, mount in secret_mounts.items():
        assert mount["readOnly"] is True
        [v] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == name]
        assert v["secret"]["defaultMode"] == 0o440  # root and the pod's fsGroup (the doq user) read it
    assert spec["securityContext"]["fsGroup"] == default.container["securityContext"]["runAsGroup"]
    env = {v["name"]: v for v in default.container["env"]}
    assert env["DOQ_K8S_TLS_DIR"]["value"] == secret_mounts["doq-tls"]["mountPath"]
    key_file = env["DOQ_ADMIN_KEY_FILE"]["value"]
    assert key_file.rpartition("/")[0] == secret_mounts["doq-admin-key"]["mountPath"]
    assert env["DOQ_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "doq-admin-key", "key": key_file.rpartition("/")[2]}}
    # the key is one doq takes: a well-formed token, read from the file the pod mounts
    token = default.secrets["doq-admin-key"][key_file.rpartition("/")[2]]
    path = tmp_path / "admin.key"
    path.write_text(token)
    key = read_admin_key_file(str(path))
    assert key is not None and key.token == token and key_id_of(token) == key.id
    assert default.outputs["adminKey"] == token
    # `doq k8s-start` takes its TLS from there, and `kubectl exec` commands find the CA there
    assert load_program().START_SCRIPT.strip() == "exec doq k8s-start"
    assert f"--ca-file {secret_mounts['doq-tls']['mountPath']}/ca.crt" in default.outputs["clusterStatus"]

@pytest.mark.parametrize("config", [{}, {"grpcPort": 7001, "httpPort": 7002, "raftPort": 7003}])
def test_only_doq_pods_reach_the_raft_port(config: dict[str, Any]) -> None:
    d = deploy(config)
    policy = d.one("NetworkPolicy")
    pod_labels = d.pod_template["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in d.container["ports"]}
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"] and _matches(spec["podSelector"]["matchLabels"], pod_labels)
    reaching: dict[int, list[list[dict[str, Any]] | None]] = {}  # port -> the `from` of each rule that opens it
    for rule in spec["ingress"]:
        for p in rule["ports"]:
            assert p["protocol"] == "TCP"
            reaching.setdefault(p["port"], []).append(rule.get("from"))
    assert set(reaching) == set(ports.values())  # every container port is reachable by someone
    for peers in reaching[ports["raft"]]:
        assert peers is not None  # never "from anywhere"
        for peer in peers:
            assert set(peer) == {"podSelector"}  # no namespaceSelector / ipBlock: this namespace's pods
            assert _matches(peer["podSelector"]["matchLabels"], pod_labels)
            assert peer["podSelector"]["matchLabels"] == spec["podSelector"]["matchLabels"]  # doq pods only
    # clients (and kubelet's probes) reach gRPC and HTTP from anywhere: TLS and keys guard them
    assert None in reaching[ports["grpc"]] and None in reaching[ports["http"]]

def test_a_later_up_keeps_the_ca_the_certificates_and_the_admin_key(default: Deployment) -> None:
    again = deploy(previous=default)
    assert again.updated == [] and again.secrets == default.secrets

def test_scaling_up_issues_certificates_for_the_new_pods_with_the_same_ca(default: Deployment) -> None:
    five = deploy({"replicas": 5}, previous=default)
    old, new = default.secrets["doq-tls"], five.secrets["doq-tls"]
    assert new["ca.crt"] == old["ca.crt"]
    for pod in PODS:
        assert (new[f"{pod}.crt"], new[f"{pod}.key"]) == (old[f"{pod}.crt"], old[f"{pod}.key"])
    for pod in ("doq-3", "doq-4"):
        _cert(new[f"{pod}.crt"]).verify_directly_issued_by(_cert(new["ca.crt"]))
    assert five.secrets["doq-admin-key"] == default.secrets["doq-admin-key"]

def test_a_new_ca_generation_replaces_the_ca_and_every_certificate_not_the_admin_key(default: Deployment) -> None:
    rotated = deploy({"caGeneration": 2}, previous=default)
    old, new = default.secrets["doq-tls"], rotated.secrets["doq-tls"]
    assert new["ca.crt"] != old["ca.crt"]
    for pod in PODS:
        assert new[f"{pod}.crt"] != old[f"{pod}.crt"] and new[f"{pod}.key"] != old[f"{pod}.key"]
        _cert(new[f"{pod}.crt"]).verify_directly_issued_by(_cert(new["ca.crt"]))
    assert rotated.secrets["doq-admin-key"] == default.secrets["doq-admin-key"]
    with pytest.raises(Exception, match="caGeneration"):
        deploy({"caGeneration": 0})

def test_a_certificate_about_to_expire_is_issued_again_at_the_next_up(default: Deployment) -> None:
    program = load_program()
    state = {k: dict(v) for k, v in default.dynamic.items()}
    tls = state["doq-cluster-tls"]
    setattr(program, "NODE_DAYS", 10)  # noqa: B010 -- a certificate issued with 10 days left (renewal: within 30)
    short, short_key = program._tls_issue(tls["ca_cert"], tls["ca_key"], "doq-1", tls["nodes"]["doq-1"])
    tls["certs"] = {**tls["certs"], "doq-1": short}
    tls["keys"] = {**tls["keys"], "doq-1": short_key}
    later = deploy(previous=Deployment(default.resources, default.outputs, state, []))
    assert later.updated == ["doq-cluster-tls"]
    new = later.secrets["doq-tls"]
    assert new["doq-1.crt"] != short and new["ca.crt"] == tls["ca_cert"]
    assert _cert(new["doq-1.crt"]).not_valid_after_utc > _cert(short).not_valid_after_utc
    assert new["doq-0.crt"] == default.secrets["doq-tls"]["doq-0.crt"]  # the others kept


_RUN_AS_MAIN = '''
import asyncio, json, sys
import pulumi

found = {}

class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        inputs = dict(args.inputs)
        if args.typ == "pulumi-python:dynamic:Resource":
            p = inputs["__provider"]
            found[args.name] = p["value"] if isinstance(p, dict) else p
            return args.name, {"ca_cert": "", "certs": {}, "keys": {}, "token": "", "key_id": ""}
        return args.name + "-id", inputs

    def call(self, args):
        return {}, None

asyncio.set_event_loop(asyncio.new_event_loop())
pulumi.runtime.set_mocks(Mocks(), project="doq", stack="test", preview=False)
import __main__
code = compile(open(sys.argv[1]).read(), sys.argv[1], "exec")

@pulumi.runtime.test
def run():
    exec(code, __main__.__dict__)  # as `pulumi up` runs the program: the module __main__
    return pulumi.Output.from_input(None)

run()
print(json.dumps(found))
'''

_PROVIDER_HOST = '''
import base64, json, sys, dill
found = json.loads(sys.stdin.read())
tls = dill.loads(base64.b64decode(found["doq-cluster-tls"]))
news = {"nodes": {"doq-0": ["doq-0", "127.0.0.1"]}, "ca_generation": 1}
made = tls.create(news)
grown = tls.update(made.id, made.outs, {"nodes": {**news["nodes"], "doq-1": ["doq-1"]}, "ca_generation": 1}).outs
admin = dill.loads(base64.b64decode(found["doq-admin-key"])).create({})
print(json.dumps({"made": made.outs, "changes": tls.diff(made.id, made.outs, news).changes, "grown": grown,
                  "admin": admin.outs}))
'''


def test_the_providers_run_where_pulumi_runs_them(tmp_path: Path) -> None:
    """`pulumi up` runs the program as the module __main__ and its dynamic providers in
    Pulumi's provider host, another process that has not the program: each provider is
    serialized (dill) with everything it needs and works there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this repository
    program = subprocess.run([sys.executable, "-c", _RUN_AS_MAIN, str(ROOT / "pulumi" / "__main__.py")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert program.returncode == 0, program.stderr
    host = subprocess.run([sys.executable, "-c", _PROVIDER_HOST], input=program.stdout, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert host.returncode == 0, host.stderr
    got = json.loads(host.stdout)
    ca = _cert(got["made"]["ca_cert"])
    _cert(got["made"]["certs"]["doq-0"]).verify_directly_issued_by(ca)
    assert got["changes"] is False  # the same inputs: nothing to do
    assert got["grown"]["ca_cert"] == got["made"]["ca_cert"] and sorted(got["grown"]["certs"]) == ["doq-0", "doq-1"]
    assert got["grown"]["certs"]["doq-0"] == got["made"]["certs"]["doq-0"]
    assert key_id_of(got["admin"]["token"]) == got["admin"]["key_id"]


def test_the_admin_key_is_rotated_with_the_secret_config_doq_admin_key(default: Deployment) -> None:
    """`doq keys create --scope admin` on the cluster, `pulumi config set --secret
    doq:adminKey KEY`: the pods get that key (the generated one stays in the stack)."""
    new = "doq_0123456789ab_" + "k" * 43
    rotated = deploy({"adminKey": new}, previous=default)
    assert rotated.secrets["doq-admin-key"]["admin.key"] == new == rotated.outputs["adminKey"]
    assert rotated.secrets["doq-tls"] == default.secrets["doq-tls"] and rotated.updated == []
    env = kubelet_env(rotated.container, "doq-1", NS, rotated.secrets)
    assert env["DOQ_KEY"] == new
    with pytest.raises(Exception, match="doq:adminKey must be a doq key") as e:
        deploy({"adminKey": "not-a-key-s3cr3t"})
    assert "s3cr3t" not in str(e.value)


def _pod_tls(d: Deployment, pod: str, where: Path) -> tuple[Path, Path, bytes]:
    """What doq makes of the Secret in `pod` (`doq k8s-start` installs it, `doq serve`
    loads it): its certificate, key and trusted CAs."""
    secret_dir = where / "secret"
    secret_dir.mkdir(parents=True)
    for name, value in d.secrets["doq-tls"].items():
        (secret_dir / name).write_text(value)
    config = replace(_serve_config(d, pod), data_dir=str(where / "data"))
    ca_file = install_tls(config, secret_dir)
    tls = ensure_node_tls(ca_file.parent, config.node_id, config_hosts(config), may_create_ca=False)
    assert tls.node_cert.decode() == d.secrets["doq-tls"][f"{pod}.crt"]  # used as it is
    return tls.cert_file, tls.key_file, tls.ca_cert


def _mutual_handshake(server: tuple[Path, Path, bytes], client: tuple[Path, Path, bytes], server_name: str) -> None:
    """A real mutual TLS handshake (as between two members' Raft ports): raises ssl.SSLError
    if either side refuses the other's certificate."""
    import socket
    import ssl
    import threading

    def ctx(side: tuple[Path, Path, bytes], purpose: ssl.Purpose) -> ssl.SSLContext:
        c = ssl.create_default_context(purpose, cadata=side[2].decode())
        c.load_cert_chain(side[0], side[1])
        c.verify_mode = ssl.CERT_REQUIRED
        return c

    s_ctx, c_ctx = ctx(server, ssl.Purpose.CLIENT_AUTH), ctx(client, ssl.Purpose.SERVER_AUTH)
    a, b = socket.socketpair()
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            with s_ctx.wrap_socket(a, server_side=True) as t:
                t.recv(1)
        except (ssl.SSLError, OSError) as e:
            failed.append(e)

    th = threading.Thread(target=serve)
    th.start()
    try:
        with c_ctx.wrap_socket(b, server_hostname=server_name) as t:
            t.sendall(b"x")
    finally:
        b.close()
        th.join(30)
        a.close()
    if failed:
        raise failed[0]


def test_a_rolling_ca_rotation_keeps_pods_of_neighbouring_steps_talking(default: Deployment, tmp_path: Path) -> None:
    """doq:caRotation begin, reissue, unset: after each `pulumi up` the pods are restarted
    one at a time, so a pod of one step must accept a pod of the next and the reverse, in
    a real mutual TLS handshake with what doq makes of the Secret. The admin key stays, the
    new CA's key is in no Secret and no output."""
    begin = deploy({"caRotation": "begin"}, previous=default)
    reissue = deploy({"caRotation": "reissue"}, previous=begin)
    done = deploy({}, previous=reissue)
    steps = [default, begin, reissue, done]
    old_ca, new_ca = default.dynamic["doq-cluster-tls"]["ca_cert"], begin.dynamic["doq-cluster-tls"]["next_ca_cert"]
    assert new_ca and new_ca != old_ca
    # begin: both trusted, certificates kept; reissue: every certificate of the new CA; done: the new CA alone
    assert begin.secrets["doq-tls"]["ca.crt"] == old_ca + new_ca
    assert all(begin.secrets["doq-tls"][f"{p}.crt"] == default.secrets["doq-tls"][f"{p}.crt"] for p in PODS)
    assert reissue.secrets["doq-tls"]["ca.crt"] == new_ca + old_ca
    for pod in PODS:
        _cert(reissue.secrets["doq-tls"][f"{pod}.crt"]).verify_directly_issued_by(_cert(new_ca))
        assert done.secrets["doq-tls"][f"{pod}.crt"] == reissue.secrets["doq-tls"][f"{pod}.crt"]
    assert done.secrets["doq-tls"]["ca.crt"] == new_ca == done.outputs["caCert"]
    assert done.dynamic["doq-cluster-tls"]["ca_cert"] == new_ca and not done.dynamic["doq-cluster-tls"]["next_ca_key"]
    assert [s.outputs["caCert"] for s in steps] == [s.secrets["doq-tls"]["ca.crt"] for s in steps]
    new_public = _public(begin.dynamic["doq-cluster-tls"]["next_ca_key"])
    for step in steps:
        assert step.secrets["doq-admin-key"] == default.secrets["doq-admin-key"]
        for value in [v for data in step.secrets.values() for v in data.values()] + [
                v for v in step.outputs.values() if isinstance(v, str)]:
            assert "PRIVATE KEY" not in value or _public(value) != new_public

    pods = {(i, pod): _pod_tls(step, pod, tmp_path / f"{i}-{pod}") for i, step in enumerate(steps)
            for pod in ("doq-0", "doq-1")}
    for i in range(len(steps) - 1):  # a restarted pod (step i+1) and one not yet restarted (step i)
        _mutual_handshake(pods[(i, "doq-0")], pods[(i + 1, "doq-1")], "doq-0")
        _mutual_handshake(pods[(i + 1, "doq-1")], pods[(i, "doq-0")], "doq-1")
    import ssl

    with pytest.raises(ssl.SSLError):  # the first step's pods and the last's: the old CA is gone
        _mutual_handshake(pods[(3, "doq-1")], pods[(0, "doq-0")], "doq-1")


def test_a_ca_rotation_step_out_of_order_is_refused(default: Deployment) -> None:
    with pytest.raises(Exception, match="caRotation reissue needs a rotation begun"):
        deploy({"caRotation": "reissue"}, previous=default)
    with pytest.raises(Exception, match="doq:caRotation must be"):
        deploy({"caRotation": "finish"})
    begin = deploy({"caRotation": "begin"}, previous=default)
    abandoned = deploy({}, previous=begin)  # unset after begin: the old CA stays, the next is dropped
    assert abandoned.secrets["doq-tls"] == default.secrets["doq-tls"]
    assert not abandoned.dynamic["doq-cluster-tls"]["next_ca_key"]
