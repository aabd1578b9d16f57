"""The data of a Raft snapshot (doq/node/raft_snapshot.py): members, replicated store keys
and the state as a backup round-trip; the older layout (horizon only) still installs."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from doq.node.cluster import MemberAddrs
from doq.node.raft_log import encode_members
from doq.node.raft_snapshot import (
    decode_snapshot_data,
    encode_snapshot_data,
    install_snapshot_data,
    write_state_snapshot,
)
from doq.storage.env import open_env
from doq.storage.state import HORIZON_KEY, StateStore
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
