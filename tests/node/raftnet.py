"""An in-memory peer network for RaftNode tests (real LMDB per node, real asyncio).

Messages go through the Raft codec (as on the wire) and are delivered on the event loop.
The network checks the Ready contract at every send: what a message depends on must
already be durable in the sender's LMDB files (read with a fresh read transaction): a
term, a vote, an acknowledged entry, a commit index (a leader's own new entries may
leave while it persists them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from doq.errors import Unavailable
from doq.node.cluster import MemberAddrs
from doq.node.raft_meta import FIRST_KEY, HS_KEY
from doq.node.raft_node import RaftNode, RaftNodeConfig
from doq.node.transport_base import OnMessages, PeerFrame
from doq.node.wal_log import WalLogStorage
from doq.raft import codec
from doq.raft.types import HardState, Message, MessageType
from doq.storage.env import open_env
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
        self.storages: dict[str, WalLogStorage] = {}  # node -> its log (the durable index of its segments)
        self.blocked: set[tuple[str, str]] = set()
        self.violations: list[str] = []
        self.early_appends = 0  # appends sent before their entries were durable (allowed)
        self._dbs: dict[str, tuple[Any, Any, Any]] = {}  # node -> (env, raft_meta, raft_log)
        self.sent = 0
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.max_delay_s = 0.0  # > 0: each message is delayed uniformly in [0, max) (reorders)
        self.rng = random.Random(0)
        self.trace: list[tuple[float, str, str, int, int, int]] = []  # (time, from, to, type, term, index)

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

    def check(self, nid: str, msgs: Sequence[Message]) -> None:
        """Record a violation for each message that depends on something not yet durable
        in the sender's files (read with a fresh read transaction)."""
        env = self.envs[nid]
        if self._dbs.get(nid, (None,))[0] is not env:
            # in a read txn: the node may send while its writer holds the write txn
            with env.begin() as txn:
                self._dbs[nid] = (env, env.open_db(b"raft_meta", txn=txn, create=False), None)
        _, meta, _log = self._dbs[nid]
        with env.begin() as txn:
            raw = txn.get(HS_KEY, db=meta)
            hs = codec.decode_hard_state(bytes(raw)) if raw else HardState()
            first = txn.get(FIRST_KEY, db=meta)
            snap_index = _U64.unpack_from(first)[0] if first else 0
            last = max(snap_index, self._synced_last(nid))

            for m in msgs:
                if m.type not in (MT.PRE_VOTE, MT.PRE_VOTE_RESP) and m.term > hs.term:
                    self.violations.append(f"{nid}: {m.type.name} of term {m.term} sent, durable term {hs.term}")
                if m.type == MT.VOTE_RESP and not m.reject and hs.vote != m.to:
                    self.violations.append(f"{nid}: vote for {m.to} sent, durable vote {hs.vote!r}")
                # a leader may send its entries while persisting them (Raft thesis 10.2.1),
                # but never a commit index past what it holds durably: it counts its own
                # copy in the quorum only once durable
                if m.type in (MT.APP, MT.HEARTBEAT) and m.commit > last:
                    self.violations.append(f"{nid}: commit index {m.commit} sent, durable last {last}")
                if m.type == MT.APP and m.entries and m.entries[-1].index > last:
                    self.early_appends += 1
                if m.type == MT.APP_RESP and not m.reject and m.index > last:
                    self.violations.append(f"{nid}: ack of {m.index} sent, durable last {last}")


    def _synced_last(self, nid: str) -> int:
        """The last index `nid`'s segment log has made durable (its `fdatasync` returned)."""
        storage = self.storages.get(nid)
        if storage is None or storage._seg is None:
            return 0
        return storage._seg.synced_last

    def durable_last(self, nid: str) -> int:
        """The last durable log index of `nid` (its segment log's last fdatasync, at
        least the compaction point in its LMDB files)."""
        env = self.envs[nid]
        with env.begin() as txn:
            first = txn.get(FIRST_KEY, db=env.open_db(b"raft_meta", txn=txn, create=False))
            return max(_U64.unpack_from(first)[0] if first else 0, self._synced_last(nid))


