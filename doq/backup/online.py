"""Online restore: a verified backup chain into a RUNNING node, through its log.

An orchestration over one node primitive, `propose_alone` (a command alone in its log
entry; see `RestoreTarget`, the part of `doq.node.base.Node` it uses, so that this
package imports nothing of the node): the chain's records go out as `RestoreChunk` entries of at most the node's
`restore_chunk_bytes` (at most `RESTORE_WINDOW` of them proposed and not yet applied),
then one `RestoreCommit`. Every replica stages the chunks and applies the commit
identically (`doq.storage.state`, "Restore through the log"), all or nothing, so every
replica restores the same state (docs/backup.md, "Online restore on a cluster"); a lone
node does the same with its own log. The node knows nothing of backup files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections import deque
from collections.abc import Sequence
from typing import BinaryIO, Protocol

from doq.backup.ops import (
    RestoreChain,
    RestoreResult,
    _reader,
    _refuse_non_empty,
    _verify_all,
    check_chain,
    check_target_cluster,
)
from doq.errors import DoqError, FailedPrecondition, InvalidArgument, NotLeader
from doq.queues.commands import Command, RestoreAbort, RestoreChunk, RestoreCommit
from doq.storage.state import MAX_RESTORE_VERSION, RestoreOutcome, StateStore

log = logging.getLogger(__name__)


class RestoreTarget(Protocol):
    """What an online restore uses of a running node (members of `doq.node.base.Node`)."""

    state: StateStore

    @property
    def node_id(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_hint(self) -> str: ...

    @property
    def restore_chunk_bytes(self) -> int: ...

    def propose_alone(self, command: Command) -> asyncio.Future[object]: ...


RESTORE_WINDOW = 4  # RestoreChunk entries proposed and not yet applied, at most
_locks: weakref.WeakKeyDictionary[RestoreTarget, asyncio.Lock] = weakref.WeakKeyDictionary()


def _lock_of(node: RestoreTarget) -> asyncio.Lock:
    """One restore at a time per node (two would break each other's staging)."""
    lock = _locks.get(node)
    if lock is None:
        lock = _locks[node] = asyncio.Lock()
    return lock


async def restore_online(node: RestoreTarget, files: Sequence[BinaryIO], names: Sequence[str] | None = None) -> RestoreResult:
    """Restore full + incrementals into a RUNNING node, for `POST /db/restore`.

    Preconditions: the node is the leader (else `NotLeader` with the leader's hint, 503;
    the HTTP gateway forwards the request from a follower) and the state is empty (else
    `FailedPrecondition` RESTORE_TARGET_NOT_EMPTY, or RESTORE_CLUSTER_MISMATCH when the
    chain is another cluster's). The chain is checked and every file verified (off the
    event loop) before anything is proposed; then `restore_chain` restores it, all or
    nothing. The restored state adopts the chain's cluster id.
    """
    names = list(names) if names else [f"file #{i + 1}" for i in range(len(files))]
    readers = await asyncio.to_thread(lambda: [_reader(f, n) for f, n in zip(files, names, strict=True)])
    # off the loop: `is_empty` is a direct reader of LMDB, it may wait for a commit
    await asyncio.to_thread(check_target_cluster, node.state, [r.header for r in readers], names)
    check_chain([r.header for r in readers], names=names)
    if not node.is_leader:
        raise NotLeader("online restore must be sent to the leader", leader_hint=node.leader_hint)
    await asyncio.to_thread(_refuse_non_empty, node.state)
    await asyncio.to_thread(_verify_all, readers, names)  # off the writer and the loop
    return await restore_chain(node, RestoreChain(readers, names))


async def restore_chain(node: RestoreTarget, chain: RestoreChain) -> RestoreResult:
    """Restore the verified `chain` into the (empty) state of `node` through its log (see
    the module docstring); returns once the commit is applied here. Raises `NotLeader` if
    leadership is lost meanwhile (the staging is left for the next restore to discard;
    nothing was restored unless the commit entry was already proposed and survives), the
    commit's `DoqError` (RESTORE_TARGET_NOT_EMPTY, BACKUP_INCONSISTENT,
    RESTORE_INCOMPLETE), or what reading the files raises. On any failure before the
    commit it proposes a `RestoreAbort` (best effort) so the staging does not wait for
    the next restore."""
    if not 0 <= chain.to_version < MAX_RESTORE_VERSION:
        raise InvalidArgument(f"the chain's to_version {chain.to_version} is out of range "
                              f"(0..{MAX_RESTORE_VERSION - 1})", reason="INVALID_INDEX")
    async with _lock_of(node):
        if not await asyncio.to_thread(node.state.is_empty):  # another restore may have just filled it
            raise FailedPrecondition("the target state is not empty: restore needs a fresh cluster",
                                     reason="RESTORE_TARGET_NOT_EMPTY")
        outcome, chunks = await _through_log(node, chain)
    log.info("node %s: restored %d records through the log (%d chunks), version %d",
             node.node_id, outcome.records, chunks, outcome.to_version)
    return RestoreResult(len(chain.readers), outcome.records, outcome.tombstones,
                         outcome.to_version, outcome.last_version)


def _raise_if_error(result: object) -> None:
    if isinstance(result, DoqError):
        raise result


def _ignore_result(fut: asyncio.Future[object]) -> None:
    if not fut.cancelled():
        fut.exception()


async def _through_log(node: RestoreTarget, chain: RestoreChain) -> tuple[RestoreOutcome, int]:
    """Propose the chunks and the commit; (outcome, chunk count)."""
    restore_id = os.urandom(16)
    chunks = chain.chunks(node.restore_chunk_bytes)
    inflight: deque[asyncio.Future[object]] = deque()
    seq = records = 0
    outcome: object = None
    committed = False
    try:
        while (item := await asyncio.to_thread(next, chunks, None)) is not None:
            payload, n = item
            inflight.append(node.propose_alone(RestoreChunk(restore_id, seq, payload)))
            seq += 1
            records += n
            while len(inflight) >= RESTORE_WINDOW:
                _raise_if_error(await inflight.popleft())
        while inflight:
            _raise_if_error(await inflight.popleft())
        commit = node.propose_alone(RestoreCommit(restore_id, seq, records, chain.to_version, chain.cluster_id))
        committed = True  # from now on the commit entry itself discards the staging
        outcome = await commit
    finally:
        for fut in inflight:
            fut.add_done_callback(_ignore_result)
        with contextlib.suppress(ValueError):  # still running in its thread (cancelled)
            chunks.close()
        if not committed and node.is_leader:
            with contextlib.suppress(DoqError):
                node.propose_alone(RestoreAbort(restore_id)).add_done_callback(_ignore_result)
    _raise_if_error(outcome)
    if not isinstance(outcome, RestoreOutcome):
        raise TypeError(f"a RestoreCommit promised a RestoreOutcome, its result is {type(outcome).__name__}")
    return outcome, seq
