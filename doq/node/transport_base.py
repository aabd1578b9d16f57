"""The peer transport interface the Raft node driver uses (implemented in doq/node/transport.py).

Outbound: `send` queues messages for their peers (`Message.to`) without blocking; the
transport delivers them best effort, in order per peer, batching what is queued. A peer
queue is bounded: when it is full, messages are dropped (Raft retries: heartbeats, probes,
snapshot retries). Unknown peers (no `set_peer` yet) are dropped too.

Inbound: the transport is constructed with a callback `on_messages(list[Message]) -> None`
that it calls on the event loop thread with the messages it received (already decoded,
addressed to this node). The callback never blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from doq.raft.types import Message

OnMessages = Callable[[list[Message]], None]
"""Inbound callback given to a transport at construction (called on the event loop)."""


class RaftTransport(Protocol):
    def send(self, messages: Sequence[Message]) -> None:
        """Non-blocking, best effort: queue for the peer (bounded per peer; drop when full;
        Raft retries)."""
        ...

    def set_peer(self, node_id: str, raft_addr: str) -> None:
        """Add or re-address a peer (HOST:PORT of its raft listener)."""
        ...

    def remove_peer(self, node_id: str) -> None:
        """Forget a peer: drop its queue and close its stream."""
        ...

    def set_local_alarms(self, alarms: Sequence[tuple[str, str]]) -> None:
        """This node's storage alarms, (reason, message) each, carried to every peer."""
        ...

    def peer_alarms(self, max_age_s: float) -> dict[str, tuple[tuple[str, str], ...]]:
        """The storage alarms each peer reported within the last `max_age_s` (peers
        without alarms, or not heard from since, are left out)."""
        ...

    def last_heard(self) -> dict[str, float]:
        """Seconds since the last message from each peer heard from at all."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
