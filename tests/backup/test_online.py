"""`restore_online` into a real `LocalNode` over real LMDB files: preconditions, and all or
nothing (a failed restore leaves the node exactly as it was, and a retry then works)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from doq.backup.format import BackupReader
from doq.backup.online import restore_online
from doq.backup.ops import write_backup
from doq.errors import FailedPrecondition, InvalidArgument, NotLeader, QueueNotFound
from doq.queues.commands import EnqueueItem
from doq.service.api import QueueService
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.support.local_node import LocalNode


async def _node(path: Path, cls: type[LocalNode] = LocalNode) -> LocalNode:
    node = cls(StateStore(open_env(path, map_size=64 * 1024**2)))
    await node.start()
    return node


def _backup(node: LocalNode, since: int, cluster_id: str | None = None) -> tuple[bytes, int]:
    buf = io.BytesIO()
    last = write_backup(node.state, since, buf, cluster_id=cluster_id)
    return buf.getvalue(), last


@dataclass
class Chain:
    live: LocalNode
    full: bytes
    inc: bytes
    foreign_inc: bytes  # a valid incremental of ANOTHER node (cluster) whose versions fit the chain
    anonymous_foreign_inc: bytes  # the same without its cluster id (as written before cluster ids)

    def files(self, *parts: bytes) -> list[io.BytesIO]:
        return [io.BytesIO(p) for p in parts]


@pytest.fixture
async def chain(tmp_path: Path) -> AsyncIterator[Chain]:
    live = await _node(tmp_path / "live")
    other = await _node(tmp_path / "other")
    try:
        api = QueueService(live)
        await api.create_queue("jobs")
        ids = [(await api.enqueue("jobs", EnqueueItem(b"job-%d" % i, priority=i))).id for i in range(5)]
        full, last = _backup(live, 0)
        await api.delete_message("jobs", ids[0])
        await api.enqueue("jobs", EnqueueItem(b"later"))
        inc, _ = _backup(live, last + 1)
        oapi = QueueService(other)
        await oapi.create_queue("other")  # version 1: not in an incremental since last + 1
        for i in range(last + 3):
            await oapi.enqueue("other", EnqueueItem(b"o-%d" % i))
        foreign, _ = _backup(other, last + 1)
        anonymous, _ = _backup(other, last + 1, cluster_id="")
        yield Chain(live, full, inc, foreign, anonymous)
    finally:
        await live.stop()
        await other.stop()


async def test_restore_into_an_empty_single_node(chain: Chain, tmp_path: Path) -> None:
    node = await _node(tmp_path / "target")
    try:
        res = await restore_online(node, chain.files(chain.full, chain.inc), ["full.bak", "inc.bak"])
        assert _records(node) == _records(chain.live)  # every record, with its version
        assert res.to_version == chain.live.applied_index
        # the restored node continues the backed-up cluster's history: it adopted its id
        assert node.state.cluster_id == node.cluster_status().cluster_id == chain.live.state.cluster_id != ""
        api = QueueService(node)
        assert (await api.get_queue("jobs")).stats.ready == 5
        await api.enqueue("jobs", EnqueueItem(b"after"))  # the node goes on, versions forward
        assert node.state.state_digest()[0] > res.to_version
    finally:
        await node.stop()


def _records(node: LocalNode) -> int:
    """The digest of every record of the node's state with its version (not the log
    position: a restore goes through the log, its entries take indexes)."""
    return node.state.state_digest()[1]


def _corrupt_first_frame(data: bytes) -> bytes:
    entry = BackupReader(io.BytesIO(data)).frames[0]
    out = bytearray(data)
    out[entry.offset + 5] ^= 1
    return bytes(out)


@pytest.mark.parametrize("bad,reason", [
    ("foreign", "BACKUP_CLUSTER_MISMATCH"),  # another cluster's incremental, named by its header
    # without cluster ids the records give it away: a queue the full never had
    ("anonymous", "BACKUP_INCONSISTENT"),
    ("corrupt", "BACKUP_CHECKSUM_MISMATCH"),
])
async def test_a_failed_restore_changes_nothing_and_a_retry_works(
    chain: Chain, tmp_path: Path, bad: str, reason: str
) -> None:
    node = await _node(tmp_path / "target")
    try:
        before, own = _records(node), node.state.cluster_id
        second = {"foreign": chain.foreign_inc, "anonymous": chain.anonymous_foreign_inc}.get(bad)
        with pytest.raises(InvalidArgument) as e:
            await restore_online(node, chain.files(chain.full, second or _corrupt_first_frame(chain.inc)),
                                 ["full.bak", "inc.bak"])
        assert e.value.reason == reason
        if bad == "foreign":  # both files and both clusters named
            ids = (chain.live.state.cluster_id, BackupReader(io.BytesIO(chain.foreign_inc)).header.cluster_id)
            assert all(x in e.value.message for x in ("full.bak", "inc.bak", *ids)), e.value.message
        assert _records(node) == before and node.state.is_empty()
        assert node.state.cluster_id == own
        with pytest.raises(QueueNotFound):
            await QueueService(node).get_queue("jobs")
        await restore_online(node, chain.files(chain.full, chain.inc))
        assert _records(node) == _records(chain.live)
    finally:
        await node.stop()


class Follower(LocalNode):
    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_hint(self) -> str:
        return "node-2"


async def test_a_follower_answers_not_leader_with_the_leaders_hint(chain: Chain, tmp_path: Path) -> None:
    node = await _node(tmp_path / "target", Follower)
    try:
        with pytest.raises(NotLeader) as e:
            await restore_online(node, chain.files(chain.full))
        assert e.value.leader_hint == "node-2" and e.value.kind == "unavailable"  # 503
        assert node.state.is_empty()
    finally:
        await node.stop()


async def test_non_empty_state_is_refused(chain: Chain) -> None:
    before = _records(chain.live)
    with pytest.raises(FailedPrecondition) as e:  # its own chain
        await restore_online(chain.live, chain.files(chain.full))
    assert e.value.reason == "RESTORE_TARGET_NOT_EMPTY"
    assert _records(chain.live) == before


@pytest.mark.parametrize("files", [("inc",), ("full", "inc")])
async def test_a_chain_of_another_cluster_onto_a_non_empty_node_is_refused(
    chain: Chain, tmp_path: Path, files: tuple[str, ...]
) -> None:
    """An incremental (or a whole chain) of cluster A onto a node of cluster B that holds
    data: refused by cluster, naming the file and both ids; nothing changes."""
    node = await _node(tmp_path / "target")
    try:
        await QueueService(node).create_queue("mine")
        before, own = _records(node), node.state.cluster_id
        theirs = chain.live.state.cluster_id
        assert own and theirs and own != theirs
        with pytest.raises(FailedPrecondition) as e:
            await restore_online(node, chain.files(*(getattr(chain, f) for f in files)), [f"{f}.bak" for f in files])
        assert e.value.reason == "RESTORE_CLUSTER_MISMATCH"
        assert f"{files[0]}.bak" in e.value.message and own in e.value.message and theirs in e.value.message
        assert _records(node) == before and node.state.cluster_id == own
    finally:
        await node.stop()


async def test_bad_chain_is_refused_before_anything(chain: Chain, tmp_path: Path) -> None:
    node = await _node(tmp_path / "target")
    try:
        with pytest.raises(InvalidArgument, match="not a full one"):
            await restore_online(node, chain.files(chain.inc, chain.full))
        assert node.state.is_empty()
    finally:
        await node.stop()
