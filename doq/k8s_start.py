"""`doq k8s-start`: how a StatefulSet's pod starts — restart, join, or (the seed only, once)
bootstrap — decided from its own store and the other replicas' store identities.

The bootstrap is the one decision that must never be taken twice for a cluster that has
existed: a second bootstrap makes a second cluster that acknowledges writes the real one
never sees. So it is explicit and taken on evidence, never on silence:

1. A store with Raft data restarts from it (the join list is ignored), whoever it is.
2. A store a join already admitted into a cluster (`store_identity.cluster_id`) joins that
   cluster again, and no other.
3. A pod other than the seed joins (`--join`): it never bootstraps.
4. The seed (`--seed`, default the StatefulSet's ordinal 0) with an empty store asks every
   other replica `GET /cluster/identity` (answered also while they wait to join:
   `doq.service.startup_http`), and repeats until it can decide:
   - any replica belongs to a cluster → join it, refusing any other (`--cluster-id`);
     a replica with data from before cluster ids → join (any cluster);
   - every other replica answered and every one is empty → bootstrap: no replica has
     ever held this cluster's data, so there is nothing a new cluster could shadow;
   - any replica silent (not started, restarting, unreachable) → wait: it may hold the
     cluster. Replicas of two different clusters → wait (an operator must choose).

Why this is safe (docs/deploy.md): when all pods start at once (Parallel) the others either
have data (they answer with the cluster id once their gateway runs) or are empty and
waiting to join (they answer "empty" at once); when only the seed lost its disk the others
answer with the cluster and the seed joins it — and is replaced as a member that came back
with a new store; when all disks are lost every replica answers "empty" and a new cluster
forms, the only way forward. The decision's inputs are durable: the seed's bootstrap
writes its store (rule 1 from then on), a join records the cluster (rule 2).

Secure pods (docs/deploy.md, "Keys and certificates in Kubernetes"): with `--tls-secret-dir DIR` (the
Secret the Pulumi program mounts: `ca.crt`, `<node id>.crt`, `<node id>.key`) the pod's
certificate and the cluster CA certificate are installed as the node's `tls/` before
anything else (`install_tls`: replaced at every start; no CA key is ever there; while the
node runs, a Secret kubelet updates in place is taken within `--tls-secret-poll-s`:
`TlsAdmin.follow_secret`), and the seed asks the other replicas over
HTTPS, verifying them with that CA.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from doq.auth.mode import runs_secure
from doq.cluster_client import ClusterError, base_url, get_identity, request_json
from doq.config import ServeConfig
from doq.node.cluster import NodeIdentity
from doq.node.cluster_wire import identity_from_json
from doq.storage.env import node_dir
from doq.storage.files import private_dir
from doq.tls.certs import CA_CERT, TLS_DIR
from doq.tls.creds import ssl_client_context
from doq.tls.secret_dir import install, read_secret

log = logging.getLogger(__name__)

Action = Literal["restart", "join", "bootstrap", "wait"]
WAIT_LOG_EVERY_S = 10.0
PROBE_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class LocalStore:
    """What the pod's own volume holds."""

    has_data: bool  # Raft data: a member's store
    cluster_id: str = ""  # the cluster a join admitted this (still empty) store into


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    why: str
    cluster_id: str = ""  # join: the cluster to join ("" : any)


def decide(*, is_seed: bool, local: LocalStore, answers: Mapping[str, NodeIdentity | None]) -> Decision:
    """The rules of the module docstring. `answers`: each other replica's HTTP address and
    its identity, None if it did not answer. Pure."""
    if local.has_data:
        return Decision("restart", "the volume holds this member's data")
    if local.cluster_id:
        return Decision("join", f"this store was admitted into cluster {local.cluster_id}", local.cluster_id)
    if not is_seed:
        return Decision("join", "not the seed: it joins, it never bootstraps")
    clusters = sorted({a.cluster_id for a in answers.values() if a is not None and a.cluster_id})
    if len(clusters) > 1:
        return Decision("wait", f"replicas belong to different clusters {clusters}: an operator must choose")
    if clusters:
        holders = sorted(addr for addr, a in answers.items() if a is not None and a.cluster_id == clusters[0])
        return Decision("join", f"{', '.join(holders)} belong(s) to cluster {clusters[0]}", clusters[0])
    if any(a is not None and not a.empty for a in answers.values()):
        return Decision("join", "a replica holds a cluster from before cluster ids")
    silent = sorted(addr for addr, a in answers.items() if a is None)
    if silent:
        return Decision("wait", f"no answer yet from {', '.join(silent)} (it may hold the cluster)")
    return Decision("bootstrap", "every other replica answered that its store is empty"
                    if answers else "no other replica")


