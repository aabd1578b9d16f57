"""One sync or two per commit (`doq.storage.env`): the environment is opened without
LMDB's meta-page sync, and every commit that must be durable when it returns syncs it
explicitly (`sync_meta`): `StateStore.write()` by default, the node's start-up writes
(store identity, bootstrap). `StateStore.write(durable=False)` leaves it out: its commit
is whole but may be undone by an OS crash (a process crash keeps it: the page cache)."""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import pytest

from doq.node import log_start, store_identity
from doq.node.cluster import MemberAddrs
from doq.node.wal_log import WalLogStorage
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage import env as env_mod
from doq.storage.env import open_env
from doq.storage.state import StateStore


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every `sync_meta` call (the env's path), through each module that calls it."""
    calls: list[str] = []
    real = env_mod.sync_meta

    def counting(env: lmdb.Environment) -> None:
        calls.append(env.path())
        real(env)

    for mod in ("doq.storage.state", "doq.node.store_identity", "doq.node.log_start"):
        monkeypatch.setattr(f"{mod}.sync_meta", counting)
    return calls


def test_the_environment_leaves_the_meta_sync_to_sync_meta(tmp_path: Path) -> None:
    env = open_env(tmp_path / "s")
    assert env.flags()["sync"] is True and env.flags()["metasync"] is False
    env.close()


def test_a_durable_write_syncs_the_meta_page_and_a_derivable_one_does_not(tmp_path: Path, syncs: list[str]) -> None:
    env = open_env(tmp_path / "s")
    st = StateStore(env)
    syncs.clear()
    with st.write() as txn:
        st.apply_entries(txn, [(1, _batch(c.CreateQueue("q", "delayed", QueueSettings())))])
    assert syncs == [env.path()]
    with st.write(durable=False) as txn:
        st.apply_entries(txn, [(2, _batch(c.Enqueue("q", [c.EnqueueItem(b"m")])))])
    assert syncs == [env.path()]  # committed, visible, not synced
    assert st.get_queue("q").stats.total == 1 and st.applied_index == 2
    env.close()
    env = open_env(tmp_path / "s")  # the commit is whole (the page cache kept it)
    assert StateStore(env).get_queue("q").stats.total == 1
    env.close()


def test_the_nodes_start_up_writes_sync_the_meta_page(tmp_path: Path, syncs: list[str]) -> None:
    env = open_env(tmp_path / "s")
    syncs.clear()
    ident = store_identity.ensure(env, empty_join=False)
    assert syncs == [env.path()]
    store_identity.record_cluster(env, "c1")
    assert len(syncs) == 2 and ident.store_id
    state = StateStore(env)
    storage = WalLogStorage(env)
    state.ensure_cluster_id(lambda: "c1")  # the state's own write (durable)
    syncs.clear()
    log_start.bootstrap(env, storage, state, "n1", MemberAddrs("r:1", "g:2", "h:3"), random.Random(1))
    assert syncs == [env.path()]  # the bootstrap snapshot's write
    log_start.remember_join_cluster_id(env, storage, "c2")
    assert syncs == [env.path()] * 2
    env.close()


def _batch(cmd: c.Command) -> bytes:
    return encode_batch(c.CommandBatch(1_700_000_000_000, [cmd]))
