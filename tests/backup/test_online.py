"""`restore_online` preconditions and paths, with stand-in nodes."""

from __future__ import annotations

import io

import pytest

from doq.backup.ops import restore_online, write_backup
from doq.errors import FailedPrecondition, InvalidArgument
from tests.backup.fakes import FakeState


class FakeNode:
    def __init__(self, *, leader: bool = True, members: list[str] | None = None) -> None:
        self.state = FakeState()
        self.is_leader = leader
        if members is not None:
            self.members = members


def _files() -> tuple[FakeState, list[io.BytesIO]]:
    live = FakeState()
    for i in range(1, 20):
        live.apply(i, {b"k%d" % i: b"v", b"k%d" % (i - 1): None})
    full = io.BytesIO()
    last = write_backup(live, 0, full)
    live.apply(20, {b"k19": None})
    inc = io.BytesIO()
    write_backup(live, last + 1, inc)
    full.seek(0)
    inc.seek(0)
    return live, [full, inc]


async def test_restore_into_an_empty_single_node():
    live, files = _files()
    node = FakeNode(members=["n1"])
    res = await restore_online(node, files, ["full.bak", "inc.bak"])
    assert node.state.records == live.records
    assert res.to_version == node.state.applied_index == 20


async def test_node_hook_is_used_when_present():
    live, files = _files()
    node = FakeNode()
    calls = []

    async def restore_backup(fn):
        calls.append(1)
        return fn(node.state)

    node.restore_backup = restore_backup  # type: ignore[attr-defined]
    await restore_online(node, files)
    assert calls == [1] and node.state.records == live.records


@pytest.mark.parametrize("node,reason", [
    (FakeNode(leader=False), "NOT_LEADER"),
    (FakeNode(members=["a", "b", "c"]), "RESTORE_MULTI_NODE"),
])
async def test_refusals(node, reason):
    _, files = _files()
    with pytest.raises(FailedPrecondition) as e:
        await restore_online(node, files)
    assert e.value.reason == reason
    assert node.state.records == {}


async def test_non_empty_state_is_refused():
    _, files = _files()
    node = FakeNode()
    node.state.apply(1, {b"x": b"1"})
    with pytest.raises(FailedPrecondition) as e:
        await restore_online(node, files)
    assert e.value.reason == "RESTORE_TARGET_NOT_EMPTY"
    assert node.state.records == {b"x": (b"1", 1)}


async def test_bad_chain_is_refused_before_anything():
    _, (full, inc) = _files()
    node = FakeNode()
    with pytest.raises(InvalidArgument, match="not a full one"):
        await restore_online(node, [inc, full])
    assert node.state.records == {}
