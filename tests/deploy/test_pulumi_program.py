"""The Pulumi program in pulumi/, run with Pulumi's unit-testing mocks: the resources it
declares and how they fit together (selectors, ports, the join addresses, the disruption
budget, the leader label, RBAC), its stack config, and every manifest validated against
the Kubernetes API schema in strict mode (unknown fields are errors)."""

from __future__ import annotations

import argparse
import re
import tomllib

import pytest

import doq
from doq.config import ServeConfig, add_serve_arguments, load_config
from doq.node import k8s_leader
from tests.deploy.pods import kubelet_env
from tests.deploy.program import DYNAMIC, ROOT, Declared, Deployment, deploy, load_program

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (`make setup`)")
pulumi = pytest.importorskip("pulumi", reason="needs pulumi (`make setup`)")

KUBERNETES_VERSION = "1.37"  # the newest schema kubernetes-validate ships (strict variant)
OLDEST_SUPPORTED = "1.27"  # StatefulSet PVC retention on by default (pulumi/README.md)
NS = "doq"
POD_LABELS_KEYS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")


@pytest.fixture(scope="module")
def default() -> Deployment:
    return deploy()


def _serve_config(d: Deployment, pod: str) -> ServeConfig:
    """What `doq serve` makes of the environment the StatefulSet gives `pod` (doq's own parser)."""
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return load_config(p.parse_args([]), kubelet_env(d.container, pod, NS, d.secrets))


def _k8s(d: Deployment) -> list[Declared]:
    """The Kubernetes objects (not the program's own dynamic resources)."""
    return [r for r in d.resources if r.token != DYNAMIC]


def _port(addr: str) -> int:
    return int(addr.rpartition(":")[2])


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_program_declares_the_deployment(default: Deployment) -> None:
    kinds = sorted((r.manifest["kind"], r.manifest["metadata"]["name"]) for r in _k8s(default))
    assert kinds == [
        ("Namespace", NS), ("NetworkPolicy", "doq"), ("PodDisruptionBudget", "doq"), ("Role", "doq-leader-label"),
        ("RoleBinding", "doq-leader-label"), ("Secret", "doq-admin-key"), ("Secret", "doq-tls"),
        ("Service", "doq"), ("Service", "doq-internal"), ("ServiceAccount", "doq"), ("StatefulSet", "doq")]
    # and what `pulumi up` generates, kept in the stack (dynamic resources)
    assert sorted(r.name for r in default.resources if r.token == DYNAMIC) == ["doq-admin-key", "doq-cluster-tls"]
    for r in _k8s(default):
        if r.manifest["kind"] != "Namespace":
            assert r.manifest["metadata"]["namespace"] == NS, r.name
    sts = default.one("StatefulSet")["spec"]
    assert sts["replicas"] == 3 and sts["podManagementPolicy"] == "Parallel"
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, KUBERNETES_VERSION])
@pytest.mark.parametrize("config", [{}, {"replicas": 1, "storageClass": "fast-ssd", "spread": "preferred",
                                         "createNamespace": False}, {"replicas": 5}])
def test_every_manifest_validates_against_the_kubernetes_schema_strictly(version: str, config: dict[str, object]) -> None:
    d = deploy(config)
    assert d.resources
    for r in _k8s(d):
        assert kubernetes_validate.validate(r.manifest, version, strict=True) == version, r.name