class FakeTransport:
    """Implements `doq.node.transport_base.RaftTransport` over `Net`."""

    def __init__(self, net: Net, nid: str, on_messages: OnMessages) -> None:
        self.net = net
        self.nid = nid
        self.on_messages = on_messages
        self.peers: dict[str, str] = {}
        self.started = False
        self.cluster_ids: tuple[str, ...] = ()

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
            net = self.net
            if net.drop_rate and net.rng.random() < net.drop_rate:
                continue
            copies = 2 if net.dup_rate and net.rng.random() < net.dup_rate else 1
            for _ in range(copies):
                wire = codec.decode_message(codec.encode_message(m))
                if net.max_delay_s:
                    loop.call_later(net.rng.uniform(0, net.max_delay_s), dst.deliver, wire, self.cluster_ids)
                else:
                    loop.call_soon(dst.deliver, wire, self.cluster_ids)

    def deliver(self, m: Message, cluster_ids: tuple[str, ...] = ()) -> None:
        if self.started and (m.frm, self.nid) not in self.net.blocked:
            loop = asyncio.get_running_loop()
            self.net.trace.append((loop.time(), m.frm, self.nid, int(m.type), m.term, m.index))
            self.on_messages(PeerFrame(m.frm, cluster_ids, [m]))

    def set_cluster_ids(self, cluster_ids: Sequence[str]) -> None:
        self.cluster_ids = tuple(cluster_ids)

    def set_peer(self, node_id: str, raft_addr: str) -> None:
        self.peers[node_id] = raft_addr

    def remove_peer(self, node_id: str) -> None:
        self.peers.pop(node_id, None)

    local_alarms: tuple[tuple[str, str], ...] = ()

    def set_local_alarms(self, alarms: Sequence[tuple[str, str]]) -> None:
        self.local_alarms = tuple(alarms)

    def last_heard(self) -> dict[str, float]:
        """Each reachable started peer: heard just now (no delay on this net)."""
        return {nid: 0.0 for nid in self.peers if (t := self.net.transports.get(nid)) is not None
                and t.started and (nid, self.nid) not in self.net.blocked}

    def peer_alarms(self, max_age_s: float) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each reachable started peer's alarms as they are now (no delay on this net)."""
        out = {}
        for nid in self.peers:
            t = self.net.transports.get(nid)
            if t is not None and t.started and t.local_alarms and (nid, self.nid) not in self.net.blocked:
                out[nid] = t.local_alarms
        return out

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


class Cluster:
    """Nodes on `Net`, each with its own LMDB environment under `root`."""

    def __init__(self, root: Path, config: RaftNodeConfig = FAST,
                 node_cls: type[RaftNode] = RaftNode, *,
                 prepare: Callable[[RaftNode], None] | None = None,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.root = root
        self.config = config
        self.net = Net()
        self.nodes: dict[str, RaftNode] = {}
        self.node_cls = node_cls
        self.prepare = prepare  # called on each node before it starts (e.g. executors)
        self.clock_ms = clock_ms

    async def start(self, nid: str, *, join: bool = False) -> RaftNode:
        env = open_env(self.root / nid, map_size=1 << 30)
        self.net.envs[nid] = env
        peers = {m: addrs(m) for m in self.nodes} if join else None
        extra: dict[str, object] = {"clock_ms": self.clock_ms} if self.clock_ms else {}
        if join:  # as the join answer names it (doq/node/build.py)
            extra["join_cluster_id"] = next((n.state.cluster_id for n in self.nodes.values() if n.state.cluster_id), "")
        node = self.node_cls(
            StateStore(env), node_id=nid, addrs=addrs(nid), transport=self.net.factory(nid),
            config=self.config, join=join, peers=peers, seed=zlib.crc32(nid.encode()), **extra,  # type: ignore[arg-type]
        )
        self.net.storages[nid] = node.storage
        if self.prepare:
            self.prepare(node)
        await node.start()
        self.nodes[nid] = node
        return node

    async def stop(self, nid: str, *, transfer_leadership: bool = True) -> None:
        node = self.nodes.pop(nid)
        await node.stop(transfer_leadership=transfer_leadership)
        node.env.close()

    async def crash(self, nid: str) -> None:
        """Kill the node abruptly: no handover, no final Ready, nothing more sent or
        persisted; its callers see Unavailable (as a client of a dead process would)."""
        node = self.nodes.pop(nid)
        node._stopping = True
        for h in (node._tick_handle, node._lease_handle, node._flush_handle):
            if h:
                h.cancel()
        for t in (node._task, node._snapshots.task):
            if t:
                t.cancel()
        for t in (node._task, node._snapshots.task):
            if t:
                with contextlib.suppress(BaseException):
                    await t
        node._fail_all(Unavailable("crashed"))
        self.net.transports[nid].started = False
        # a held write (the batched commit) is lost, as in a killed process: its thread
        # aborts it (a thread's txn must end before the env closes)
        node._applier.post(node.state.abort_held)
        node._writer.shutdown(wait=True)
        node._applier.shutdown(wait=True)
        node._snapshots.shutdown()
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
        node = await self.start(nid, join=True)
        mine = dataclasses.replace(addrs(nid), store_id=node.identity.store_id)  # as `doq serve --join`

        async def add() -> object:
            return await (await self.wait_leader()).add_member(nid, mine, empty=True)

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
    """The committed applied index (what readers see; the writer may be applying more)."""
    return node.applied_index


async def eventually(fn: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    """Poll `fn` until it returns a truthy value (bounded deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        v = await fn()
        if v:
            return v
        if loop.time() > deadline:
            raise AssertionError(f"{what} within {timeout_s}s")
        await asyncio.sleep(0.02)


async def retry(fn: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
    """Retry a call that fails with a retryable DoqError (no leader yet, change pending)."""
    from doq.errors import DoqError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await fn()
        except DoqError as e:
            if not e.retryable or loop.time() > deadline:
                raise
        await asyncio.sleep(0.05)


class HoldsCommitAfterAnswer(RaftNode):
    """While `hold` is set, its writer, having handed the loop the answers of a write
    (before that write's LMDB commit), waits for `release` before it commits."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()

    def _write(self, job: Any) -> None:
        early = job.answer
        if early is not None and self.hold:
            def answer(committed: Any, results: Any) -> None:
                self.held.set()  # before the answers reach the loop
                early(committed, results)
                self.release.wait(60)
            job.answer = answer
        super()._write(job)
