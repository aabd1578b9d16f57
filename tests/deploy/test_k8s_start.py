"""`doq k8s-start`'s decision (doq/k8s_start.py): the pure rules, the waiting loop with a
fake probe and clock, and the local store read from a real LMDB volume. The real-process
runs of the StatefulSet's start script are in test_statefulset_rejoin.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from doq.cluster_client import ClusterError
from doq.config import ServeConfig
from doq.k8s_start import Decision, LocalStore, decide, default_seed, local_store, plan
from doq.node import store_identity
from doq.node.cluster import NodeIdentity
from doq.storage.env import node_dir, open_env

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
