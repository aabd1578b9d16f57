"""`doq k8s-start`'s decision (doq/k8s_start.py): the pure rules, the waiting loop with a
fake probe and clock, and the local store read from a real LMDB volume. The real-process
runs of the StatefulSet's start script are in test_statefulset_rejoin.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from doq.auth.bootstrap import read_admin_key_file
from doq.auth.tokens import new_key
from doq.cluster_client import ClusterError, get_identity
from doq.config import ServeConfig
from doq.k8s_start import (
    Decision,
    LocalStore,
    decide,
    default_seed,
    identity_probe,
    install_tls,
    local_store,
    plan,
    probe_all,
)
from doq.node import store_identity
from doq.node.cluster import NodeIdentity
from doq.node.cluster_wire import identity_to_json
from doq.storage.env import node_dir, open_env
from doq.tls.certs import generate_ca, issue_node_cert

EMPTY = LocalStore(False)
CLUSTER = "0b6f7a3e-5c1d-4e8a-9f52-7d0c3a1e6b94"


def empty(nid: str) -> NodeIdentity:
    return NodeIdentity(nid, "a" * 32, "", empty=True)


def member(nid: str, cluster_id: str = CLUSTER) -> NodeIdentity:
    return NodeIdentity(nid, "b" * 32, cluster_id, empty=False)


def test_a_store_with_data_restarts_whoever_it_is_and_whatever_the_others_say() -> None:
    for seed in (True, False):
        d = decide(is_seed=seed, local=LocalStore(True), answers={"x": empty("doq-1")})
        assert d.action == "restart"


def test_a_pod_other_than_the_seed_joins_and_never_bootstraps() -> None:
    assert decide(is_seed=False, local=EMPTY, answers={}).action == "join"


def test_a_store_admitted_by_an_earlier_join_joins_that_cluster_again() -> None:
    d = decide(is_seed=True, local=LocalStore(False, CLUSTER), answers={"a": empty("doq-1"), "b": empty("doq-2")})
    assert (d.action, d.cluster_id) == ("join", CLUSTER)


def test_the_seed_bootstraps_only_when_every_other_replica_says_it_is_empty() -> None:
    d = decide(is_seed=True, local=EMPTY, answers={"a": empty("doq-1"), "b": empty("doq-2")})
    assert d.action == "bootstrap"
    assert decide(is_seed=True, local=EMPTY, answers={}).action == "bootstrap"  # one replica


def test_the_seed_waits_while_any_replica_is_silent() -> None:
    d = decide(is_seed=True, local=EMPTY, answers={"a": empty("doq-1"), "b": None})
    assert d.action == "wait" and "b" in d.why


def test_the_seed_joins_when_any_replica_belongs_to_a_cluster_even_if_another_is_silent() -> None:
    d = decide(is_seed=True, local=EMPTY, answers={"a": None, "b": member("doq-2")})
    assert (d.action, d.cluster_id) == ("join", CLUSTER)


def test_the_seed_joins_a_cluster_from_before_cluster_ids() -> None:
    d = decide(is_seed=True, local=EMPTY, answers={"a": empty("doq-1"), "b": member("doq-2", "")})
    assert (d.action, d.cluster_id) == ("join", "")


def test_replicas_of_two_clusters_make_the_seed_wait_for_an_operator() -> None:
    d = decide(is_seed=True, local=EMPTY, answers={"a": member("doq-1", "c1"), "b": member("doq-2", "c2")})
    assert d.action == "wait" and "different clusters" in d.why


def test_default_seed_is_ordinal_zero() -> None:
    assert default_seed("doq-2") == "doq-0"
    assert default_seed("my-db-10") == "my-db-0"
    with pytest.raises(ValueError):
        default_seed("node")


def _config(node_id: str) -> ServeConfig:
    return ServeConfig(node_id=node_id, http_addr="127.0.0.1:8000",
                       join=("127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"))


def test_plan_probes_the_others_until_it_can_decide_then_drops_the_join_list_to_bootstrap() -> None:
    rounds: list[str] = []
    answers = {"127.0.0.1:8001": [None, empty("doq-1")], "127.0.0.1:8002": [None, None, empty("doq-2")]}

    def probe(addr: str) -> NodeIdentity:
        rounds.append(addr)
        queue = answers[addr]
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        if a is None:
            raise ClusterError(0, "UNREACHABLE", addr)
        return a

    slept: list[float] = []
    config, d = plan(_config("doq-0"), "doq-0", local=EMPTY, probe=probe, sleep=slept.append,
                     monotonic=lambda: 0.0)
    assert d.action == "bootstrap" and config.join == ()
    assert "127.0.0.1:8000" not in rounds  # never itself
    assert len(slept) == 2  # two rounds with a silent replica


def test_plan_joins_with_the_cluster_id_it_found() -> None:
    config, d = plan(_config("doq-0"), "doq-0", local=EMPTY, probe=lambda a: member(a),
                     sleep=lambda s: None)
    assert d == Decision("join", d.why, CLUSTER)
    assert config.cluster_id == CLUSTER and config.join == _config("doq-0").join


def test_plan_of_a_pod_other_than_the_seed_probes_nobody() -> None:
    def probe(addr: str) -> NodeIdentity:
        raise AssertionError("probed")

    config, d = plan(_config("doq-1"), "doq-0", local=EMPTY, probe=probe)
    assert d.action == "join" and config.join


def test_local_store_reads_the_volume_without_creating_it(tmp_path: Path) -> None:
    cfg = ServeConfig(node_id="doq-0", data_dir=str(tmp_path))
    assert local_store(cfg) == LocalStore(False)
    assert not node_dir(tmp_path, "doq-0").exists()
    env = open_env(node_dir(tmp_path, "doq-0") / "doq.lmdb")
    try:
        store_identity.ensure(env, empty_join=True)
        store_identity.record_cluster(env, CLUSTER)
    finally:
        env.close()
    assert local_store(cfg) == LocalStore(False, CLUSTER)


# -- secure pods: the TLS Secret, the seed's HTTPS probe, the provided admin key -----------


def _secret_dir(tmp_path: Path, pods: list[str]) -> tuple[Path, bytes, bytes]:
    """A directory laid out as the Pulumi program's `doq-tls` Secret mounts it."""
    ca_cert, ca_key = generate_ca()
    d = tmp_path / "secret"
    d.mkdir(exist_ok=True)
    (d / "ca.crt").write_bytes(ca_cert)
    for pod in pods:
        cert, key = issue_node_cert(ca_cert, ca_key, pod, ["127.0.0.1"])
        (d / f"{pod}.crt").write_bytes(cert)
        (d / f"{pod}.key").write_bytes(key)
    return d, ca_cert, ca_key


