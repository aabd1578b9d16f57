"""The batched commit (`RaftNodeConfig.hold_commit_ms`): a write that applies committed
entries leaves the state's LMDB transaction open (held) and the next writes continue it;
what needs LMDB to hold the applied state has it committed at once. Real LMDB, real
threads, the in-memory network (tests/node/raftnet.py). The hold is long (a minute) so
that nothing but what a test does commits a held write."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import lmdb
import pytest

from doq.errors import Unavailable
from doq.node.raft_node import RaftNode
from doq.queues import commands as c
from doq.queues.model import MessageState, QueueSettings
from doq.storage.state import StateStore
from tests.node.heldnet import HOLD, enq, held, one_node
from tests.node.raftnet import Cluster, retry

pytestmark = pytest.mark.timeout(180)
_open: list[Cluster] = []


@pytest.fixture(autouse=True)
async def _close_clusters() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()





def _txnid(node: RaftNode) -> int:
    return int(node.env.info()["last_txnid"])


async def test_writes_hold_their_transaction_and_a_direct_reader_after_an_answer_has_it_committed(
        tmp_path: Path) -> None:
    """Calls one at a time make no LMDB commit (the write is held); a direct reader of LMDB
    right after an answer (`get_message` from another thread, from the loop thread as the
    service calls it, `peek` on the apply thread through `inspect`, the digest) finds what
    the answer told: its wait commits the held write. Fails if every write commits (no
    hold) or if a reader read LMDB before that commit (MessageNotFound)."""
    _, n1 = await one_node(tmp_path, _open)
    before = _txnid(n1)
    ids = []
    for i in range(10):
        out = await n1.propose(enq(i))
        ids.append(out[0].id)  # type: ignore[index]
    assert await held(n1)
    assert _txnid(n1) == before  # ten calls, no LMDB commit
    assert n1.applied_index == n1.state.applied_index  # the readers' view has them all
    assert n1.state.get_queue("q").stats.total == 10

    seen: dict[str, object] = {}

    def read() -> None:
        try:
            seen["content"] = n1.state.get_message("q", ids[3]).content
            seen["digest"] = n1.state.state_digest()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            seen["error"] = e

    await asyncio.to_thread(read)
    assert "error" not in seen, seen
    assert seen["content"] == b"m3"
    assert seen["digest"][0] >= n1.state.applied_index  # type: ignore[index]
    assert not n1.state.held and _txnid(n1) == before + 1  # the reader's wait: one commit

    out = await n1.propose(enq(10))
    assert await held(n1)
    assert n1.state.get_message("q", out[0].id).content == b"m10"  # type: ignore[index]  # the loop thread
    out = await n1.propose(enq(11))
    assert await held(n1)
    peeked = await n1.inspect(lambda s: s.peek("q", MessageState.READY, 0, 100))
    assert [m.content for m in peeked][-1] == b"m11"
    assert not n1.state.held


async def test_the_held_write_commits_within_hold_commit_ms(tmp_path: Path) -> None:
    """The loop's timer commits a held write when no other write does."""
    cl = Cluster(tmp_path, dataclasses.replace(HOLD, hold_commit_ms=50), RaftNode)
    _open.append(cl)
    n1 = await cl.start("n1")
    await cl.wait_leader()
    await retry(lambda: n1.propose(c.CreateQueue("q", "delayed", QueueSettings())))
    await n1.propose(enq(0))
    for _ in range(1500):  # the timer: 50 ms of real time (at most 30 s here)
        if not await held(n1):
            break
        await asyncio.sleep(0.02)
    assert not await held(n1)
    assert n1.state.committed_index == n1.state.applied_index


async def test_a_stop_commits_the_held_write(tmp_path: Path) -> None:
    """A stop commits a held write: LMDB holds every answered call (nothing to apply again
    at the next start)."""
    cl, n1 = await one_node(tmp_path, _open)
    for i in range(5):
        await n1.propose(enq(i))
    assert await held(n1)
    applied = n1.state.applied_index
    assert n1.state.committed_index < applied
    await cl.stop("n1")
    assert not n1.state.held
    assert n1.state.committed_index == applied


async def test_a_failed_commit_of_the_held_write_applies_its_entries_again_from_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The held write's commit fails (here: once, planted in `StateStore._commit`, as
    LMDB fails it: aborted, memory rebuilt from LMDB, its applies lost): the reader that
    asked for the commit answers `Unavailable` (retryable) at once, the node applies those
    entries again from its log and commits them; the reader asking again finds them,
    each message once. Fails if the lost applies are not applied again (the reader
    times out, the messages are gone from memory)."""
    _, n1 = await one_node(tmp_path, _open)
    for i in range(5):
        await n1.propose(enq(i))
    assert await held(n1)
    applied = n1.state.applied_index
    real = StateStore._commit
    failed = threading.Event()

    def fail_once(store: StateStore, txn: lmdb.Transaction) -> None:
        if failed.is_set() or store is not n1.state:
            return real(store, txn)
        failed.set()
        raise lmdb.MapFullError("planted")

    monkeypatch.setattr(StateStore, "_commit", fail_once)

    async def read() -> list[bytes]:
        return await asyncio.to_thread(
            lambda: [m.content for m in n1.state.peek("q", MessageState.READY, 0, 100)])

    with pytest.raises(Unavailable):
        await read()
    assert failed.is_set()
    contents = await retry(read)
    assert contents == [b"m%d" % i for i in range(5)]
    assert n1.state.applied_index == applied and not n1.state.held
    assert n1.state.get_queue("q").stats.total == 5
    out = await n1.propose(enq(5))  # ids go on from where they were
    assert out[0].id == 6  # type: ignore[index]