def test_strict_validation_refuses_an_unknown_field(default: Deployment) -> None:
    """The check above has teeth: a misspelt field is an error."""
    sts = default.one("StatefulSet")
    bad = {**sts, "spec": {**sts["spec"], "podManagmentPolicy": "Parallel"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="podManagmentPolicy"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_selectors_match_the_pod_labels(default: Deployment) -> None:
    pod_labels = default.pod_template["metadata"]["labels"]
    assert set(POD_LABELS_KEYS) <= pod_labels.keys()
    sts = default.one("StatefulSet")
    selectors = {
        "statefulset": sts["spec"]["selector"]["matchLabels"],
        "doq-internal": default.one("Service", "doq-internal")["spec"]["selector"],
        "pdb": default.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    }
    spec = default.pod_template["spec"]
    for term in spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]:
        selectors["anti-affinity"] = term["labelSelector"]["matchLabels"]
    for c in spec["topologySpreadConstraints"]:
        selectors["spread"] = c["labelSelector"]["matchLabels"]
    for what, selector in selectors.items():
        assert selector and _matches(selector, pod_labels), what


def test_the_doq_service_selects_exactly_the_pod_the_leader_labels(default: Deployment) -> None:
    pod_labels = default.pod_template["metadata"]["labels"]
    selector = default.one("Service", "doq")["spec"]["selector"]
    env = kubelet_env(default.container, "doq-1", NS, default.secrets)
    key = env["DOQ_K8S_LEADER_LABEL"]
    # what the node puts on its pod when it leads (doq/node/k8s_leader.py)
    assert selector == {**pod_labels, key: k8s_leader.LABEL_VALUE}
    assert not _matches(selector, pod_labels)  # a pod without the label is not selected
    assert key not in default.one("StatefulSet")["spec"]["selector"]["matchLabels"]
    assert env["DOQ_K8S_POD_NAME"] == "doq-1" and env["DOQ_K8S_NAMESPACE"] == NS


def test_rbac_allows_only_get_and_patch_of_the_doq_pods(default: Deployment) -> None:
    role = default.one("Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"],
                              "resourceNames": ["doq-0", "doq-1", "doq-2"]}]
    binding = default.one("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    sa = default.one("ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    spec = default.pod_template["spec"]
    assert spec["serviceAccountName"] == sa and spec["automountServiceAccountToken"] is True


def test_container_ports_match_what_the_pods_listen_on(default: Deployment) -> None:
    ports = {p["name"]: p["containerPort"] for p in default.container["ports"]}
    assert ports == {"grpc": 10000, "http": 8000, "raft": 9000}
    for i in range(3):
        c = _serve_config(default, f"doq-{i}")
        assert (_port(c.grpc_addr), _port(c.http_addr), _port(c.raft_addr)) == (ports["grpc"], ports["http"], ports["raft"])
        assert c.grpc_addr.startswith("0.0.0.0:")  # kubectl port-forward reaches the pod's localhost
    for name in ("doq", "doq-internal"):
        for sp in default.one("Service", name)["spec"]["ports"]:
            assert sp["targetPort"] == sp["name"] and sp["port"] == ports[sp["name"]], (name, sp)


def test_custom_ports_reach_every_place_that_names_them() -> None:
    d = deploy({"grpcPort": 7001, "httpPort": 7002, "raftPort": 7003})
    c = _serve_config(d, "doq-0")
    ports = {p["name"]: p["containerPort"] for p in d.container["ports"]}
    assert ports == {"grpc": 7001, "http": 7002, "raft": 7003}
    assert (_port(c.grpc_addr), _port(c.http_addr), _port(c.raft_addr)) == (7001, 7002, 7003)
    assert {_port(a) for a in c.join} == {7002}
    assert d.outputs["portForward"] == "kubectl -n doq port-forward svc/doq 7002:7002"
    assert d.outputs["leaderGrpc"] == "doq.doq.svc:7001"


def test_node_ids_and_announced_addresses_are_the_pods_doq_internal_names(default: Deployment) -> None:
    internal = default.one("Service", "doq-internal")
    assert default.one("StatefulSet")["spec"]["serviceName"] == "doq-internal"
    assert internal["spec"]["clusterIP"] == "None" and internal["spec"]["publishNotReadyAddresses"] is True
    for i in range(3):
        pod = f"doq-{i}"
        c = _serve_config(default, pod)
        assert c.node_id == pod and c.data_dir == "/var/lib/doq"
        a = c.member_addrs()
        assert (a.raft_addr, a.grpc_addr, a.http_addr) == (
            f"{pod}.doq-internal.{NS}.svc:9000", f"{pod}.doq-internal.{NS}.svc:10000", f"{pod}.doq-internal.{NS}.svc:8000")
        # the join list names every pod's HTTP gateway through the headless service
        assert c.join == tuple(f"doq-{j}.doq-internal.{NS}.svc:8000" for j in range(3))
    assert default.outputs["members"] == [f"doq-{i}.doq-internal.{NS}.svc" for i in range(3)]


def test_the_data_volume_is_one_claim_per_pod_mounted_where_doq_keeps_its_data(default: Deployment) -> None:
    sts = default.one("StatefulSet")["spec"]
    [claim] = sts["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    mounts = {m["name"]: m["mountPath"] for m in default.container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == _serve_config(default, "doq-0").data_dir
    d = deploy({"storageSize": "50Gi", "storageClass": "fast-ssd"})
    spec = d.one("StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert (spec["resources"]["requests"]["storage"], spec["storageClassName"]) == ("50Gi", "fast-ssd")


@pytest.mark.parametrize(("storage", "volume_bytes"), [("10Gi", 10 << 30), ("50Gi", 50 << 30), ("500Mi", 500 << 20)])
def test_the_store_is_limited_so_that_it_and_its_reserve_fit_the_volume(storage: str, volume_bytes: int) -> None:
    """doq refuses growth (507) at --max-data-size, and its map adds a reserve past it for
    the writes that drain: both together stay within the pod's volume."""
    from doq.node.alarms import map_size

    c = _serve_config(deploy({"storageSize": storage}), "doq-0")
    assert c.max_data_size == (volume_bytes - (80 << 20)) * 4 // 5
    assert map_size(c.max_data_size) <= volume_bytes - c.disk_free_limit


@pytest.mark.parametrize("replicas", [1, 3, 5, 7])
def test_the_disruption_budget_keeps_a_quorum(replicas: int) -> None:
    d = deploy({"replicas": replicas})
    pdb = d.one("PodDisruptionBudget")["spec"]
    left = replicas - pdb["maxUnavailable"]
    assert left >= replicas // 2 + 1  # a majority stays up
    assert pdb["maxUnavailable"] == (replicas - 1) // 2  # and no more than that is kept
    assert d.one("Role")["rules"][0]["resourceNames"] == [f"doq-{i}" for i in range(replicas)]
    assert len(_serve_config(d, "doq-0").join) == replicas


@pytest.mark.parametrize("replicas", [0, 2, 4, -1])
def test_replicas_must_be_odd(replicas: int) -> None:
    with pytest.raises(pulumi.RunError, match="doq:replicas must be an odd number"):
        deploy({"replicas": replicas})


@pytest.mark.parametrize(("config", "says"), [
    ({"grpcPort": 8000}, "must differ"), ({"httpPort": 70000}, "httpPort"),
    ({"electionTimeoutMs": 50}, "electionTimeoutMs"), ({"spread": "maybe"}, "spread"),
    ({"namespace": "Doq_NS"}, "namespace"), ({"logLevel": "loud"}, "logLevel"),
    ({"storageSize": "ten"}, "storageSize"), ({"storageSize": "8Mi"}, "storageSize"),
])
def test_bad_stack_config_is_refused_with_a_clear_message(config: dict[str, object], says: str) -> None:
    with pytest.raises(pulumi.RunError, match=says):
        deploy(config)


def test_probes_and_termination(default: Deployment) -> None:
    c = default.container
    program = load_program()
    assert c["startupProbe"]["httpGet"] == {"path": "/livez", "port": "http", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http", "scheme": "HTTPS"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup >= 300  # a long restart is not killed
    # SIGTERM: a leader hands over within max(1 s, 3 election timeouts), then shuts down
    for timeout_ms in (1000, 5000):
        d = deploy({"electionTimeoutMs": timeout_ms})
        grace = d.pod_template["spec"]["terminationGracePeriodSeconds"]
        assert grace >= max(1.0, 3 * timeout_ms / 1000) + program.SHUTDOWN_S
        assert _serve_config(d, "doq-0").election_timeout_ms == timeout_ms


def test_pods_are_non_root_with_a_read_only_root_and_bounded_resources(default: Deployment) -> None:
    spec = default.pod_template["spec"]
    sc = default.container["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert sc == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "readOnlyRootFilesystem": True,
                  "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert spec["securityContext"]["fsGroup"] == 10001  # the volume is writable by the user
    writable = {m["mountPath"] for m in default.container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/doq", "/tmp"}  # the only writable places
    res = default.container["resources"]
    assert set(res["requests"]) == set(res["limits"]) == {"cpu", "memory"}
    d = deploy({"cpuRequest": "1", "cpuLimit": "4", "memoryRequest": "2Gi", "memoryLimit": "3Gi"})
    assert d.container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"},
                                        "limits": {"cpu": "4", "memory": "3Gi"}}


def test_pods_spread_across_nodes() -> None:
    required = deploy().pod_template["spec"]["affinity"]["podAntiAffinity"]
    assert required["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"
    preferred = deploy({"spread": "preferred"}).pod_template["spec"]["affinity"]["podAntiAffinity"]
    [term] = preferred["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_the_image_is_the_dockerfile_of_this_repository(default: Deployment) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "doq.__version__"}
    assert default.container["image"] == f"doq:{doq.__version__}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER 10001:10001$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["doq"\]$', dockerfile, re.M)
    known = {f"DOQ_{f.upper()}" for f in ServeConfig.__dataclass_fields__}
    for name in re.findall(r"\b(DOQ_[A-Z_]+)=", dockerfile):
        assert name in known, name
    for name in (v["name"] for v in default.container["env"]):
        # DOQ_KEY: the client key of the pod's join and of `kubectl exec ... doq` commands
        assert name in known or name.startswith("DOQ_K8S_") or name == "DOQ_KEY", name
    assert "pip install --no-cache-dir -c constraints.txt ." in dockerfile
    assert "[all]" not in dockerfile
    assert "pip uninstall -q -y pip setuptools" in dockerfile  # none in the runtime image


def test_installs_take_pinned_versions_with_the_grpc_family_at_one_version() -> None:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    family = {"grpcio", "grpcio-tools", "grpcio-reflection", "grpcio-health-checking", "grpcio-testing"}
    assert family <= pins.keys() and len({pins[n] for n in family}) == 1, {n: pins.get(n) for n in family}
    assert int(pins["protobuf"].split(".")[0]) < 7 and "pulumi" in pins
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[;! ]", d, maxsplit=1)[0].lower() for d in
             deps["dependencies"] + [d for ds in deps["optional-dependencies"].values() for d in ds]]
    assert [n for n in names if n != deps["name"] and n not in pins] == []  # every dependency pinned
    assert "!constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.count("pip install -q -c constraints.txt -e") == 2


def test_outputs_tell_how_to_reach_the_leader(default: Deployment) -> None:
    secrets = default.secrets
    assert default.outputs == {
        "namespace": NS, "leaderService": "doq", "internalService": "doq-internal",
        "leaderGrpc": "doq.doq.svc:10000", "leaderHttp": "https://doq.doq.svc:8000",
        "members": ["doq-0.doq-internal.doq.svc", "doq-1.doq-internal.doq.svc", "doq-2.doq-internal.doq.svc"],
        "portForward": "kubectl -n doq port-forward svc/doq 8000:8000",
        "docs": "https://127.0.0.1:8000/docs (while portForward runs)",
        "clusterStatus": "kubectl -n doq exec doq-0 -- doq cluster status --server https://127.0.0.1:8000 "
                         "--ca-file /etc/doq/tls/ca.crt",
        "caCert": secrets["doq-tls"]["ca.crt"], "adminKey": secrets["doq-admin-key"]["admin.key"],
    }


def test_an_existing_namespace_is_used_as_it_is() -> None:
    d = deploy({"namespace": "queues", "createNamespace": False})
    assert not d.all("Namespace")
    assert {r.manifest["metadata"]["namespace"] for r in _k8s(d)} == {"queues"}
    assert d.outputs["leaderHttp"] == "https://doq.queues.svc:8000"
