"""Client keys in the StateStore on real LMDB: persisted with the applied entry, rebuilt on
reopen, carried by Raft snapshots (both kinds), never in backups' changes or the digest,
and left alone by a restore."""

from __future__ import annotations

import hashlib
from pathlib import Path

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore

H = hashlib.sha256(b"s").digest()


def _apply(st: StateStore, index: int, *cmds: c.Command) -> list[object]:
    with st.write() as txn:
        return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(1000 + index, list(cmds))))])[0]


def test_keys_survive_a_reopen_and_revocation_too(tmp_path: Path) -> None:
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    _apply(st, 1, c.CreateKey("k1", H, ("admin",)), c.CreateKey("k2", H, ("produce:q",)))
    assert set(st.keys()) == {"k1", "k2"}
    _apply(st, 2, c.RevokeKey("k1"))
    assert set(st.keys()) == {"k2"}
    env.close()
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    assert set(st.keys()) == {"k2"} and st.keys()["k2"].created_ms == 1001
    env.close()


def test_keys_are_not_backup_records_nor_digest_but_snapshots_carry_them(tmp_path: Path) -> None:
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    _apply(st, 1, c.CreateQueue("q", "delayed", QueueSettings()))
    _apply(st, 2, c.CreateKey("k1", H, ("admin",)))
    twin_env = open_env(tmp_path / "twin", map_size=1 << 28)
    twin = StateStore(twin_env)  # the same log with an empty entry where the key was created
    _apply(twin, 1, c.CreateQueue("q", "delayed", QueueSettings()))
    with twin.write() as txn:
        twin.apply_entries(txn, [(2, b"")])
    assert st.state_digest() == twin.state_digest()
    twin_env.close()
    assert all(b"k1" not in key for key, _, _ in st.iter_changes(0))
    # a dump snapshot
    env2 = open_env(tmp_path / "b", map_size=1 << 28)
    st2 = StateStore(env2)
    with st2.write() as txn:
        st2.install_snapshot(txn, st.dump_state_bytes())
    assert set(st2.keys()) == {"k1"}
    # a records snapshot (store keys + records)
    read = st.open_read()
    env3 = open_env(tmp_path / "c", map_size=1 << 28)
    st3 = StateStore(env3)
    with st3.write() as txn:
        st3.replace_records(txn, read.records, read.applied_index, read.store_keys)
    assert set(st3.keys()) == {"k1"}
    for e in (env, env2, env3):
        e.close()


def test_a_restore_keeps_the_targets_keys(tmp_path: Path) -> None:
    src_env = open_env(tmp_path / "src", map_size=1 << 28)
    src = StateStore(src_env)
    _apply(src, 1, c.CreateQueue("q", "delayed", QueueSettings()), c.CreateKey("src", H, ("admin",)))
    env = open_env(tmp_path / "dst", map_size=1 << 28)
    dst = StateStore(env)
    _apply(dst, 1, c.CreateKey("dst", H, ("admin",)))  # a fresh secure node's admin key
    assert dst.is_empty()  # a key is no record: the state may still be restored into
    dst.restore(list(src.iter_changes(0)), 1)
    assert set(dst.keys()) == {"dst"}
    assert [q.name for q in dst.list_queues()] == ["q"]
    src_env.close()
    env.close()


def test_a_failed_write_drops_the_key_changes_it_made(tmp_path: Path) -> None:
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    try:
        with st.write() as txn:
            st.apply_entries(txn, [(1, encode_batch(c.CommandBatch(1, [c.CreateKey("k1", H, ("admin",))])))])
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert st.keys() == {} and st.machine.keys.records() == []
    env.close()