def test_install_tls_puts_the_pods_files_in_its_tls_dir_private_and_never_a_ca_key(tmp_path: Path) -> None:
    secret, ca_cert, _ = _secret_dir(tmp_path, ["doq-0", "doq-1"])
    cfg = ServeConfig(node_id="doq-1", data_dir=str(tmp_path / "data"))
    tls = node_dir(tmp_path / "data", "doq-1") / "tls"
    tls.mkdir(parents=True)
    (tls / "ca.key").write_bytes(b"a CA key left from a self-made CA")
    assert install_tls(cfg, secret) == tls / "ca.crt"
    assert sorted(p.name for p in tls.iterdir()) == ["ca.crt", "node.crt", "node.key"]
    assert (tls / "ca.crt").read_bytes() == ca_cert
    assert (tls / "node.crt").read_bytes() == (secret / "doq-1.crt").read_bytes()  # its own, not doq-0's
    assert (tls / "node.key").read_bytes() == (secret / "doq-1.key").read_bytes()
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in tls.iterdir()} == {0o600}
    # a rotated Secret replaces them at the next start
    (tmp_path / "rotated").mkdir()
    secret2, ca2, _ = _secret_dir(tmp_path / "rotated", ["doq-1"])
    install_tls(cfg, secret2)
    assert (tls / "ca.crt").read_bytes() == ca2 != ca_cert


def test_install_tls_without_the_pods_files_names_what_is_missing(tmp_path: Path) -> None:
    secret, _, _ = _secret_dir(tmp_path, ["doq-0"])
    with pytest.raises(ValueError, match=r"doq-7\.crt") as e:
        install_tls(ServeConfig(node_id="doq-7", data_dir=str(tmp_path / "data")), secret)
    assert "BEGIN" not in str(e.value)
    assert not node_dir(tmp_path / "data", "doq-7").exists()  # nothing written


@contextlib.contextmanager
def _https_identity(tmp_path: Path, cert: bytes, key: bytes) -> Iterator[int]:
    """A local HTTPS server answering GET /cluster/identity as an empty joiner does."""
    body = json.dumps(identity_to_json(empty("doq-1"))).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    (tmp_path / "srv.crt").write_bytes(cert)
    (tmp_path / "srv.key").write_bytes(key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_secure_seed_asks_over_https_and_trusts_only_the_cluster_ca(tmp_path: Path) -> None:
    secret, ca_cert, ca_key = _secret_dir(tmp_path, ["doq-0", "doq-1"])
    cfg = ServeConfig(node_id="doq-0", data_dir=str(tmp_path / "data"), secure=True)
    with pytest.raises(ValueError, match="no cluster CA"):  # nothing to verify the answers with
        identity_probe(cfg)
    install_tls(cfg, secret)
    probe = identity_probe(cfg)
    with _https_identity(tmp_path, (secret / "doq-1.crt").read_bytes(), (secret / "doq-1.key").read_bytes()) as port:
        assert probe(f"127.0.0.1:{port}") == empty("doq-1")
    # a server with a certificate of another CA is not believed: the seed counts it as silent
    other_cert, other_key = generate_ca()
    cert, key = issue_node_cert(other_cert, other_key, "doq-1", ["127.0.0.1"])
    with _https_identity(tmp_path, cert, key) as port:
        with pytest.raises(ClusterError):
            probe(f"127.0.0.1:{port}")
        assert probe_all([f"127.0.0.1:{port}"], probe) == {f"127.0.0.1:{port}": None}
    assert identity_probe(ServeConfig(node_id="doq-0", data_dir=str(tmp_path / "data"))) is get_identity  # plain


def test_the_admin_key_file_gives_a_well_formed_key_or_a_clear_error_without_its_content(tmp_path: Path) -> None:
    assert read_admin_key_file("") is None
    new = new_key()
    path = tmp_path / "admin.key"
    path.write_text(new.token + "\n")
    assert read_admin_key_file(str(path)) == new
    path.write_text("not-a-doq-key-s3cr3t")
    with pytest.raises(ValueError, match="not a doq key") as e:
        read_admin_key_file(str(path))
    assert "s3cr3t" not in str(e.value)
    with pytest.raises(ValueError, match="cannot read"):
        read_admin_key_file(str(tmp_path / "missing"))