def default_seed(node_id: str) -> str:
    """The StatefulSet's ordinal 0 of `node_id` (`doq-2` → `doq-0`); raises ValueError for
    an id without an ordinal."""
    m = re.fullmatch(r"(.+)-(\d+)", node_id)
    if not m:
        raise ValueError(f"node id {node_id!r} has no StatefulSet ordinal: give --seed")
    return f"{m[1]}-0"


def install_tls(config: ServeConfig, secret_dir: Path) -> Path:
    """Install the cluster TLS material mounted at `secret_dir` (`ca.crt`, `<node id>.crt`,
    `<node id>.key`: one Secret for every pod) as this node's NODE_DIR/tls
    (`doq.tls.secret_dir.install`). Returns the CA certificate's path. Raises ValueError
    naming a missing file (never a content)."""
    material = read_secret(secret_dir, config.node_id)  # nothing is created without it
    directory = private_dir(node_dir(config.data_dir, config.node_id)) / TLS_DIR
    install(directory, material)
    return directory / CA_CERT


def identity_probe(config: ServeConfig) -> Callable[[str], NodeIdentity]:
    """How the seed asks another replica `GET /cluster/identity`: plain HTTP when the node
    does not run secure, else HTTPS verified with the cluster CA in NODE_DIR/tls (ValueError
    if there is none: the answer of a replica could not be trusted)."""
    if not runs_secure(config):
        return get_identity
    ca_file = node_dir(config.data_dir, config.node_id) / TLS_DIR / CA_CERT
    if not ca_file.exists():
        raise ValueError(f"{config.node_id} runs secure but has no cluster CA ({ca_file}) to verify the other "
                         "replicas with: give the Secret's directory with --tls-secret-dir")
    ctx = ssl_client_context(ca_file=ca_file)

    def probe(addr: str) -> NodeIdentity:
        answer = request_json(addr, "GET", "/cluster/identity", timeout_s=3.0, ssl_context=ctx)
        try:
            return identity_from_json(answer.body)
        except ValueError as e:
            raise ClusterError(0, "BAD_ANSWER", f"{addr}: {e}") from None

    return probe


def local_store(config: ServeConfig) -> LocalStore:
    """Read the pod's volume (without creating anything: an absent store is empty)."""
    from doq.node import store_identity
    from doq.node.build import has_raft_data
    from doq.storage.env import node_dir, open_env

    path = node_dir(config.data_dir, config.node_id) / "doq.lmdb"
    if not (path / "data.mdb").exists():
        return LocalStore(False)
    env = open_env(path)
    try:
        ident = store_identity.load(env)
        return LocalStore(has_raft_data(env), ident.cluster_id if ident else "")
    finally:
        env.close()


def probe_all(addrs: list[str], probe: Callable[[str], NodeIdentity]) -> dict[str, NodeIdentity | None]:
    out: dict[str, NodeIdentity | None] = {}
    for addr in addrs:
        try:
            out[addr] = probe(addr)
        except ClusterError:
            out[addr] = None
    return out


def plan(config: ServeConfig, seed: str, *, local: LocalStore | None = None,
         probe: Callable[[str], NodeIdentity] | None = None,
         sleep: Callable[[float], None] = time.sleep,
         monotonic: Callable[[], float] = time.monotonic) -> tuple[ServeConfig, Decision]:
    """Decide (waiting as long as `decide` says "wait") and return the config to serve with:
    the join list dropped for a bootstrap, the cluster id set for a join. `probe` (default
    `identity_probe(config)`) asks one replica its identity."""
    local = local_store(config) if local is None else local
    own = base_url(config.member_addrs().http_addr)
    others = [a for a in config.join if base_url(a) != own]
    is_seed = config.node_id == seed
    asks = is_seed and not local.has_data and not local.cluster_id and bool(others)
    ask = probe or (identity_probe(config) if asks else get_identity)
    next_log = 0.0
    while True:
        answers = probe_all(others, ask) if asks else {}
        d = decide(is_seed=is_seed, local=local, answers=answers)
        if d.action != "wait":
            break
        if monotonic() >= next_log:
            log.warning("doq k8s-start: %s waits: %s", config.node_id, d.why)
            next_log = monotonic() + WAIT_LOG_EVERY_S
        sleep(PROBE_EVERY_S)
    if d.action == "bootstrap":
        return replace(config, join=()), d
    if d.action == "join":
        if not config.join:
            raise ValueError(f"{config.node_id} must join ({d.why}) but has no --join addresses")
        return replace(config, cluster_id=config.cluster_id or d.cluster_id), d
    return config, d
