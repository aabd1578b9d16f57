"""Lease bookkeeping: settling (ack, nack, release) delivered messages.

An ack, nack or touch of a message the state already knows to be gone (its id was
assigned and the message is no longer in the queue: acked, deleted, dead-lettered...)
can only fail with MessageNotFound, so it is answered from the in-memory state without a
log entry; ids beyond the state's last assigned one are asked again after a read barrier
(on a new leader they may be in entries not applied yet) and answered the same way if
still unknown. Only settlements of messages the state holds are proposed. This is what
keeps a client that acks nonexistent ids (by mistake or in a flood) from filling the log.
"""

from __future__ import annotations

import asyncio

from doq.errors import DoqError, MessageNotFound
from doq.node.base import Node
from doq.node.proposals import wall_clock_ms
from doq.queues import commands as c
from doq.queues.model import MessageView
from doq.service import outcomes
from doq.service.metrics import LEASES_ENDED_BEFORE_DELIVERY


def not_found(queue: str, id_: int) -> MessageNotFound:
    """The machine's answer for a message it does not hold (same text)."""
    return MessageNotFound(f"message {id_} not found in queue {queue!r}")


def _consume(fut: asyncio.Future[object]) -> None:
    """A done callback that retrieves an outcome nobody awaits (no "never retrieved" log)."""
    if not fut.cancelled():
        fut.exception()


class Leases:
    """Settles leases through one node (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def split(self, queue: str, ids: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Positions of `ids`: (present, gone, unborn), see `StateStore.sort_known`."""
        return self.node.state.sort_known(queue, ids)

    async def known_after_barrier(self, queue: str, ids: list[int]) -> list[int]:
        """Of `ids` the state had not assigned yet, the positions it holds after a read
        barrier (the others never existed: their settlements fail with MessageNotFound)."""
        await self.node.read_barrier()
        present, _, _ = self.split(queue, ids)
        return present

    async def ack(self, queue: str, ids: list[int], lease_ids: list[int]) -> outcomes.AckResults:
        """Ack validated ids (lease_ids empty or one per id): None or the error per id.
        Raises the command-level error (QueueNotFound, NotLeader, Overloaded...)."""
        present, gone, unborn = self.split(queue, ids)
        if unborn:
            late = await self.known_after_barrier(queue, [ids[p] for p in unborn])
            present = sorted(present + [unborn[p] for p in late])
        if len(present) == len(ids):
            return outcomes.ack_results(await self.node.propose(c.Ack(queue, ids, lease_ids)))
        out: outcomes.AckResults = [not_found(queue, id_) for id_ in ids]
        if present:
            cmd = c.Ack(queue, [ids[p] for p in present], [lease_ids[p] for p in present] if lease_ids else [])
            for pos, res in zip(present, outcomes.ack_results(await self.node.propose(cmd)), strict=True):
                out[pos] = res
        return out

    async def settle_one(self, queue: str, id_: int, cmd: c.Command) -> object:
        """Propose `cmd` (a Nack or Touch of message `id_`) unless the state knows the
        message is gone; returns the command's result (raises MessageNotFound if gone)."""
        _, gone, unborn = self.split(queue, [id_])
        if gone or (unborn and not await self.known_after_barrier(queue, [id_])):
            raise not_found(queue, id_)
        return await self.node.propose(cmd)

    def release(self, queue: str, msgs: list[MessageView]) -> list[asyncio.Future[object]]:
        """Undo deliveries nobody received (`Nack(release=True)`), without waiting; the
        futures of the proposals made. If the node refuses, the rest are not proposed:
        their leases end by themselves."""
        futs: list[asyncio.Future[object]] = []
        for m in msgs:
            try:
                futs.append(self.node.propose_nowait(c.Nack(queue, m.id, m.lease_id, release=True)))
            except DoqError:
                break
        return futs

    def unexpired(self, queue: str, msgs: list[MessageView]) -> list[MessageView]:
        """What a dequeue leased, less the messages whose lease has already ended by this
        node's clock (a dequeue whose commit waited, e.g. through a quorum loss, longer
        than the visibility timeout): those are released, not handed out — ready again at
        once, the attempt not counted — instead of reaching a consumer that could not
        settle them (STALE_LEASE). Messages removed on delivery (no lease) all pass."""
        now_ms = wall_clock_ms()
        if not msgs or not 0 < msgs[0].lease_expires_at_ms <= now_ms:
            return msgs  # one dequeue's messages share one lease end
        live = [m for m in msgs if not 0 < m.lease_expires_at_ms <= now_ms]
        ended = [m for m in msgs if 0 < m.lease_expires_at_ms <= now_ms]
        LEASES_ENDED_BEFORE_DELIVERY.inc(len(ended))
        self.release_unawaited(queue, ended)
        return live

    def release_unawaited(self, queue: str, msgs: list[MessageView]) -> None:
        """`release`, for a caller that does not wait for the outcomes."""
        for fut in self.release(queue, msgs):
            fut.add_done_callback(_consume)
