"""Where a client sends its calls: the addresses it knows and its guess of the leader.

`Router` is shared by a client and the producers and consumers made from it, so what one
learns (a leader hint, the members a node lists) serves all. It does no I/O of its own
beyond opening channels (lazily, one per address); the clients ask nodes (`ListServers`)
and feed the answers to `learn`, their failover errors to `moved`, and the initial
metadata of their answers to `follow` (a follower that relayed a call to the leader names
it there: `doq-leader-grpc`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from doq_client.errors import DoqClientError
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

C = TypeVar("C")

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
LEADER_GRPC = "doq-leader-grpc"
"""Metadata key: the leader's gRPC HOST:PORT (initial metadata of a relayed answer, and
trailers of a refusal)."""


def parse_targets(targets: str | Sequence[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of ``HOST:PORT`` -> the distinct addresses, in order."""
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    out: list[str] = []
    for t in items:
        t = t.strip()
        if t and t not in out:
            out.append(t)
    if not out:
        raise ValueError("at least one target address (HOST:PORT) is needed")
    return out


def usable(addr: str) -> bool:
    """A ``HOST:PORT`` a client can dial (not empty, not a wildcard bind address, port > 0)."""
    host, sep, port = addr.rpartition(":")
    return bool(sep) and host not in _WILDCARD_HOSTS and port.isdigit() and int(port) > 0


class Router(Generic[C]):
    """Known addresses, the current target, and one channel (and stub) per address.

    `fixed`: the client was given a channel; there is one target and it never moves.
    Thread-safe (the sync client is used from many threads); never held across I/O.
    """

    def __init__(
        self, targets: Sequence[str], open_channel: Callable[[str], C], *, fixed: bool = False
    ) -> None:
        self._known = list(targets)
        self._current = self._known[0]
        self._open = open_channel
        self._fixed = fixed
        self._lock = threading.Lock()
        self._channels: dict[str, C] = {}
        self._stubs: dict[str, Any] = {}
        self._by_id: dict[str, str] = {}  # node id -> gRPC address (from ListServers)
        self._closed = False

    @property
    def current(self) -> str:
        return self._current

    @property
    def known(self) -> list[str]:
        with self._lock:
            return list(self._known)

    def channel(self, addr: str) -> C:
        """`addr`'s channel, opened on first use; ValueError once the router is closed."""
        with self._lock:
            if self._closed:
                raise ValueError("the client is closed")
            ch = self._channels.get(addr)
            if ch is None:
                ch = self._channels[addr] = self._open(addr)
            return ch

    def stub(self, addr: str) -> Any:
        """The `DOQStub` on `addr`'s channel."""
        s = self._stubs.get(addr)
        if s is None:
            s = self._stubs[addr] = pb_grpc.DOQStub(self.channel(addr))
        return s

    def pick(self) -> tuple[str, Any]:
        """The current target and its stub."""
        addr = self._current
        return addr, self.stub(addr)

    def knows(self, node_id: str) -> bool:
        return node_id in self._by_id

    def moved(self, err: DoqClientError, failed: str) -> bool:
        """Choose the target after `err` (a failover error) from `failed`.

        The leader the error names (`leader_addr`, or its `leader_hint` id when a node
        listed that member earlier) if it is another address: returns True. Otherwise the
        next known address after `failed` (unless another caller moved meanwhile): False.
        """
        with self._lock:
            if self._fixed:
                return False
            addr = err.leader_addr if usable(err.leader_addr) else self._by_id.get(err.leader_hint, "")
            if addr and addr != failed:
                if addr not in self._known:
                    self._known.append(addr)
                self._current = addr
                return True
            if self._current == failed:
                i = self._known.index(failed) if failed in self._known else -1
                self._current = self._known[(i + 1) % len(self._known)]
            return False

    def follow(self, via: str, metadata: Sequence[tuple[str, Any]] | None) -> bool:
        """After an answer from `via`: whether its initial `metadata` names another leader
        (`doq-leader-grpc`: `via` is a follower that relayed the call). If so, that leader
        becomes the current target unless another caller moved away from `via` meanwhile.
        Always False for a `fixed` router. One scan of the metadata, per call or stream.
        """
        if not metadata or self._fixed:
            return False
        leader = next((v for k, v in metadata if k == LEADER_GRPC), "")
        if not isinstance(leader, str) or leader == via or not usable(leader):
            return False
        with self._lock:
            if leader not in self._known:
                self._known.append(leader)
            if self._current == via:
                self._current = leader
        return True

    def learn(self, servers: pb.ListServersResponse) -> None:
        """Remember the members' gRPC addresses (by node id) and know them as targets."""
        with self._lock:
            if self._fixed:
                return
            for s in servers.servers:
                if usable(s.grpc_addr):
                    self._by_id[s.id] = s.grpc_addr
                    if s.grpc_addr not in self._known:
                        self._known.append(s.grpc_addr)

    def close(self) -> list[C]:
        """Open no channel any more; returns those opened (for the client to close)."""
        with self._lock:
            self._closed = True
            return list(self._channels.values())
