"""The node's Kubernetes part against a local fake of the API (real HTTPS on 127.0.0.1, its
own CA, every request recorded): the leader labels its pod, a node that steps down removes
the label, API errors are retried and never stop the node; in-cluster credentials are the
pod's (token re-read for every call, the CA verified)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from doq.node import k8s_leader
from doq.node.k8s_leader import InClusterApi, K8sApiError, K8sConfigError, LeaderLabel
from tests.deploy.fake_k8s import FakeKubeApi, fake_kube_api, make_credentials
from tests.support.proc import NodeProc, refused_addr

NS, POD, KEY = "doq", "doq-0", "doq.io/leader"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_credentials(tmp_path_factory.mktemp("k8s"))


@pytest.fixture
def kube(tmp_path: Path, credentials: Path) -> Iterator[tuple[FakeKubeApi, Path]]:
    shutil.copytree(credentials, tmp_path / "k8s")
    with fake_kube_api(tmp_path / "k8s", {(NS, POD): {"app.kubernetes.io/name": "doq"}}) as (api, sa):
        yield api, sa


def _env(api: FakeKubeApi, sa: Path) -> dict[str, str]:
    return {"DOQ_K8S_LEADER_LABEL": KEY, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.port), "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa),
            "DOQ_K8S_POD_NAME": POD}


def _label(env: dict[str, str], **kw: float) -> LeaderLabel:
    label = k8s_leader.from_env(env)
    assert label is not None
    label._backoff_initial_s = kw.get("backoff_initial_s", 0.05)
    label._backoff_max_s = kw.get("backoff_max_s", 0.2)
    return label


def _has_label(api: FakeKubeApi) -> bool:
    return api.pods[(NS, POD)].get(KEY) == "true"


def test_leader_labels_its_pod_and_a_follower_unlabels_it(kube: tuple[FakeKubeApi, Path]) -> None:
    api, sa = kube
    api.pods[(NS, POD)][KEY] = "true"  # left by a previous container of this pod
    label = _label(_env(api, sa))
    label.start()
    api.wait_for(lambda: not _has_label(api) and label.labelled is False)  # removed at start

    label.on_leader_change(True)
    api.wait_for(lambda: _has_label(api))
    assert api.labels(NS, POD) == {"app.kubernetes.io/name": "doq", KEY: "true"}  # others kept

    label.on_leader_change(False)
    api.wait_for(lambda: not _has_label(api))
    assert api.labels(NS, POD) == {"app.kubernetes.io/name": "doq"}

    assert [r.body for r in api.requests] == [
        {"metadata": {"labels": {KEY: None}}}, {"metadata": {"labels": {KEY: "true"}}},
        {"metadata": {"labels": {KEY: None}}}]
    for r in api.requests:
        assert (r.method, r.path, r.status) == ("PATCH", POD_PATH, 200)
        assert r.headers["content-type"] == "application/merge-patch+json"
        assert r.headers["authorization"] == "Bearer token-1"
    assert label.close(timeout_s=10) is True


def test_the_token_is_read_again_for_every_call(kube: tuple[FakeKubeApi, Path]) -> None:
    """kubelet rotates the projected service account token in place."""
    api, sa = kube
    label = _label(_env(api, sa))
    label.start()
    api.wait_for(lambda: len(api.requests) == 1)
    (sa / "token").write_text("token-2\n")
    label.on_leader_change(True)
    api.wait_for(lambda: _has_label(api))
    assert [r.headers["authorization"] for r in api.requests] == ["Bearer token-1", "Bearer token-2"]
    label.close(timeout_s=10)


def test_api_errors_are_retried_until_the_label_is_applied(kube: tuple[FakeKubeApi, Path]) -> None:
    api, sa = kube
    api.fail_next = [500, 403, 0, 429]  # server error, RBAC not there yet, no answer, throttled
    label = _label(_env(api, sa))
    label.on_leader_change(True)
    label.start()
    api.wait_for(lambda: _has_label(api))
    assert [r.status for r in api.requests] == [500, 403, 0, 429, 200]
    assert label.failures == 4
    assert all(r.body == {"metadata": {"labels": {KEY: "true"}}} for r in api.requests)
    label.on_leader_change(False)  # the worker still serves
    api.wait_for(lambda: not _has_label(api))
    label.close(timeout_s=10)


def test_a_hanging_api_never_blocks_the_node(kube: tuple[FakeKubeApi, Path]) -> None:
    """The API holds the call: leadership changes are still taken at once (the node's loop
    never waits for the API), and the last one is applied once the API answers."""
    api, sa = kube
    api.hold.clear()
    label = _label(_env(api, sa))
    label.on_leader_change(True)
    label.start()
    api.wait_for(lambda: api.held == 1)
    for i in range(101):
        label.on_leader_change(i % 2 == 1)  # returns while the API still holds the first call
    assert api.held == 1 and api.requests == []
    api.hold.set()
    api.wait_for(lambda: not _has_label(api) and label.labelled is False)
    assert [r.body["metadata"] for r in api.requests] == [  # type: ignore[index]
        {"labels": {KEY: "true"}}, {"labels": {KEY: None}}]
    label.close(timeout_s=10)


def test_an_unreachable_api_never_raises(credentials: Path) -> None:
    """Nothing listens: every call fails and is retried; close() gives up after its timeout
    and says so."""
    sa = credentials / "serviceaccount"
    with refused_addr() as nobody:
        _unreachable_api_never_raises(sa, nobody.rsplit(":", 1)[1])


def _unreachable_api_never_raises(sa: Path, port: str) -> None:
    env = {"DOQ_K8S_LEADER_LABEL": KEY, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": port, "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(sa),
           "DOQ_K8S_POD_NAME": POD}
    label = _label(env)
    label.start()
    label.on_leader_change(True)
    deadline = time.monotonic() + 30
    while label.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert label.failures >= 3 and label.labelled is None
    assert label.close(timeout_s=0.5) is False


def test_the_latest_wish_wins(kube: tuple[FakeKubeApi, Path]) -> None:
    api, sa = kube
    label = _label(_env(api, sa))
    for v in (True, False, True, False, True):
        label.on_leader_change(v)
    label.start()
    api.wait_for(lambda: _has_label(api) and label.labelled is True)
    assert [r.body for r in api.requests] == [{"metadata": {"labels": {KEY: "true"}}}]
    label.close(timeout_s=10)


def test_patch_errors_carry_the_status(kube: tuple[FakeKubeApi, Path]) -> None:
    api, sa = kube
    client = InClusterApi("127.0.0.1", api.port, sa / "token", sa / "ca.crt")
    with pytest.raises(K8sApiError) as e:
        client.patch_pod_labels(NS, "no-such-pod", {KEY: "true"})
    assert e.value.status == 404
    other_ca = sa.parent / "other-ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=other", "-keyout", str(sa.parent / "other.key"), "-out", str(other_ca)],
                   check=True, capture_output=True, timeout=60)
    untrusting = InClusterApi("127.0.0.1", api.port, sa / "token", other_ca)
    with pytest.raises(K8sApiError, match="CERTIFICATE_VERIFY_FAILED"):  # the CA is checked
        untrusting.patch_pod_labels(NS, POD, {KEY: "true"})


def test_from_env(tmp_path: Path, kube: tuple[FakeKubeApi, Path]) -> None:
    api, sa = kube
    env = _env(api, sa)
    assert k8s_leader.from_env({}) is None
    assert k8s_leader.from_env({**env, "DOQ_K8S_LEADER_LABEL": ""}) is None
    for missing, says in [("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_HOST"),
                          ("DOQ_K8S_POD_NAME", "DOQ_K8S_POD_NAME")]:
        with pytest.raises(K8sConfigError, match=says):
            k8s_leader.from_env({k: v for k, v in env.items() if k != missing})
    with pytest.raises(K8sConfigError, match="token"):
        k8s_leader.from_env({**env, "DOQ_K8S_SERVICE_ACCOUNT_DIR": str(tmp_path / "nowhere")})
    with pytest.raises(K8sConfigError, match="label key"):
        k8s_leader.from_env({**env, "DOQ_K8S_LEADER_LABEL": "not a label"})
    # the namespace comes from the service account unless DOQ_K8S_NAMESPACE names one
    api.pods[("other", POD)] = {}
    for extra, ns in [({}, NS), ({"DOQ_K8S_NAMESPACE": "other"}, "other")]:
        label = _label({**env, **extra})
        label.start()
        label.on_leader_change(True)
        api.wait_for(lambda ns=ns: api.pods[(ns, POD)].get(KEY) == "true")  # type: ignore[misc]
        label.close(timeout_s=10)


# -- the real node -------------------------------------------------------------------------


def _node(tmp_path: Path, env: dict[str, str]) -> NodeProc:
    """A `doq serve` of the pod `POD` with the in-cluster environment `env`."""
    return NodeProc(tmp_path / "data", node_id=POD, env=env, log_path=tmp_path / "node.log")


@pytest.mark.integration
def test_doq_serve_labels_its_pod_through_api_errors_and_unlabels_on_sigterm(
        tmp_path: Path, kube: tuple[FakeKubeApi, Path]) -> None:
    """A lone node leads: it labels its pod even though the API first fails (and keeps
    serving meanwhile); on SIGTERM it removes the label and exits 0."""
    api, sa = kube
    api.fail_next = [503, 503, 0]
    node = _node(tmp_path, _env(api, sa))
    try:
        node.start()  # ready (its /readyz answers 200) while the API still fails
        api.wait_for(lambda: _has_label(api))
        assert [r.status for r in api.requests][:3] == [503, 503, 0]
        with node.urlopen(node.http_url + "/livez", timeout=5) as r:
            assert r.status == 200
        assert node.terminate(60) == 0, node.log()
        assert not _has_label(api)
        assert api.requests[-1].body == {"metadata": {"labels": {KEY: None}}}
    finally:
        node.kill9()


@pytest.mark.integration
def test_doq_serve_refuses_to_start_without_the_in_cluster_setup(tmp_path: Path) -> None:
    node = _node(tmp_path, {"DOQ_K8S_LEADER_LABEL": KEY, "KUBERNETES_SERVICE_HOST": ""}).launch()
    assert node.proc is not None and node.proc.wait(60) == 1
    assert "KUBERNETES_SERVICE_HOST" in node.log()
    assert not (tmp_path / "data" / POD).exists()  # nothing on disk
