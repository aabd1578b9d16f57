"""What the service needs from a node (local single-node log now, Raft node later)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from doq.queues.commands import Command
from doq.storage.state import StateStore


class Node(Protocol):
    """A node turns commands into durable, applied state.

    `propose` resolves only after the command's log entry is durable (fsynced on a
    majority) and applied; it returns the state machine's result for that command (a
    `DoqError` instance when the command was rejected by the machine). It raises
    `NotLeader` (with a leader hint) on a follower, `Unavailable` while stopping, and
    `CommitTimeout` if the entry is not committed in time.
    """

    state: StateStore

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Stop taking proposals, finish in-flight commits, release resources."""
        ...

    async def propose(self, command: Command) -> object: ...

    def propose_nowait(self, command: Command) -> asyncio.Future[object]:
        """Queue a command without a task per call (streams use it to pipeline)."""
        ...

    async def read_barrier(self) -> None:
        """Wait until reads of `state` are linearizable (ReadIndex on Raft; no-op locally)."""
        ...

    def applied_event(self) -> asyncio.Event:
        """An event set after the next applied batch (for long polls); get a fresh one each wait."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_hint(self) -> str: ...
