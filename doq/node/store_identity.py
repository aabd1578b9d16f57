"""A node's store identity: which incarnation of the node's disk this is.

Kept in the Raft metadata database (`raft_meta`, key b"store", JSON), beside the log: it
is never part of a snapshot or a backup, so it names this store only.

- `store_id`: random, created with the store (the first start on an empty data dir, or
  the first start of a version that has store ids). A node that lost its disk and comes
  back under the same node id has another one: the leader sees a join from a known
  member with a new store and *replaces* it (removes the old entry and adds it again as
  a learner with fresh progress; `RaftNode.add_member`) instead of treating it as the
  voter whose acknowledgements it counted.
- `voting_gated`: set when the store is created empty to join a cluster. While set the
  node takes no part in elections (`RaftCore.allow_voting(False)`): it cleared once the
  node's log holds the conf change that admitted this store (or a snapshot listing it),
  which, by log matching, means it holds the leader's log up to its re-admission, and so
  every entry it ever acknowledged under an earlier store. Persisted, so a restart keeps it.
- `cluster_id`: the cluster this store was admitted into by a join answer ("" before), so
  an empty store that was already admitted says so (`GET /cluster/identity`) and never
  joins another cluster.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

import lmdb

from doq.storage.env import open_db, sync_meta

STORE_KEY = b"store"


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    store_id: str
    voting_gated: bool = False
    cluster_id: str = ""

    def with_cluster(self, cluster_id: str) -> StoreIdentity:
        return replace(self, cluster_id=cluster_id)

    def ungated(self) -> StoreIdentity:
        return replace(self, voting_gated=False)


def encode(ident: StoreIdentity) -> bytes:
    return json.dumps({"store_id": ident.store_id, "voting_gated": ident.voting_gated,
                       "cluster_id": ident.cluster_id}, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> StoreIdentity:
    """Inverse of `encode`; raises ValueError on malformed bytes."""
    try:
        d = json.loads(raw)
        return StoreIdentity(str(d["store_id"]), bool(d.get("voting_gated", False)), str(d.get("cluster_id", "")))
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"malformed store identity: {e!r}") from None


def load(env: lmdb.Environment) -> StoreIdentity | None:
    """The stored identity, None if this store has none yet."""
    db = meta_db(env)
    with env.begin() as txn:
        raw = txn.get(STORE_KEY, db=db)
    return decode(bytes(raw)) if raw is not None else None


def meta_db(env: lmdb.Environment) -> lmdb._Database:
    """The database the identity lives in (open it outside any write txn)."""
    return open_db(env, b"raft_meta")


def save(txn: lmdb.Transaction, db: lmdb._Database, ident: StoreIdentity) -> None:
    """Record `ident` inside the caller's write `txn` (`db`: `meta_db`)."""
    txn.put(STORE_KEY, encode(ident), db=db)


def ensure(env: lmdb.Environment, *, empty_join: bool,
           new_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> StoreIdentity:
    """The store's identity, created (and made durable) if it has none: gated when the
    store is empty and the node joins (`empty_join`), not otherwise (a bootstrap, or a
    store with data from before store ids)."""
    ident = load(env)
    if ident is None:
        ident = StoreIdentity(new_id(), voting_gated=empty_join)
        db = meta_db(env)
        with env.begin(write=True) as txn:
            save(txn, db, ident)
        sync_meta(env)
    return ident


def record_cluster(env: lmdb.Environment, cluster_id: str) -> StoreIdentity:
    """Record the cluster a join admitted this store into (durably); returns the identity."""
    ident = load(env)
    if ident is None:
        raise ValueError("the store has no identity yet")
    if cluster_id and ident.cluster_id != cluster_id:
        ident = ident.with_cluster(cluster_id)
        db = meta_db(env)
        with env.begin(write=True) as txn:
            save(txn, db, ident)
        sync_meta(env)
    return ident
