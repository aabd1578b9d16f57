"""The data of a Raft snapshot (doq/node/raft_snapshot.py): members, replicated store keys
and the state as a backup round-trip; the older layout (horizon only) still installs."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from doq.backup.format import BackupReader
from doq.backup.ops import write_backup
from doq.node.cluster import MemberAddrs
from doq.node.raft_meta import encode_members
from doq.node.raft_snapshot import (
    decode_snapshot_data,
    encode_snapshot_data,
    install_snapshot_data,
    write_state_snapshot,
)
from doq.storage.env import open_env
from doq.storage.state import CLUSTER_KEY, HORIZON_KEY, StateStore
from tests.storage.workload import entries

MEMBERS = {"n1": MemberAddrs("r1:1", "g1:2", "h1:3"), "n2": MemberAddrs("r2:1", "g2:2", "h2:3")}


def test_members_store_keys_and_state_round_trip() -> None:
    keys = {b"\x00horizon": b"\x00" * 7 + b"\x05", b"\x00rchunk\x00\x00\x00\x00": b"payload" * 100}
    data = encode_snapshot_data(MEMBERS, keys, b"STATE")
    assert decode_snapshot_data(data) == (MEMBERS, keys, b"STATE")
    assert decode_snapshot_data(encode_snapshot_data(MEMBERS, {}, b"")) == (MEMBERS, {}, b"")


@pytest.mark.parametrize("cut", [1, 9, 20])
def test_truncated_data_is_refused(cut: int) -> None:
    data = encode_snapshot_data(MEMBERS, {b"\x00horizon": b"\x00" * 8}, b"")
    with pytest.raises(ValueError):
        decode_snapshot_data(data[: len(data) - cut])


def test_the_older_layout_still_installs(tmp_path: Path) -> None:
    """A "DOQRSNP1" snapshot (an older leader's, or one persisted before the upgrade):
    horizon in its header, no other store key."""
    env = open_env(tmp_path / "src", map_size=1 << 30)
    src = StateStore(env)
    with src.write() as txn:
        src.apply_entries(txn, entries(seed=2, n=50))
    v2 = write_state_snapshot(src.open_read(), MEMBERS, "n1")
    _, _, backup = decode_snapshot_data(v2)
    m = encode_members(MEMBERS)
    v1 = struct.pack(">8sQI", b"DOQRSNP1", 7, len(m)) + m + backup
    assert decode_snapshot_data(v1) == (MEMBERS, {HORIZON_KEY: (7).to_bytes(8, "big")}, backup)
    dst = StateStore(open_env(tmp_path / "dst", map_size=1 << 30))
    with dst.write() as txn:
        assert install_snapshot_data(dst, txn, v1, src.applied_index) == MEMBERS
    assert dst.state_digest() == src.state_digest() and dst.horizon() == 7


def _header_cluster_id(data: bytes) -> str:
    return BackupReader(io.BytesIO(decode_snapshot_data(data)[2])).header.cluster_id


def test_the_snapshot_records_the_cluster_id_of_its_read(tmp_path: Path) -> None:
    """The state part's header names the cluster of the state READ (the store key in the
    read txn), not the store's id in memory when the snapshot thread writes it: a restore's
    commit may have adopted another id meanwhile (or be adopting it, uncommitted)."""
    st = StateStore(open_env(tmp_path / "a", map_size=1 << 30))
    st.ensure_cluster_id(lambda: "at-the-read")
    with st.write() as txn:
        st.apply_entries(txn, entries(seed=2, n=20))
    read = st.open_read()
    with st.write() as txn:  # after the read: what a restore's commit does
        st.set_cluster_id(txn, "adopted-later")
    data = write_state_snapshot(read, MEMBERS, "n1")
    assert _header_cluster_id(data) == "at-the-read"
    dst = StateStore(open_env(tmp_path / "dst", map_size=1 << 30))
    with dst.write() as txn:
        install_snapshot_data(dst, txn, data, read.applied_index)
    assert dst.cluster_id == "at-the-read"


def test_a_state_without_a_cluster_id_installs_without_one_whatever_the_header_says(tmp_path: Path) -> None:
    """In the current layout the store keys are the whole truth: a state of a cluster from
    before cluster ids (no `\\x00cluster` key) installs with none, even if the state part's
    header names one (a snapshot written while a restore's commit adopted one); else that
    member alone would hold an id the others do not."""
    src = StateStore(open_env(tmp_path / "src", map_size=1 << 30))
    with src.write() as txn:
        src.apply_entries(txn, entries(seed=2, n=20))
    read = src.open_read()
    assert CLUSTER_KEY not in read.store_keys
    _, keys, _ = decode_snapshot_data(write_state_snapshot(read, MEMBERS, "n1"))
    buf = io.BytesIO()
    write_backup(src, 0, buf, cluster_id="someone-else")
    backup = buf.getvalue()
    assert _header_cluster_id(encode_snapshot_data(MEMBERS, keys, backup)) == "someone-else"
    dst = StateStore(open_env(tmp_path / "dst", map_size=1 << 30))
    with dst.write() as txn:
        install_snapshot_data(dst, txn, encode_snapshot_data(MEMBERS, keys, backup), 1)
    assert dst.cluster_id == ""
    m = encode_members(MEMBERS)
    v1 = struct.pack(">8sQI", b"DOQRSNP1", 0, len(m)) + m + backup  # the older layout: from the header
    old = StateStore(open_env(tmp_path / "old", map_size=1 << 30))
    with old.write() as txn:
        install_snapshot_data(old, txn, v1, 1)
    assert old.cluster_id == "someone-else" and old.state_digest()[1] == src.state_digest()[1]
