"""The peer transport interface the Raft node driver uses (implemented in doq/node/transport.py).

Outbound: `send` queues messages for their peers (`Message.to`) without blocking; the
transport delivers them best effort, in order per peer, batching what is queued. A peer
queue is bounded: when it is full, messages are dropped (Raft retries: heartbeats, probes,
snapshot retries). Unknown peers (no `set_peer` yet) are dropped too.

Every frame sent carries this node's cluster ids (`set_cluster_ids`; the peer door,
doq/node/peer_door.py, checks them on the receiving side).

Inbound: the transport is constructed with a callback `on_messages(PeerFrame) -> None`
that it calls on the event loop thread with each frame it received (messages already
decoded, with the sender the stream named and the frame's cluster ids). The callback
never blocks; it decides what reaches the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from doq.raft.types import Message


class PeerFrame(NamedTuple):
    """One inbound frame: who sent it (the stream's sender id), the cluster ids it
    carries (the sender's state's first) and its messages, in order."""

    sender: str
    cluster_ids: tuple[str, ...]
    messages: list[Message]


OnMessages = Callable[[PeerFrame], None]
"""Inbound callback given to a transport at construction (called on the event loop)."""


class RaftTransport(Protocol):
    def send(self, messages: Sequence[Message]) -> None:
        """Non-blocking, best effort: queue for the peer (bounded per peer; drop when full;
        Raft retries)."""
        ...

    def set_peer(self, node_id: str, raft_addr: str) -> None:
        """Add or re-address a peer (HOST:PORT of its raft listener)."""
        ...

    def set_cluster_ids(self, cluster_ids: Sequence[str]) -> None:
        """The cluster ids every frame sent from now on carries (this node's state's first)."""
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
