"""`SnapshotKeeper`: a Raft node's snapshots, its own and those it sends.

Two kinds, never confused (docs/raft.md, "Snapshots and compaction"):

- **Its own snapshots are metas only.** Every `snapshot_every` applied entries (at once
  under log pressure) `record_due` takes the meta of one at the applied index; the
  driver's next write records it (`take_own`) and compacts the log behind it. No data:
  the state is durable beside the log.
- **Snapshot data is produced only for a follower behind the compacted log**, when the
  core asks (`WalLogStorage.snapshot_wanted`): `produce` reads the state at the applied
  index in one read txn opened on the writer thread, writes it as snapshot data
  (`doq.node.raft_snapshot`) on this keeper's own thread, and offers it to the log
  storage, which holds compaction at its index until the data is dropped. The data lives
  in memory only; `age` drops it once no follower needed it for an election timeout.

Threads: every method runs on the event loop between two Readies (the driver calls them
from its loop task); the data is built on `executor` (one thread), and handed to the
storage under the driver's ready lock, so no write reads the storage's hold meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from doq.node.raft_snapshot import close_state_read, write_state_snapshot
from doq.node.wal_log import WalLogStorage
from doq.raft.core import RaftCore
from doq.raft.types import Snapshot, SnapshotMeta
from doq.storage.state import StateStore

log = logging.getLogger(__name__)


class SnapshotKeeper:
    """The snapshots of one node (see the module doc). `snapshot_every` = 0: no own
    snapshots but under log pressure; `election_tick`: how long offered data may go
    unneeded; `ready_lock`: the driver's lock held around each Ready."""

    def __init__(self, storage: WalLogStorage, state: StateStore, node_id: str, *,
                 snapshot_every: int, election_tick: int, ready_lock: asyncio.Lock) -> None:
        self.storage = storage
        self.state = state
        self.node_id = node_id
        self.snapshot_every = snapshot_every
        self.election_tick = election_tick
        self.ready_lock = ready_lock
        self.executor: concurrent.futures.Executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="doq-raft-snap")
        self.task: asyncio.Task[None] | None = None  # the data being produced, if any
        self.producing = False  # snapshot data being produced for the core to send
        self._unneeded_ticks = 0  # ticks the offered snapshot data was needed by no follower
        self._own: SnapshotMeta | None = None  # recorded by the next write

    # -- this node's own snapshots (metas) -------------------------------------------------
    def record_due(self, core: RaftCore, *, pressure: bool) -> None:
        """After an apply: when `snapshot_every` entries were applied since the last
        snapshot (1 under `pressure`: a storage alarm or a large log), take the meta of
        one at the applied index for the next write to record (`take_own`); that write
        and the following ones discard the log behind it."""
        every = 1 if pressure else self.snapshot_every
        applied = core.log.applied
        last = self._own or self.storage.snapshot_meta()
        if not every or applied - last.index < every:
            return
        if self.state.applied_index > applied:
            return  # re-applying after a restart: the state is ahead of the core
        # (behind it: applies on the node's apply thread not done yet; the write that
        # records this meta waits for them, `RaftNode._defers_apply`)
        self._own = core.make_snapshot(applied, b"").meta

    def take_own(self) -> SnapshotMeta | None:
        """The meta `record_due` took, for the next write to record (then forgotten here)."""
        own, self._own = self._own, None
        return own

    # -- snapshot data for a follower ------------------------------------------------------
    def produce(self, core: RaftCore, writer: concurrent.futures.Executor) -> None:
        """The core asked for snapshot data to send: read the state at the applied index
        from one read txn opened on `writer` (the node's writer thread, so exactly at that
        index), write it as snapshot data on `executor`, and offer it to the storage (the
        core sends it on a later heartbeat response). From now until the data is dropped
        the log keeps the entries after its index, or it could be of no use when done (a
        large state builds slower than writes compact). Nothing of it is written to disk;
        on failure it is asked for again (next heartbeat)."""
        applied = core.log.applied
        self.storage.snapshot_wanted = False  # asked again (next heartbeat) if this fails
        if self.state.applied_index != applied:
            return  # re-applying after a restart: the state is ahead of the core
        meta = core.make_snapshot(applied, b"").meta
        members = dict(self.storage.members)
        self.producing = True
        self.storage.hold_compaction(meta.index)
        loop = asyncio.get_running_loop()
        opened = loop.run_in_executor(writer, self.state.open_read)

        async def build() -> None:
            data: bytes | None = None
            try:
                read = await opened
                if read.applied_index == meta.index:
                    data = await loop.run_in_executor(
                        self.executor, write_state_snapshot, read, members, self.node_id)
                else:
                    close_state_read(read)
            except Exception:
                log.exception("snapshot data at %d failed", meta.index)
            async with self.ready_lock:  # between two Readies: no write reads the hold
                self.producing = False
                self._unneeded_ticks = 0
                if data is None:
                    self.storage.release_snapshot()
                else:
                    self.storage.offer_snapshot(Snapshot(meta, data))

        self.task = asyncio.create_task(build())

    def age(self, core: RaftCore, ticks: int) -> None:
        """On `ticks` ticks, while snapshot data is offered: once no follower needed it
        (`RaftCore.snapshot_needed`) for an election timeout, the data is dropped from
        memory and the log's compaction hold with it (`release_snapshot`). The timeout
        spans the moments a live follower does not count as recently active (the core
        resets that every election timeout); a follower gone for good, or this node no
        longer leading, releases it."""
        if self.producing:
            return  # offered, or released, when produced
        if core.snapshot_needed():
            self._unneeded_ticks = 0
            return
        self._unneeded_ticks += ticks
        if self._unneeded_ticks >= self.election_tick:
            self._unneeded_ticks = 0
            self.storage.release_snapshot()

    # -- stopping --------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop producing data (the node stops)."""
        if self.task:
            self.task.cancel()

    def shutdown(self) -> None:
        """Wait for the data thread to end (after `cancel`)."""
        self.executor.shutdown(wait=True)
