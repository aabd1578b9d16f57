"""What the service and the backup orchestration need from a node.

The `Node` protocol is the whole seam: the service, the HTTP/gRPC adapters and the
backup code call these members and nothing else of a node (no probing with
`getattr`/`hasattr`), so mypy finds a node that lacks one. It knows nothing of backup
files: an online restore is an orchestration in `doq.backup.online` over the node's
`propose_alone`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from doq.node.cluster import ClusterAdmin, ClusterStatus, StorageUsage
from doq.queues.commands import Command, Dequeue
from doq.storage.state import StateStore

if TYPE_CHECKING:
    from doq.node.alarms import Alarm

T = TypeVar("T")


class ProposalFuture(asyncio.Future[object]):
    """The future of a proposal (`Node.propose_nowait`): a plain future, cancellable
    (a proposal cancelled before the node takes its command into a log entry is dropped,
    never applied), except through `wait_for_result`. The node sets `in_log` when it
    takes the command into an entry (it is then applied or fails whatever its waiter
    does)."""

    in_log = False
    kept = False  # `wait_for_result` waits for it: no cancel once in_log

    def cancel(self, msg: Any = None) -> bool:
        return False if self.kept and self.in_log else super().cancel(msg)


async def wait_for_result(fut: asyncio.Future[object]) -> None:
    """Wait until a proposal's future is done, never cancelling it once its command is in
    a log entry, for a waiter that must see the result (the leases a dequeue took, to
    send or release them). A `ProposalFuture` is awaited directly, so its result wakes
    the task itself, in `resolve_results`' order; a cancel of the task then takes effect
    when the result is in (or at once, dropping the proposal, if the node has not taken
    it yet). Any other future is awaited through `asyncio.wait` (a cancel takes effect
    at once, the future goes on). Returns without raising: read the future."""
    if isinstance(fut, ProposalFuture):
        fut.kept = True
        with contextlib.suppress(Exception):
            await fut
    elif not fut.done():
        await asyncio.wait([fut])


def resolve_results(results: Iterable[tuple[Command, asyncio.Future[object], object]]) -> None:
    """Resolve committed proposals' futures with their results (futures already done are
    left alone): the dequeues' first, then the others. The tasks awaiting them wake in
    that order, so the frames of the messages a commit leased go out before the
    confirmations of the enqueues it stored: delivery is not held up by them."""
    later = []
    for cmd, fut, r in results:
        if fut.done():
            continue
        if type(cmd) is Dequeue:
            fut.set_result(r)
        else:
            later.append((fut, r))
    for fut, r in later:
        if not fut.done():
            fut.set_result(r)


class Node(Protocol):
    """A node turns commands into durable, applied state.

    `propose` resolves only after the command's log entry is durable (fsynced on a
    majority) and applied; it returns the state machine's result for that command (a
    `DoqError` instance when the command was rejected by the machine). It raises
    `NotLeader` (with a leader hint) on a follower, `Unavailable` while stopping (nothing of it
    was applied; retry), and `OutcomeUnknown` when it lost track of an entry in its log (another leader may still
    commit it). A proposal whose future
    is cancelled before the node takes it into an entry is dropped (never applied).

    `state` is read by the service for queries; its reads show committed state only.
    """

    state: StateStore

    @property
    def node_id(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Stop taking proposals, finish in-flight commits, release resources."""
        ...

    async def propose(self, command: Command) -> object: ...

    def propose_nowait(self, command: Command) -> asyncio.Future[object]:
        """Queue a command without a task per call (streams use it to pipeline); the
        future is a `ProposalFuture`."""
        ...

    async def read_barrier(self) -> None:
        """Wait until reads of `state` are linearizable (ReadIndex on Raft; no-op locally)."""
        ...

    async def inspect(self, fn: Callable[[StateStore], T]) -> T:
        """Run `fn(state)` on the node's writer thread, between two writes: it sees exactly
        the applied state, in memory and on disk (for reads of the in-memory indexes, which
        only the writer may touch). Keep `fn` short: writes wait for it."""
        ...

    def add_apply_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback()` on the event loop after each applied batch (and after a
        restore), once `state` shows it and the batch's proposals have their results."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_hint(self) -> str:
        """The leader this node knows of ("" if none): where clients should go."""
        ...

    def is_ready(self) -> bool:
        """Can serve: `readiness_problems()` is empty (`/readyz`)."""
        ...

    def readiness_problems(self) -> list[str]:
        """Why this node cannot serve now ([] when it can): short snake_case reasons
        (`/readyz` lists them; others may add their own to that list)."""
        ...

    def liveness_problems(self) -> list[str]:
        """Why this node can no longer make progress by itself ([] while it can): a failed
        Raft loop, a broken store. `/livez` then fails, so a supervisor restarts it."""
        ...

    def storage_usage(self) -> StorageUsage | None:
        """What this node's store takes and has left (None: it measures none)."""
        ...

    def alarms(self) -> list[Alarm]:
        """The storage alarms on now (`doq.node.alarms`): this node's and, on a leader, its
        members' (while any is on, writes that grow the state are refused)."""
        ...

    @property
    def applied_index(self) -> int:
        """Index of the last log entry applied to `state`."""
        ...

    def cluster_status(self) -> ClusterStatus:
        """This node's view of the cluster (members, leader, indexes)."""
        ...

    def cluster_admin(self) -> ClusterAdmin | None:
        """The node's membership operations (`/cluster`), or None for a node that cannot
        change its membership (the tests' lone `LocalNode`)."""
        ...

    def propose_alone(self, command: Command) -> asyncio.Future[object]:
        """Propose `command` as the only command of its own log entry (the restore
        commands: `RestoreChunk`, `RestoreCommit`, `RestoreAbort`, which the store applies
        itself, see `doq.storage.state`). Resolves like `propose_nowait`'s future (the
        command's result once applied here); raises at once as `propose_nowait` does when
        this node cannot take it (`NotLeader`, `Unavailable`)."""
        ...

    @property
    def restore_chunk_bytes(self) -> int:
        """Record bytes (uncompressed) per `RestoreChunk` entry this node wants."""
        ...
