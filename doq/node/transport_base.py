"""The peer transport as the Raft node driver sees it (implemented by
`doq.node.transport.GrpcRaftTransport`; tests may use an in-memory one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import doq.raft.types


class RaftTransport(Protocol):
    def send(self, messages: Sequence[doq.raft.types.Message]) -> None:
        """Non-blocking, best effort: queue for the peer (bounded per peer; drop when full; Raft retries)."""
    def set_peer(self, node_id: str, raft_addr: str) -> None: ...
    def remove_peer(self, node_id: str) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
# inbound: the transport calls a callback given at construction: on_messages(list[Message]) -> None (on the event loop thread)
