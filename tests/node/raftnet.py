"""An in-memory peer network for RaftNode tests (real LMDB per node, real asyncio).

Messages go through the Raft codec (as on the wire) and are delivered on the event loop.
The network checks the Ready contract at every send: what a message depends on must
already be durable in the sender's LMDB files (read with a fresh read transaction).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import lmdb

from doq.node.cluster import MemberAddrs
from doq.node.raft_log import FIRST_KEY, HS_KEY
from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.node.transport_base import OnMessages
from doq.raft import codec
from doq.raft.types import HardState, Message, MessageType
from doq.storage.env import open_db, open_env
from doq.storage.state import StateStore

MT = MessageType
_U64 = struct.Struct(">Q")
T = TypeVar("T")
FAST = RaftNodeConfig(tick_ms=25, election_tick=10, heartbeat_tick=1)


def addrs(nid: str) -> MemberAddrs:
    return MemberAddrs(f"raft-{nid}:1", f"grpc-{nid}:2", f"http-{nid}:3")


class Net:
    """The fake network: partitions, and the durability check at send time."""

    def __init__(self) -> None:
        self.transports: dict[str, FakeTransport] = {}
        self.envs: dict[str, lmdb.Environment] = {}
        self.blocked: set[tuple[str, str]] = set()
        self.violations: list[str] = []
        self.sent = 0
        self.drop_rate = 0.0
        self.rng = random.Random(0)

    def factory(self, nid: str) -> Callable[[OnMessages], FakeTransport]:
        def make(on_messages: OnMessages) -> FakeTransport:
            t = FakeTransport(self, nid, on_messages)
            self.transports[nid] = t
            return t

        return make

    def isolate(self, nid: str) -> None:
        for other in self.transports:
            if other != nid:
                self.blocked |= {(nid, other), (other, nid)}

    def heal(self) -> None:
        self.blocked.clear()

    def durable(self, nid: str) -> tuple[HardState, int, dict[int, int]]:
        """(hard state, last index, index -> term of the last entries) as on disk."""
        env = self.envs[nid]
        with env.begin() as txn:
            raw = txn.get(HS_KEY, db=open_db(env, b"raft_meta"))
            hs = codec.decode_hard_state(bytes(raw)) if raw else HardState()
            cur = txn.cursor(db=open_db(env, b"raft_log"))
            terms: dict[int, int] = {}
            first = txn.get(FIRST_KEY, db=open_db(env, b"raft_meta"))
            last = _U64.unpack_from(first)[0] if first else 0  # the snapshot's index
            if first:
                terms[last] = _U64.unpack_from(first, 8)[0]
            if cur.last():
                last = _U64.unpack(cur.key())[0]
                for k, v in itertools.islice(cur.iterprev(), 2048):
                    terms[_U64.unpack(k)[0]] = _U64.unpack_from(v)[0]
        return hs, last, terms

    def check(self, nid: str, msgs: Sequence[Message]) -> None:
        hs, last, terms = self.durable(nid)
        for m in msgs:
            if m.type not in (MT.PRE_VOTE, MT.PRE_VOTE_RESP) and m.term > hs.term:
                self.violations.append(f"{nid}: {m.type.name} of term {m.term} sent, durable term {hs.term}")
            if m.type == MT.VOTE_RESP and not m.reject and hs.vote != m.to:
                self.violations.append(f"{nid}: vote for {m.to} sent, durable vote {hs.vote!r}")
            if m.type == MT.APP and m.entries:
                for e in m.entries:
                    if e.index > last or terms.get(e.index, e.term) != e.term:
                        self.violations.append(f"{nid}: entry {e.index} sent before it was durable (last {last})")
                        break
            if m.type == MT.APP_RESP and not m.reject and m.index > last:
                self.violations.append(f"{nid}: ack of {m.index} sent, durable last {last}")


class FakeTransport:
    """Implements `doq.node.transport_base.RaftTransport` over `Net`."""

    def __init__(self, net: Net, nid: str, on_messages: OnMessages) -> None:
        self.net = net
        self.nid = nid
        self.on_messages = on_messages
        self.peers: dict[str, str] = {}
        self.started = False

    def send(self, messages: Sequence[Message]) -> None:
        self.net.check(self.nid, messages)
        loop = asyncio.get_running_loop()
        for m in messages:
            self.net.sent += 1
            dst = self.net.transports.get(m.to)
            if m.to not in self.peers or (self.nid, m.to) in self.net.blocked:
                continue
            if dst is None or not dst.started:
                continue
            if self.net.drop_rate and self.net.rng.random() < self.net.drop_rate:
                continue
            loop.call_soon(dst.deliver, codec.decode_message(codec.encode_message(m)))

    def deliver(self, m: Message) -> None:
        if self.started and (m.frm, self.nid) not in self.net.blocked:
            self.on_messages([m])

    def set_peer(self, node_id: str, raft_addr: str) -> None:
        self.peers[node_id] = raft_addr

    def remove_peer(self, node_id: str) -> None:
        self.peers.pop(node_id, None)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


class Cluster:
    """Nodes on `Net`, each with its own LMDB environment under `root`."""

    def __init__(self, root: Path, config: RaftNodeConfig = FAST,
                 node_cls: type[RaftNode] = RaftNode) -> None:
        self.root = root
        self.config = config
        self.net = Net()
        self.nodes: dict[str, RaftNode] = {}
        self.node_cls = node_cls

    async def start(self, nid: str, *, join: bool = False) -> RaftNode:
        env = open_env(self.root / nid, map_size=1 << 30)
        self.net.envs[nid] = env
        peers = {m: addrs(m) for m in self.nodes} if join else None
        node = self.node_cls(
            env, StateStore(env), node_id=nid, addrs=addrs(nid), transport=self.net.factory(nid),
            config=self.config, join=join, peers=peers, seed=hash(nid) & 0xFFFF,
        )
        await node.start()
        self.nodes[nid] = node
        return node

    async def stop(self, nid: str, *, transfer_leadership: bool = True) -> None:
        node = self.nodes.pop(nid)
        await node.stop(transfer_leadership=transfer_leadership)
        node.env.close()

    async def close(self) -> None:
        for nid in list(self.nodes):
            await self.stop(nid, transfer_leadership=False)

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n.is_leader]
        return max(leaders, key=lambda n: n.cluster_status().term) if leaders else None

    async def wait_leader(self, timeout_s: float = 30.0, exclude: str = "") -> RaftNode:
        async def find() -> RaftNode | None:
            n = self.leader()
            return n if n is not None and n.node_id != exclude else None

        return await eventually(find, timeout_s, "no leader elected")

    async def grow(self, *nids: str) -> RaftNode:
        """Add each node through the leader (learner, then promoted); returns the leader."""
        for nid in nids:
            await self._grow_one(nid)
        return await self.wait_leader()

    async def _grow_one(self, nid: str) -> None:
        await self.wait_leader()
        await self.start(nid, join=True)

        async def add() -> object:
            return await (await self.wait_leader()).add_member(nid, addrs(nid))

        await retry(add)

        async def promoted() -> bool:
            ld = self.leader()
            return ld is not None and any(
                m.node_id == nid and m.role == "voter" for m in ld.cluster_status().members)

        await eventually(promoted, 30, f"{nid} not promoted")

    async def converged(self, timeout_s: float = 30.0) -> int:
        """Wait until every node has committed (durably) the leader's commit index as
        applied; returns it. (A node's in-memory applied index runs ahead of its disk
        while the writer's txn is being fsynced.)"""
        async def same() -> int | None:
            ld = self.leader()
            if ld is None:
                return None
            commit = ld.cluster_status().commit_index
            applied = {durable_applied(n) for n in self.nodes.values()}
            return commit if applied == {commit} else None

        return await eventually(same, timeout_s, "nodes did not converge")

    def digests(self) -> dict[str, str]:
        return {nid: n.state.snapshot_digest() for nid, n in self.nodes.items()}


def durable_applied(node: RaftNode) -> int:
    """The applied index in the node's LMDB files (a fresh read txn)."""
    applied, records = node.state.changes(0)
    records.close()  # type: ignore[attr-defined]
    return applied


async def eventually(fn: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    """Poll `fn` until it returns a truthy value (bounded deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = await fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s}s")
        await asyncio.sleep(0.02)


async def retry(fn: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
    """Retry a call that fails with a retryable DoqError (no leader yet, change pending)."""
    from doq.errors import DoqError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fn()
        except DoqError as e:
            if not e.retryable or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)
