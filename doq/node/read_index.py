"""`ReadIndexWaits`: the linearizable reads (`Node.read_barrier`) a node has in flight.

A read goes through two waits, both ended only by the driver's loop task:

1. **confirmation**: the read's context is handed to the core (`RaftCore.read_index`);
   once the leader has confirmed its leadership with a heartbeat quorum, a Ready carries
   a `ReadState` (context, commit index at the read's start): `confirmed` moves the read
   to the second wait;
2. **apply**: `serve(applied_index)` resolves every read whose index this node applied.

A read ends with None (the state may now be read), or fails: `NotLeader` when the core
has no leader, `Unavailable` READ_TIMEOUT when not served within the caller's timeout,
and what `fail_all` is given when the node stops or fails. Never left hanging.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

from doq.errors import DoqError, NotLeader, Unavailable
from doq.node.proposals import fail_future, resolve_future
from doq.raft.core import RaftCore
from doq.raft.types import NotLeader as CoreNotLeader
from doq.raft.types import ReadState


class ReadIndexWaits:
    """The reads of one node (see the module doc); used on its event loop only."""

    def __init__(self) -> None:
        self._confirming: dict[bytes, asyncio.Future[object]] = {}  # by context
        self._applying: list[tuple[int, asyncio.Future[object]]] = []  # (read index, future)
        self._contexts = itertools.count(1)

    async def wait(self, run_on_core: Callable[[Callable[[RaftCore], None]], None],
                   timeout_s: float) -> None:
        """One read: ask the core (through `run_on_core`, between two Readies) and wait
        until it is confirmed and applied here; raises as the module doc says."""
        ctx = next(self._contexts).to_bytes(8, "big")
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._confirming[ctx] = fut

        def request(core: RaftCore) -> None:
            try:
                core.read_index(ctx)
            except CoreNotLeader as e:
                self._confirming.pop(ctx, None)
                fail_future(fut, NotLeader("no leader known", leader_hint=e.leader_hint or ""))

        run_on_core(request)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            self._confirming.pop(ctx, None)
            raise Unavailable("read not confirmed by a quorum in time", reason="READ_TIMEOUT") from None

    def confirmed(self, read_states: Sequence[ReadState]) -> None:
        """A Ready's read states: these reads wait for their index to be applied."""
        for rs in read_states:
            fut = self._confirming.pop(rs.context, None)
            if fut is not None:
                self._applying.append((rs.index, fut))

    @property
    def applying(self) -> bool:
        """Some confirmed read waits for its index to be applied."""
        return bool(self._applying)

    def serve(self, applied_index: int) -> None:
        """Resolve the confirmed reads whose index is applied."""
        keep: list[tuple[int, asyncio.Future[object]]] = []
        for index, fut in self._applying:
            if index <= applied_index:
                resolve_future(fut, None)
            else:
                keep.append((index, fut))
        self._applying = keep

    def fail_all(self, err: DoqError) -> None:
        """Fail every read in flight with `err` (the node stops or failed)."""
        confirming, self._confirming = self._confirming, {}
        for fut in confirming.values():
            fail_future(fut, err)
        applying, self._applying = self._applying, []
        for _, fut in applying:
            fail_future(fut, err)
