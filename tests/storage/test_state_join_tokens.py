"""Join tokens in the StateStore on real LMDB (issue 18): kept beside the client keys, not
as queue records. Persisted with the applied entry and rebuilt on reopen, carried by Raft
snapshots, never in backups' changes or the digest, left alone by a restore (a crafted
backup brings no token), and a data dir of an older version holding `J` records still
opens: those records are ignored (they enroll nobody)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore

H = hashlib.sha256(b"s").digest()
T1, T2 = b"1" * 16, b"2" * 16
FAR = 10**13


def _apply(st: StateStore, index: int, *cmds: c.Command) -> list[object]:
    with st.write() as txn:
        return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(1000 + index, list(cmds))))])[0]


def test_tokens_survive_a_reopen_and_a_use_too(tmp_path: Path) -> None:
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    assert _apply(st, 1, c.CreateJoinToken(T1, H, FAR), c.CreateJoinToken(T2, H, FAR)) == [None, None]
    assert set(st.join_tokens()) == {T1, T2}
    assert _apply(st, 2, c.UseJoinToken(T1, H, "n4")) == [None]
    assert set(st.join_tokens()) == {T2}
    env.close()
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    assert set(st.join_tokens()) == {T2} and st.join_tokens()[T2].expires_ms == FAR
    used = _apply(st, 3, c.UseJoinToken(T1, H, "n5"))[0]
    assert getattr(used, "reason", "") == "INVALID_JOIN_TOKEN"
    env.close()


def test_tokens_are_not_backup_records_nor_digest_but_snapshots_carry_them(tmp_path: Path) -> None:
    env = open_env(tmp_path / "a", map_size=1 << 28)
    st = StateStore(env)
    assert st.is_empty()
    _apply(st, 1, c.CreateJoinToken(T1, H, FAR))
    assert st.is_empty()  # a token is no record: a fresh secure cluster may still be restored into
    _apply(st, 2, c.CreateQueue("q", "delayed", QueueSettings()))
    twin_env = open_env(tmp_path / "twin", map_size=1 << 28)
    twin = StateStore(twin_env)  # the same log with an empty entry where the token was created
    with twin.write() as txn:
        twin.apply_entries(txn, [(1, b"")])
    _apply(twin, 2, c.CreateQueue("q", "delayed", QueueSettings()))
    assert st.state_digest() == twin.state_digest()
    twin_env.close()
    assert all(T1 not in key and H not in (payload or b"") for key, payload, _ in st.iter_changes(0))
    env2 = open_env(tmp_path / "b", map_size=1 << 28)
    st2 = StateStore(env2)
    with st2.write() as txn:
        st2.install_snapshot(txn, st.dump_state_bytes())
    assert set(st2.join_tokens()) == {T1}
    read = st.open_read()
    env3 = open_env(tmp_path / "c", map_size=1 << 28)
    st3 = StateStore(env3)
    with st3.write() as txn:
        st3.replace_records(txn, read.records, read.applied_index, read.store_keys)
    assert set(st3.join_tokens()) == {T1}
    for e in (env, env2, env3):
        e.close()


def test_a_restore_keeps_the_targets_tokens_and_a_crafted_J_record_enrolls_nobody(tmp_path: Path) -> None:
    src_env = open_env(tmp_path / "src", map_size=1 << 28)
    src = StateStore(src_env)
    _apply(src, 1, c.CreateQueue("q", "delayed", QueueSettings()), c.CreateJoinToken(T1, H, FAR))
    changes = list(src.iter_changes(0))
    # what a backup of an older version held (or what a holder of a `restore` key could craft)
    changes.append((K.join_token_key(T2), struct.pack(">Q32s", FAR, H), changes[-1][2]))
    env = open_env(tmp_path / "dst", map_size=1 << 28)
    dst = StateStore(env)
    _apply(dst, 1, c.CreateJoinToken(b"d" * 16, H, FAR))
    dst.restore(changes, 1)
    assert set(dst.join_tokens()) == {b"d" * 16}
    assert [q.name for q in dst.list_queues()] == ["q"]
    for tid in (T1, T2):
        assert getattr(_apply(dst, 5 + tid[0], c.UseJoinToken(tid, H, "x"))[0], "reason", "") == "INVALID_JOIN_TOKEN"
    src_env.close()
    env.close()


def test_a_data_dir_with_J_records_of_an_older_version_opens(tmp_path: Path) -> None:
    env = open_env(tmp_path / "old", map_size=1 << 28)
    st = StateStore(env)
    _apply(st, 1, c.CreateQueue("q", "delayed", QueueSettings()))
    with st.write() as txn:  # what an older version wrote: a `J` record beside the queues'
        st._sink.txn = txn
        st._sink.ver = struct.pack(">Q", 2)
        st.machine.store.put(K.join_token_key(T1), struct.pack(">Q32s", FAR, H))
        st._sink.txn = None
        st.apply_entries(txn, [(2, b"")])
    digest = st.state_digest()
    env.close()
    env = open_env(tmp_path / "old", map_size=1 << 28)
    st = StateStore(env)  # loads
    assert [q.name for q in st.list_queues()] == ["q"] and st.join_tokens() == {}
    assert st.state_digest() == digest  # the record stays what it was: replicas keep agreeing
    assert getattr(_apply(st, 3, c.UseJoinToken(T1, H, "x"))[0], "reason", "") == "INVALID_JOIN_TOKEN"
    env.close()
