"""A test node: a single-node log with group commit of proposals into one fsynced LMDB transaction.

Proposals queue up while the previous batch is being written; the batcher then takes
everything pending (bounded), stamps it with the wall clock (`now_ms`, kept monotonic),
forms one `CommandBatch` log entry and, in the writer thread, applies it to the
state store inside one write transaction that commits with one fsync. Only after that
commit are the proposers' futures resolved, so an acknowledged command survives kill -9.

On a single node the entry needs no separate copy in a Raft log: the transaction that
would persist it also applies it and records the applied index, atomically. The Raft
node replaces this class behind the same `Node` protocol.

Proposals whose future was cancelled before the batcher takes them are dropped. If a
commit fails (the store rolled the transaction back and rebuilt its memory), only that
entry's proposals fail (`Unavailable`, reason COMMIT_FAILED, retryable) and the node
goes on; only a store that cannot be rebuilt (`StoreBroken`) stops the node.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from doq.errors import Overloaded, Unavailable
from doq.node.alarms import Alarm
from doq.node.base import ProposalFuture, resolve_results
from doq.node.cluster import ClusterAdmin, ClusterStatus, Member, MemberAddrs, StorageUsage
from doq.node.proposals import MAX_PENDING_COMMANDS, take_count, wall_clock_ms
from doq.queues.commands import Command, CommandBatch, Tick
from doq.storage.chunks import DEFAULT_CHUNK_BYTES
from doq.storage.state import StateStore, StoreBroken

log = logging.getLogger(__name__)

NO_ADDRS = MemberAddrs("", "", "")  # a node built without listen addresses (tests, tools)


T = TypeVar("T")


class LocalNode:
    """A one-node cluster that commits after fsync. Implements `doq.node.base.Node`."""

    def __init__(
        self,
        state: StateStore,
        *,
        node_id: str = "node-1",
        addrs: MemberAddrs = NO_ADDRS,
        clock_ms: Callable[[], int] = wall_clock_ms,
        on_applied: Callable[[int], None] | None = None,
        on_commit: Callable[[float, float], None] | None = None,
    ) -> None:
        self.state = state
        self.node_id = node_id
        self.addrs = addrs
        self._clock_ms = clock_ms
        self._on_applied = on_applied  # (commands) for metrics, before the answers
        self._on_commit = on_commit  # (commit_seconds, fsync_seconds) for metrics
        self._pending: list[tuple[Command, ProposalFuture]] = []
        self._wakeup = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="doq-writer")
        self._task: asyncio.Task[None] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._last_now_ms = 0
        self._stopping = False
        self._next_index = state.applied_index + 1
        self._commit_lock = asyncio.Lock()  # one commit at a time (a batch or an entry alone)

    # -- Node protocol ---------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return not self._stopping

    @property
    def leader_hint(self) -> str:
        return self.node_id

    def storage_usage(self) -> StorageUsage | None:
        """A `LocalNode` measures no storage."""
        return None

    def alarms(self) -> list[Alarm]:
        """A `LocalNode` measures no storage: never an alarm."""
        return []

    def is_ready(self) -> bool:
        return not self.readiness_problems()

    def readiness_problems(self) -> list[str]:
        return (["shutting_down"] if self._stopping else []) + self.liveness_problems()

    def liveness_problems(self) -> list[str]:
        return ["store_broken"] if self.state.broken else []

    @property
    def applied_index(self) -> int:
        return self.state.view.applied_index  # committed (the writer may be applying the next)

    def cluster_status(self) -> ClusterStatus:
        """A one-member cluster: this node, leader and only voter."""
        index = self.applied_index
        return ClusterStatus(
            node_id=self.node_id, leader_id="" if self._stopping else self.node_id, term=1,
            commit_index=index, applied_index=index, role="leader" if self.is_leader else "follower",
            members=[Member(self.node_id, self.addrs, "voter")], cluster_id=self.state.cluster_id,
        )

    def cluster_admin(self) -> ClusterAdmin | None:
        """None: a lone node cannot change membership (`/cluster` is 404)."""
        return None

    async def start(self) -> None:
        """Start committing; a state without a cluster id gets one first (a lone node
        bootstraps its own cluster)."""
        await asyncio.get_running_loop().run_in_executor(self._writer, self.state.ensure_cluster_id)
        self._task = asyncio.create_task(self._run(), name="doq-local-log")
        self._schedule_tick()

    async def stop(self) -> None:
        """Refuse new proposals, commit those already taken, stop the writer."""
        self._stopping = True
        if self._tick_handle:
            self._tick_handle.cancel()
        self._wakeup.set()
        if self._task:
            await self._task
        self._writer.shutdown(wait=True)

    async def propose(self, command: Command) -> object:
        return await self.propose_nowait(command)

    def propose_nowait(self, command: Command) -> asyncio.Future[object]:
        """Queue a command; the future resolves as `propose` does. Raises at once if refused."""
        if self._stopping:
            raise Unavailable("node is shutting down", reason="SHUTTING_DOWN")
        if len(self._pending) >= MAX_PENDING_COMMANDS:
            raise Overloaded("too many commands waiting for commit; retry later")
        fut = ProposalFuture(loop=asyncio.get_running_loop())
        self._pending.append((command, fut))
        self._wakeup.set()
        return fut

    async def read_barrier(self) -> None:
        return None

    async def inspect(self, fn: Callable[[StateStore], T]) -> T:
        """Run `fn(state)` on the writer thread between writes (see `Node.inspect`)."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, self.state)

    def add_apply_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    @property
    def restore_chunk_bytes(self) -> int:
        return DEFAULT_CHUNK_BYTES

    def propose_alone(self, command: Command) -> asyncio.Future[object]:
        """Commit `command` alone in its own entry (see `Node.propose_alone`), between two
        batches. Raises at once while stopping."""
        if self._stopping:
            raise Unavailable("node is shutting down", reason="SHUTTING_DOWN")
        return asyncio.ensure_future(self._commit_alone(command))

    async def _commit_alone(self, command: Command) -> object:
        async with self._commit_lock:
            if self._stopping:
                raise Unavailable("node is shutting down", reason="SHUTTING_DOWN")
            now_ms = max(self._last_now_ms, self._clock_ms())
            self._last_now_ms = now_ms
            index = self._next_index
            try:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._writer, self._commit, index, CommandBatch(now_ms, [command]))
            except StoreBroken as e:
                self._fail_stop(e)
                raise Unavailable("the state could not be reloaded after a failed write; the node stops",
                                  reason="SHUTTING_DOWN") from e
            self._next_index = self.state.applied_index + 1
            self._notify_applied()
            self._schedule_tick()
            return results[0]

    # -- internals -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            async with self._commit_lock:
                count = take_count(self._pending)
                taken = [p for p in self._pending[:count] if not p[1].cancelled()]
                del self._pending[:count]
                for _, fut in taken:
                    fut.in_log = True  # committed or failed below: no longer cancellable
                if not taken:
                    continue
                now_ms = max(self._last_now_ms, self._clock_ms())
                self._last_now_ms = now_ms
                batch = CommandBatch(now_ms, [cmd for cmd, _ in taken])
                index = self._next_index
                try:
                    results = await loop.run_in_executor(self._writer, self._commit, index, batch)
                except StoreBroken as e:
                    self._fail_stop(e, taken)
                    return
                except Exception as e:  # rolled back: only this entry's proposals fail
                    log.exception("commit of entry %d failed (%d commands not applied); "
                                  "the node goes on", index, len(taken))
                    for _, fut in taken:
                        if not fut.done():
                            fut.set_exception(Unavailable(
                                f"the commit failed, nothing of it was applied ({type(e).__name__}: {e}); retry",
                                reason="COMMIT_FAILED"))
                    self._schedule_tick()
                    continue
            self._next_index = index + 1
            resolve_results((cmd, fut, res) for (cmd, fut), res in zip(taken, results, strict=True))
            self._notify_applied()
            self._schedule_tick()

    def _fail_stop(self, err: BaseException, taken: Sequence[tuple[Command, asyncio.Future[object]]] = ()) -> None:
        """The store cannot follow LMDB any more: refuse everything from now on."""
        log.error("the state store is broken (%s); the node stops taking writes", err)
        self._stopping = True
        for _, fut in [*taken, *self._pending]:
            if not fut.done():
                fut.set_exception(Unavailable(f"node stopped: {err}", reason="SHUTTING_DOWN"))
        self._pending.clear()

    def _notify_applied(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("apply listener %r failed", callback)

    def _commit(self, index: int, batch: CommandBatch) -> list[object]:
        """Writer thread: apply one entry and commit with fsync (`StateStore.write`).

        The batch object is applied as is: on a single node the entry is never read back
        from a log, so encoding it would be wasted work (the codec serves Raft entries).
        """
        t0 = time.perf_counter()
        with self.state.write() as txn:
            results = self.state.apply_entries(txn, [(index, batch)])[0]
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        if self._on_applied:
            try:
                self._on_applied(len(results))
            except Exception:
                log.exception("on_applied hook failed")
        if self._on_commit:
            try:
                self._on_commit(t2 - t0, t2 - t1)
            except Exception:
                log.exception("on_commit hook failed")
        return results

    def _schedule_tick(self) -> None:
        """Propose a Tick when replicated time must move (a lease expires, a delay ends)."""
        if self._tick_handle:
            self._tick_handle.cancel()
            self._tick_handle = None
        due_ms = self.state.next_due_ms()
        if due_ms is None or self._stopping:
            return
        delay_s = max(0.0, (due_ms - self._clock_ms()) / 1000) + 0.001
        loop = asyncio.get_running_loop()
        self._tick_handle = loop.call_later(delay_s, self._propose_tick)

    def _propose_tick(self) -> None:
        self._tick_handle = None
        if self._stopping:
            return
        fut = ProposalFuture(loop=asyncio.get_running_loop())
        fut.add_done_callback(_consume)  # nobody awaits a tick: retrieve a failure here
        self._pending.append((Tick(), fut))
        self._wakeup.set()


def _consume(fut: asyncio.Future[object]) -> None:
    if not fut.cancelled():
        fut.exception()
