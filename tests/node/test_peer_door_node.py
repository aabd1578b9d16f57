"""The peer door inside a real RaftNode (real LMDB, real asyncio, the in-memory network
of tests/node/raftnet.py): what the door refuses never reaches the core's inbox, whatever
its term; a joiner answers only to the cluster of its join answer, remembered on disk
before it has any Raft state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from doq.node.raft_meta import RaftMeta
from doq.node.transport_base import PeerFrame
from doq.raft.types import Message, MessageType
from tests.node.raftnet import FAST, Cluster

_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


def heartbeat(frm: str, to: str, term: int) -> Message:
    return Message(type=MessageType.HEARTBEAT, to=to, frm=frm, term=term)


async def test_a_member_hears_only_members_of_its_cluster(tmp_path: Path) -> None:
    cl = Cluster(tmp_path)
    _open.append(cl)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    cid = n1.state.cluster_id
    assert cid and n1._own_cluster_ids == (cid,)
    term = n1.cluster_status().term
    n1._inbox.clear()
    n1._on_messages(PeerFrame("mallory", (cid,), [heartbeat("mallory", "n1", term + 5)]))
    n1._on_messages(PeerFrame("n2", ("another",), [heartbeat("n2", "n1", term + 5)]))
    n1._on_messages(PeerFrame("n2", (), [heartbeat("n2", "n1", term + 5)]))
    assert [m for m in n1._inbox if m is not None] == []
    assert n1.cluster_status().term == term and n1.is_leader


async def test_a_joiner_answers_only_to_the_cluster_it_was_told_to_join(tmp_path: Path) -> None:
    cl = Cluster(tmp_path, FAST)
    _open.append(cl)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    cid = n1.state.cluster_id
    n2 = await cl.start("n2", join=True)  # not added yet: no configuration, no state
    assert n2.state.cluster_id == "" and n2._door_members == frozenset()
    assert n2._own_cluster_ids == (cid,)
    n2._inbox.clear()
    n2._on_messages(PeerFrame("x", ("another",), [heartbeat("x", "n2", 9)]))
    assert [m for m in n2._inbox if m is not None] == []
    n2._on_messages(PeerFrame("n1", (cid,), [heartbeat("n1", "n2", 9)]))
    assert [m.frm for m in n2._inbox if m is not None] == ["n1"]
    with n2.env.begin() as txn:  # on disk: a restart keeps the door shut
        assert RaftMeta.read(txn, n2.storage._meta_db).peer_cluster_ids == (cid,)  # (its open handle)
