"""Raft peer transport over asyncio TCP streams (TLS with mutual authentication on a secure
node): the one wire between members, on `--raft-addr`.

Implements `doq.node.transport_base.RaftTransport`. Contract:

- `send(messages)` never blocks and never fails because of a peer: each message is
  encoded (`doq.raft.codec.encode_message`) and appended to its receiver's queue. A
  message is dropped, and counted in `doq_raft_messages_dropped_total{peer,reason}`, when
  its receiver is unknown (`unknown_peer`), its queue is full (`queue_full`: bounded by
  `queue_max_messages` and `queue_max_bytes`; an empty queue always takes one message),
  or it is larger than `MAX_MESSAGE_BYTES` (`too_large`). Raft retries what is lost.
- One task per peer keeps one long-lived connection to it. Each time the task wakes,
  everything queued for the peer (up to `max_frame_bytes`, at least one message) becomes
  one `Frame`. Messages to one peer arrive in the order they were given to `send`; the
  frame in flight when a connection breaks may be lost.
- Opening a connection is a handshake (the wire, below): the opener names itself and the
  node it means; the receiver answers with its node id only when it is that node;
  anything else within `connect_timeout_s` is a failed attempt. A failed or broken
  connection is reopened after an exponential, jittered, bounded backoff
  (`backoff_delay_s`), which restarts after each successful handshake.
- Every frame carries this node's cluster ids (`set_cluster_ids`). Inbound frames are
  decoded and handed to `on_messages` as a `PeerFrame` (the connection's sender, the
  frame's cluster ids, its messages), one call per frame, on the event loop thread; the
  node's peer door decides what reaches the core. Call every method from the event loop
  thread.
- With `tls` (a secure node): every connection is TLS ≥ 1.2 with mutual authentication
  against the cluster CA (`doq.tls.creds.peer_server_context` / `peer_client_context`); a
  plaintext opener fails the TLS handshake. The opener checks that the receiver's
  certificate names the node it means (`server_hostname` = the peer's node id, a SAN of
  every node certificate); the receiver refuses a connection without a client
  certificate of a trusted CA (in the TLS handshake) and one whose certificate's common
  name is not the handshake's sender (closed, counted as
  `doq_raft_streams_refused_total{reason="certificate"}`). The material is live
  (`doq.tls.live`): the SSL contexts are built when it changes, from the bytes `LiveTls`
  checked (never the files again: a rotation may be between two renames); a build that
  fails keeps the previous contexts, logged and counted in
  `doq_raft_tls_context_failures_total`, and the next change is built again. Each new
  handshake uses the contexts current then (the listener's `sni_callback` swaps them in),
  and an inbound connection whose handshake trusted another bundle than
  the current contexts' is closed at its next frame, so its sender handshakes again
  against the new one. No TLS session is ever resumed (a resumed session skips the
  certificate check): the listener issues no tickets, the opener never offers a session,
  and an inbound connection that resumed one is refused (`reason="session_reused"`).
- Every frame carries the sender's storage alarms (`set_local_alarms`); the receiver keeps
  each peer's last report with its time (`peer_alarms`), from a member of its cluster only.
- The port is reachable before any peer is authenticated, so a connection must finish
  its TLS handshake within `connect_timeout_s` and then send its handshake unit (at most
  `MAX_HELLO_BYTES`) within `connect_timeout_s` (a sender itself waits that long), else it
  is closed. Connections not yet authenticated (handshake unit not accepted; on a secure
  node, from the end of their TLS handshake: asyncio's server does it before the node
  sees the connection) are bounded node-wide (`max_unauthenticated`) and per source
  address (`max_unauthenticated_per_address`): past either, a new one is closed at once
  (`reason="unauthenticated_limit"`; a member retries with its backoff). TLS handshakes
  in progress are bounded only by `connect_timeout_s`. What keeps strangers from the port
  is the network (a NetworkPolicy).
- A sender has at most one inbound connection: its new accepted handshake closes the
  previous one (`doq_raft_inbound_closed_total{reason="replaced"}`; a member opens a new
  connection only when it takes the old one for dead). A frame must arrive within
  `frame_deadline_s(size, frame_floor_s, frame_rate_bytes_per_s)` of its length prefix,
  else its connection is closed (`reason="frame_deadline"`). A frame larger than
  `budget_exempt_bytes` reserves its size against the node-wide `frame_budget_bytes`
  before its body is read, and waits (not reading: TCP backpressure) while that is spent,
  within its deadline (`doq_raft_frame_bytes_held`, `doq_raft_frame_budget_waits_total`):
  waiting rather than closing, so a large frame goes through once others finish instead
  of its sender reconnecting and resending it, while smaller frames (heartbeats, votes,
  most appends) never wait behind large ones. That budget is the members' (senders this
  node sends to); any other sender that passed the handshake (a removed member whose
  certificate is still trusted, a node joining before it knows this one, anyone on a
  plaintext node) reserves from a budget of its own of one `FRAME_MAX_BYTES`
  (`others_budget`), so non-members cannot make the members' large frames wait.
- The trust bundle a connection's handshake checked is compared with the current one
  before the connection replaces a sender's previous one, after each frame's length
  prefix (before anything is reserved or read) and after its body: a connection opened
  under a bundle that has since changed is closed (its sender reconnects and is checked
  against the new one).
- TCP keepalive and a user timeout (`KEEPALIVE_S`) end a connection whose peer host is
  gone or partitioned. A paused peer process (SIGSTOP, a frozen VM) is not detected by
  them: its kernel answers keepalive probes and acknowledges data until its buffers fill.
  Raft's own timeouts cope: the others elect a leader when a paused leader's heartbeats
  stop, a paused follower's queue here fills and drops (bounded), and the connection
  carries on (stale terms refused) when the process resumes.
- `stop()` gives connected peers up to `flush_timeout_s` to receive what is queued (so a
  last TIMEOUT_NOW of a leadership transfer goes out), then closes every connection the
  node has taken and cancels every task, without logging a traceback; no task of the
  transport survives it. (A connection still in its TLS handshake is asyncio's server's
  until the handshake ends, within `connect_timeout_s`.)

The wire (members of one cluster run the same version, docs/reference.md "Upgrading"):

- Every unit is a 4-byte big-endian length, then that many bytes.
- The opener's first unit is the handshake `MAGIC + sender id + b"\\0" + receiver id`
  (at most `MAX_HELLO_BYTES`). The receiver answers `ACCEPT + its node id` when it is the
  node meant (and, on a secure node, the certificate names the sender), else closes the
  connection. A first unit that is not a handshake is answered with `NOT_A_PEER_LINE` (so a
  client that took the port for HTTP says which port it reached) and closed.
- Then each unit is one serialized `doq.raft.v1.Frame` (messages, cluster ids, alarms), at
  most `FRAME_MAX_BYTES`; a unit that does not parse, or a message that does not decode,
  closes the connection. The receiver never writes after the handshake; the opener reads
  only to learn of its end.

Why not gRPC (what this replaced): one AppendEntries and its answer cross the transport
twice per call, and grpc.aio cost ~0.15 ms of the loop's CPU per frame written plus a
wake-up of its poller thread per frame read; a round trip between two loops measured
0.29-0.32 ms over grpc.aio streams against 0.05-0.06 ms over asyncio streams on uvloop
(docs/benchmarks.md, "lat9" and "peer14").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from doq_proto.raft.v1 import raft_pb2
from google.protobuf.message import DecodeError as ProtoDecodeError
from prometheus_client import Counter, Gauge

from doq.node.rate_log import RateLimitedLog
from doq.node.transport_base import OnMessages, PeerFrame, RaftTransport
from doq.raft.codec import DecodeError, decode_message, encode_message
from doq.raft.types import Message
from doq.tls.certs import NodeTls
from doq.tls.creds import (
    certificate_common_name,
    peer_client_context,
    peer_server_context,
    trusted_bundle,
)
from doq.tls.live import LiveTls

log = logging.getLogger(__name__)
_remote_log = RateLimitedLog(log)  # what a remote party can cause at will

MAGIC = b"doq-raft-1\0"
ACCEPT = b"doq-raft-accept\0"
NOT_A_PEER_LINE = b"doq-raft: this is a doq node's Raft peer port (--raft-addr)\r\n"
MAX_HELLO_BYTES = 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest encoded Raft message (e.g. a snapshot chunk) the transport carries."""
FRAME_MAX_BYTES = 2 * MAX_MESSAGE_BYTES  # a frame: messages up to max_frame_bytes, or one large one
_LEN = struct.Struct(">I")
FRAME_BUDGET_BYTES = 2 * FRAME_MAX_BYTES
"""Node-wide bound on bytes held by large inbound frames being received (at least one
frame of `FRAME_MAX_BYTES`)."""
BUDGET_EXEMPT_BYTES = 1024 * 1024
"""Frames up to this size never wait for the budget (heartbeats, votes, most appends keep
flowing while large ones wait); each authenticated sender has one connection, so they
hold at most this per sender."""
FRAME_FLOOR_S = 10.0
FRAME_RATE_BYTES_PER_S = 1024 * 1024
"""A frame must arrive within `FRAME_FLOOR_S` + its size / this of its length prefix, else
its connection is closed (a sender that announces a large frame and trickles it)."""
MAX_UNAUTHENTICATED = 512
MAX_UNAUTHENTICATED_PER_ADDRESS = 64
"""Inbound connections not yet past the handshake (TLS and the handshake unit), node-wide
and per source address; past them a new connection is closed at accept."""
KEEPALIVE_S = 5
"""A connection whose peer host stops answering (a partition, a dead host) is closed within
~3 × this: TCP keepalive probes, and `TCP_USER_TIMEOUT` for unacknowledged data; the
sender then reconnects. Not a paused process: its kernel still answers (module docstring)."""

SENT = Counter("doq_raft_messages_sent_total", "Raft messages written to a peer's connection", ["peer"])
FRAMES = Counter("doq_raft_frames_sent_total", "Frames (batches of Raft messages) written to a peer's connection",
                 ["peer"])
DROPPED = Counter("doq_raft_messages_dropped_total", "Raft messages dropped before sending", ["peer", "reason"])
STREAM_FAILURES = Counter("doq_raft_stream_failures_total", "Peer connections that failed to open or broke",
                          ["peer"])
STREAMS_REFUSED = Counter("doq_raft_streams_refused_total",
                          "Inbound peer connections refused before any message was read", ["reason"])
INBOUND_CLOSED = Counter("doq_raft_inbound_closed_total",
                         "Authenticated inbound peer connections the node closed (replaced: the same "
                         "sender handshook again; frame_deadline: a frame not received within its bound; "
                         "trust_changed: the trusted CAs changed since its handshake)",
                         ["reason"])
FRAME_BYTES_HELD = Gauge("doq_raft_frame_bytes_held",
                         "Bytes reserved by large inbound frames being received (against frame_budget_bytes)")
FRAME_BUDGET_WAITS = Counter("doq_raft_frame_budget_waits_total",
                             "Large inbound frames that waited for the node-wide budget before being read")
TLS_CONTEXT_FAILURES = Counter("doq_raft_tls_context_failures_total",
                               "TLS material the Raft port could not build contexts from (the previous kept)")
RECEIVED = Counter("doq_raft_messages_received_total",
                   "Raft messages received (peer: a peer this node sends to, else \"unknown\")", ["peer"])


def backoff_delay_s(attempt: int, rng: random.Random, initial_s: float = 0.05, max_s: float = 2.0) -> float:
    """Delay before reconnect attempt `attempt` (0-based): `initial_s * 2**attempt` capped at
    `max_s`, times a uniform jitter in [0.5, 1] (so peers do not retry in lockstep)."""
    base = min(max_s, initial_s * (2.0 ** min(attempt, 32)))
    return base * rng.uniform(0.5, 1.0)


def unit(data: bytes) -> bytes:
    """`data` as one unit of the wire (length-prefixed)."""
    return _LEN.pack(len(data)) + data


def hello(sender: str, receiver: str) -> bytes:
    """The opener's handshake unit."""
    return unit(MAGIC + sender.encode() + b"\0" + receiver.encode())


async def read_unit(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One unit; raises `asyncio.IncompleteReadError` at the stream's end and
    `_NotAUnit` past `max_bytes`."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > max_bytes:
        raise _NotAUnit(f"a unit of {n} bytes (limit {max_bytes})")
    return await reader.readexactly(n)


class _NotAUnit(ValueError):
    """A length prefix past the bound: not this wire, or a broken sender."""


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """Turn on TCP keepalive (`KEEPALIVE_S`) and a user timeout where the platform has them."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S),
                            ("TCP_KEEPCNT", 2), ("TCP_USER_TIMEOUT", 3 * KEEPALIVE_S * 1000)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class PeerStats:
    """Counters of one peer, for this transport instance (the metrics are process-wide)."""

    sent_messages: int = 0
    sent_frames: int = 0
    dropped: int = 0
    handshakes: int = 0  # connections opened successfully
    failures: int = 0  # connections that failed to open or broke


class _StreamClosed(Exception):
    """The receiver refused the handshake or ended the connection."""


class _Peer:
    """One peer: its address, bounded queue of encoded messages and sender task."""

    def __init__(self, node_id: str, addr: str) -> None:
        self.node_id = node_id
        self.addr = addr
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.stats = PeerStats()
        self.sent = SENT.labels(node_id)
        self.frames = FRAMES.labels(node_id)
        self.queue_full = DROPPED.labels(node_id, "queue_full")
        self.stream_failures = STREAM_FAILURES.labels(node_id)

    def take(self, max_bytes: int) -> list[bytes]:
        """Pop the next frame: queued messages in order up to `max_bytes` (at least one)."""
        q = self.queue
        if self.queued_bytes <= max_bytes:
            out = list(q)
            q.clear()
            self.queued_bytes = 0
            return out
        out, size = [], 0
        while q and (not out or size + len(q[0]) <= max_bytes):
            b = q.popleft()
            out.append(b)
            size += len(b)
        self.queued_bytes -= size
        return out


class _PeerContexts:
    """The SSL contexts of the live material, built from the bytes `LiveTls` checked when
    it changes (a subscriber), not from the files at a handshake. Material the contexts
    cannot be built from keeps the previous ones (logged and counted, without secrets);
    the next change is built again."""

    def __init__(self, live: LiveTls) -> None:
        material = live.current
        # raises if the node's own material cannot serve: the node does not start
        self._server, self._client = peer_server_context(material), peer_client_context(material)
        live.subscribe(self.rebuild)

    def rebuild(self, material: NodeTls) -> None:
        """Take `material` (LiveTls calls this after each change, on the changing thread)."""
        try:
            server, client = peer_server_context(material), peer_client_context(material)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            TLS_CONTEXT_FAILURES.inc()
            log.error("cannot build the Raft port's TLS contexts from the new material (%s); "
                      "keeping the previous ones", type(e).__name__)
            return
        self._server, self._client = server, client  # one assignment each: readers see old or new

    def server(self) -> ssl.SSLContext:
        return self._server

    def client(self) -> ssl.SSLContext:
        return self._client

    @property
    def trusted(self) -> bytes:
        """The trust bundle new inbound handshakes check against."""
        return trusted_bundle(self._server)


class FrameBudget:
    """The node-wide bound on bytes held by large inbound frames being received: a frame
    reserves its size before its body is read and releases it once read (or its
    connection ends). Over the bound, a frame waits, first come first served, without
    reading (its bytes stay in the sender's and the kernel's buffers: TCP backpressure).
    A frame larger than the bound is taken when nothing else is held."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for _, f in self._waiters if not f.done())

    def reserve(self, n: int) -> asyncio.Future[None] | None:
        """Reserve `n` bytes: None when reserved now, else a future that completes once they
        are (pass it to `cancel` to give up)."""
        if not self._waiters and self._fits(n):
            self._add(n)
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        return fut

    def cancel(self, n: int, fut: asyncio.Future[None]) -> None:
        """Give up a reservation's wait (released if it was granted meanwhile)."""
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self.release(n)
        else:
            fut.cancel()
            self._grant()

    def release(self, n: int) -> None:
        self._add(-n)
        self._grant()

    def _fits(self, n: int) -> bool:
        return self.held_bytes + n <= self.limit_bytes or not self.held_bytes  # alone, any frame fits

    def _add(self, n: int) -> None:
        self.held_bytes += n
        FRAME_BYTES_HELD.inc(n)

    def _grant(self) -> None:
        q = self._waiters
        while q:
            n, fut = q[0]
            if fut.done():
                q.popleft()
            elif self._fits(n):
                q.popleft()
                self._add(n)
                fut.set_result(None)
            else:
                return


def frame_deadline_s(n_bytes: int, floor_s: float, rate_bytes_per_s: float) -> float:
    """How long a frame of `n_bytes` may take to arrive once its length prefix is read."""
    return floor_s + n_bytes / rate_bytes_per_s


class _Inbound:
    """One inbound connection (for stop, the per-sender rule and the frame deadline)."""

    __slots__ = ("writer", "ip", "authenticated", "expired", "waiting")

    def __init__(self, writer: asyncio.StreamWriter, ip: str) -> None:
        self.writer = writer
        self.ip = ip
        self.authenticated = False
        self.expired = False
        self.waiting: asyncio.Future[None] | None = None

    def abort(self) -> None:
        self.writer.transport.abort()

    def expire(self) -> None:
        """Its frame's deadline passed: close the connection (and end a budget wait)."""
        self.expired = True
        INBOUND_CLOSED.labels("frame_deadline").inc()
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.set_exception(TimeoutError("frame deadline"))
        self.abort()


class TcpRaftTransport:
    """The peer transport of node `node_id`, listening on `listen_addr` (HOST:PORT; port 0
    picks a free one, see `port`). See the module docstring for the contract."""

    def __init__(
        self,
        node_id: str,
        listen_addr: str,
        on_messages: OnMessages,
        *,
        queue_max_messages: int = 4096,
        queue_max_bytes: int = 64 * 1024 * 1024,
        max_frame_bytes: int = 4 * 1024 * 1024,
        connect_timeout_s: float = 5.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        flush_timeout_s: float = 0.5,
        rng: random.Random | None = None,
        tls: NodeTls | LiveTls | None = None,
        frame_budget_bytes: int = FRAME_BUDGET_BYTES,
        others_budget_bytes: int = FRAME_MAX_BYTES,
        budget_exempt_bytes: int = BUDGET_EXEMPT_BYTES,
        frame_floor_s: float = FRAME_FLOOR_S,
        frame_rate_bytes_per_s: float = FRAME_RATE_BYTES_PER_S,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
        max_unauthenticated_per_address: int = MAX_UNAUTHENTICATED_PER_ADDRESS,
    ) -> None:
        self.node_id = node_id
        self._live = tls if isinstance(tls, LiveTls) or tls is None else LiveTls(tls)
        self._contexts = _PeerContexts(self._live) if self._live is not None else None
        self.listen_addr = listen_addr
        self.port = 0
        self._on_messages = on_messages
        self._queue_max_messages = queue_max_messages
        self._queue_max_bytes = queue_max_bytes
        self._max_frame_bytes = max_frame_bytes
        self._connect_timeout_s = connect_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._flush_timeout_s = flush_timeout_s
        self._rng = rng or random.Random()
        self._peers: dict[str, _Peer] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._inbound: dict[asyncio.Task[None], _Inbound] = {}
        self._by_sender: dict[str, _Inbound] = {}  # the one authenticated connection of each sender
        self._unauthenticated: dict[str, int] = {}  # source address -> connections not yet authenticated
        self._unauthenticated_total = 0
        self._max_unauthenticated = max_unauthenticated
        self._max_unauthenticated_per_address = max_unauthenticated_per_address
        self.budget = FrameBudget(frame_budget_bytes)  # the members' large frames
        self.others_budget = FrameBudget(others_budget_bytes)  # any other sender's (one frame at a time)
        self._budget_exempt_bytes = budget_exempt_bytes
        self._frame_floor_s = frame_floor_s
        self._frame_rate_bytes_per_s = frame_rate_bytes_per_s
        self._server: asyncio.Server | None = None
        self._started = False
        self._closing = asyncio.Event()
        self._cluster_ids: tuple[str, ...] = ()
        self._local_alarms: list[raft_pb2.StorageAlarm] = []
        self._peer_alarms: dict[str, tuple[tuple[tuple[str, str], ...], float]] = {}

    # -- the RaftTransport protocol ------------------------------------------------------

    def send(self, messages: Sequence[Message]) -> None:
        """Queue each message for its receiver (`Message.to`); never blocks (see module doc)."""
        peers = self._peers
        qmax, bmax = self._queue_max_messages, self._queue_max_bytes
        for m in messages:
            peer = peers.get(m.to)
            if peer is None:
                DROPPED.labels(m.to, "unknown_peer").inc()
                continue
            data = encode_message(m)
            n = len(data)
            if n > MAX_MESSAGE_BYTES:
                DROPPED.labels(m.to, "too_large").inc()
                peer.stats.dropped += 1
                log.error("dropping a %s message of %d bytes to %s (limit %d)", m.type.name, n, m.to, MAX_MESSAGE_BYTES)
                continue
            q = peer.queue
            if q and (len(q) >= qmax or peer.queued_bytes + n > bmax):
                peer.queue_full.inc()
                peer.stats.dropped += 1
                continue
            q.append(data)
            peer.queued_bytes += n
            peer.wake.set()

    def set_peer(self, node_id: str, raft_addr: str) -> None:
        """Send to `node_id` at `raft_addr` from now on (a new address reopens the
        connection; queued messages are kept). Setting this node itself is ignored."""
        if node_id == self.node_id:
            return
        peer = self._peers.get(node_id)
        if peer is not None and peer.addr == raft_addr:
            return
        if peer is None:
            peer = self._peers[node_id] = _Peer(node_id, raft_addr)
        else:
            self._retire(peer)
            peer.addr = raft_addr
        if self._started:
            self._spawn(peer)

    def set_cluster_ids(self, cluster_ids: Sequence[str]) -> None:
        """The cluster ids every frame carries from now on."""
        self._cluster_ids = tuple(cluster_ids)

    def remove_peer(self, node_id: str) -> None:
        """Forget `node_id`: its connection is closed and its queued messages dropped."""
        peer = self._peers.pop(node_id, None)
        if peer is not None:
            self._retire(peer)
            peer.queue.clear()
            peer.queued_bytes = 0

    @property
    def tls(self) -> NodeTls | None:
        """The node's TLS material now (None: plaintext)."""
        return self._live.current if self._live is not None else None

    async def start(self) -> None:
        """Listen on `listen_addr` and connect to the peers set so far."""
        ssl_ctx = None
        if self._contexts is not None:
            contexts = self._contexts
            ssl_ctx = contexts.server()

            def current(ssl_obj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
                # every handshake gets the contexts current then (doq.tls.live); called with
                # or without a server name in the hello. (A plain accept with start_tls per
                # connection loses a ClientHello read before it on uvloop.)
                ssl_obj.context = contexts.server()

            ssl_ctx.sni_callback = current  # type: ignore[assignment]
        try:
            host, port = _split(self.listen_addr)
            server = await asyncio.start_server(
                self._accept, host or None, port, ssl=ssl_ctx,
                ssl_handshake_timeout=self._connect_timeout_s if ssl_ctx is not None else None)
        except (OSError, ValueError) as e:
            raise OSError(f"cannot listen for Raft peers on {self.listen_addr}: {e}") from e
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        self._closing.clear()
        self._started = True
        for peer in self._peers.values():
            self._spawn(peer)

    async def stop(self) -> None:
        """Flush to connected peers (bounded by `flush_timeout_s`), then close everything."""
        self._closing.set()
        tasks = [p.task for p in self._peers.values() if p.task is not None]
        for p in self._peers.values():
            p.wake.set()
        if tasks:
            await asyncio.wait(tasks, timeout=self._flush_timeout_s)
        tasks += self._retired
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks += self._inbound  # connections past their TLS handshake (each task closes its connection)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._retired.clear()
        self._inbound.clear()
        self._by_sender.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), self._flush_timeout_s)
        self._started = False

    def set_local_alarms(self, alarms: Sequence[tuple[str, str]]) -> None:
        """This node's storage alarms, (reason, message) each, sent with every frame."""
        if len(alarms) != len(self._local_alarms) or any(
                (a.reason, a.message) != b for a, b in zip(self._local_alarms, alarms, strict=True)):
            self._local_alarms = [raft_pb2.StorageAlarm(reason=r, message=m) for r, m in alarms]

    def peer_alarms(self, max_age_s: float) -> dict[str, tuple[tuple[str, str], ...]]:
        """The alarms each peer reported in a frame received within `max_age_s`."""
        now = asyncio.get_running_loop().time()
        return {nid: alarms for nid, (alarms, at) in self._peer_alarms.items()
                if alarms and now - at <= max_age_s}

    def last_heard(self) -> dict[str, float]:
        """Seconds since the last frame from each peer that ever sent one."""
        now = asyncio.get_running_loop().time()
        return {nid: now - at for nid, (_, at) in self._peer_alarms.items()}

    # -- introspection -----------------------------------------------------------------

    def peer_stats(self, node_id: str) -> PeerStats:
        """This instance's counters for `node_id` (KeyError if not a peer)."""
        return self._peers[node_id].stats

    def queued(self, node_id: str) -> tuple[int, int]:
        """(messages, bytes) waiting for `node_id`."""
        peer = self._peers[node_id]
        return len(peer.queue), peer.queued_bytes

    # -- sending -------------------------------------------------------------------------

    def _spawn(self, peer: _Peer) -> None:
        peer.task = asyncio.get_running_loop().create_task(self._run_peer(peer), name=f"raft-send-{peer.node_id}")

    def _retire(self, peer: _Peer) -> None:
        task, peer.task = peer.task, None
        if task is not None and not task.done():
            task.cancel()
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    async def _open(self, peer: _Peer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to `peer` (TLS checking that its certificate names `peer.node_id`
        on a secure node), not yet handshaken."""
        host, port = _split(peer.addr)
        if self._contexts is None:
            return await asyncio.open_connection(host, port)
        return await asyncio.open_connection(host, port, ssl=self._contexts.client(), server_hostname=peer.node_id,
                                             ssl_handshake_timeout=self._connect_timeout_s)

    async def _run_peer(self, peer: _Peer) -> None:
        """Keep one connection open to `peer` and pump its queue into it, until stopped."""
        attempt = 0
        greeting = hello(self.node_id, peer.node_id)
        accepted = ACCEPT + peer.node_id.encode()
        while not self._closing.is_set():
            writer: asyncio.StreamWriter | None = None
            try:
                reader, opened = await asyncio.wait_for(self._open(peer), self._connect_timeout_s)
                writer = opened
                _keepalive(opened)
                opened.write(greeting)
                answer = await asyncio.wait_for(read_unit(reader, MAX_HELLO_BYTES), self._connect_timeout_s)
                if answer != accepted:
                    raise _StreamClosed("no handshake")
                attempt = 0
                peer.stats.handshakes += 1
                if not peer.connected:
                    peer.connected = True
                    log.info("raft connection to %s at %s open", peer.node_id, peer.addr)
                await self._pump(peer, reader, opened)
                return
            except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, _StreamClosed) as e:
                # (ssl.SSLError and ssl.CertificateError are OSErrors and ValueErrors)
                peer.stats.failures += 1
                peer.stream_failures.inc()
                if peer.connected:
                    peer.connected = False
                    log.warning("raft connection to %s at %s lost: %s", peer.node_id, peer.addr, _describe(e))
                else:
                    log.debug("raft connection to %s at %s not open: %s", peer.node_id, peer.addr, _describe(e))
            finally:
                if writer is not None:
                    writer.close()
            delay_s = backoff_delay_s(attempt, self._rng, self._backoff_initial_s, self._backoff_max_s)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay_s)

    async def _pump(self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Write frames while the connection lives; on stop, flush, close and return."""
        ended = asyncio.ensure_future(reader.read(1))  # the receiver writes nothing: EOF or error = gone
        ended.add_done_callback(lambda _f: peer.wake.set())
        try:
            while True:
                peer.wake.clear()
                if ended.done():
                    raise _StreamClosed("the receiver closed the connection")
                if peer.queue:
                    batch = peer.take(self._max_frame_bytes)
                    frame = raft_pb2.Frame(messages=batch, cluster_ids=self._cluster_ids,
                                           alarms=self._local_alarms).SerializeToString()
                    writer.writelines((_LEN.pack(len(frame)), frame))
                    if writer.transport.get_write_buffer_size() > self._max_frame_bytes:
                        await writer.drain()  # a slow receiver: queue here (bounded), not in the socket buffer
                    peer.stats.sent_frames += 1
                    peer.stats.sent_messages += len(batch)
                    peer.frames.inc()
                    peer.sent.inc(len(batch))
                    continue
                if self._closing.is_set():
                    await writer.drain()
                    writer.close()
                    with contextlib.suppress(OSError, ssl.SSLError):
                        await writer.wait_closed()
                    return
                await peer.wake.wait()
        finally:
            ended.cancel()

    # -- receiving -----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        per_address = self._unauthenticated.get(ip, 0)
        if (self._unauthenticated_total >= self._max_unauthenticated
                or per_address >= self._max_unauthenticated_per_address):
            STREAMS_REFUSED.labels("unauthenticated_limit").inc()
            _remote_log.warn("unauthenticated_limit", "refused a raft connection from %s: %d connections "
                             "not yet authenticated (%d from it)", ip, self._unauthenticated_total, per_address)
            writer.transport.abort()
            return
        conn = _Inbound(writer, ip)
        self._unauthenticated[ip] = per_address + 1
        self._unauthenticated_total += 1
        self._inbound[task] = conn
        try:
            _keepalive(writer)
            await self._serve(reader, writer, conn)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the sender went away, or was refused
        except asyncio.CancelledError:
            pass  # stop(): ends normally (Python 3.11's start_server logs a cancelled handler's traceback)
        finally:
            self._inbound.pop(task, None)
            if not conn.authenticated:
                self._authenticated(conn)
            if conn.expired:
                writer.transport.abort()
            else:
                writer.close()

    def _authenticated(self, conn: _Inbound) -> None:
        """`conn` counts no more against the unauthenticated bounds."""
        conn.authenticated = True
        self._unauthenticated_total -= 1
        left = self._unauthenticated[conn.ip] - 1
        if left:
            self._unauthenticated[conn.ip] = left
        else:
            del self._unauthenticated[conn.ip]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Inbound) -> None:
        """One inbound connection (its TLS handshake done on a secure node): the handshake,
        then frames until it ends."""
        contexts = self._contexts
        trusted = b""
        ssl_obj = None
        if contexts is not None:
            ssl_obj = writer.get_extra_info("ssl_object")
            if ssl_obj is None:
                return
            if ssl_obj.session_reused:
                # never offered (no tickets), but TLS 1.2 session ids cannot be turned off in
                # Python's ssl: a resumed session skipped the certificate check
                STREAMS_REFUSED.labels("session_reused").inc()
                _remote_log.warn("session_reused", "refused a raft connection from %s: it resumed a TLS session",
                                 conn.ip)
                return
            trusted = trusted_bundle(ssl_obj.context)
        try:
            first = await asyncio.wait_for(read_unit(reader, MAX_HELLO_BYTES), self._connect_timeout_s)
        except _NotAUnit:
            writer.write(NOT_A_PEER_LINE)  # e.g. an HTTP request: the client can say which port it reached
            return
        if not first.startswith(MAGIC) or first.count(b"\0") != 2:
            writer.write(NOT_A_PEER_LINE)
            return
        frm_b, _, to_b = first[len(MAGIC):].partition(b"\0")
        frm, to = frm_b.decode(errors="replace"), to_b.decode(errors="replace")
        if ssl_obj is not None:
            der = ssl_obj.getpeercert(binary_form=True)
            name = certificate_common_name(der) if der else ""
            if name != frm:
                STREAMS_REFUSED.labels("certificate").inc()
                _remote_log.warn("certificate", "refused a raft connection from %r: its certificate names %r",
                                 frm[:64], name[:64])
                return
        if to != self.node_id:
            log.debug("refused a raft connection from %r meant for %r", frm[:64], to[:64])
            return
        if contexts is not None and contexts.trusted != trusted:
            _trust_changed(frm)  # the handshake checked a bundle since replaced
            return
        self._authenticated(conn)
        old = self._by_sender.get(frm)
        if old is not None:
            # a sender keeps one connection; a new one means the old one is dead to it
            INBOUND_CLOSED.labels("replaced").inc()
            old.abort()
        self._by_sender[frm] = conn
        try:
            writer.write(unit(ACCEPT + self.node_id.encode()))
            await self._read_frames(reader, conn, frm, trusted)
        finally:
            if self._by_sender.get(frm) is conn:
                del self._by_sender[frm]

    async def _read_frames(self, reader: asyncio.StreamReader, conn: _Inbound, frm: str, trusted: bytes) -> None:
        """Frames from `frm` until the connection ends. Each frame must arrive within
        `frame_deadline_s` of its length prefix; a large one (past `budget_exempt_bytes`)
        first reserves its size against the node-wide `budget`, waiting (within its
        deadline) while it is spent."""
        contexts = self._contexts
        loop = asyncio.get_running_loop()
        exempt = self._budget_exempt_bytes
        floor_s, rate = self._frame_floor_s, self._frame_rate_bytes_per_s
        while True:
            (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
            if n > FRAME_MAX_BYTES:
                raise _NotAUnit(f"a unit of {n} bytes (limit {FRAME_MAX_BYTES})")
            if contexts is not None and contexts.trusted != trusted:
                _trust_changed(frm)
                return
            timer = loop.call_later(frame_deadline_s(n, floor_s, rate), conn.expire)
            reserved = 0
            budget = self.budget if frm in self._peers else self.others_budget
            try:
                if n > exempt:
                    wait = budget.reserve(n)
                    if wait is not None:
                        FRAME_BUDGET_WAITS.inc()
                        conn.waiting = wait
                        try:
                            await wait
                        except BaseException:
                            budget.cancel(n, wait)
                            raise
                        finally:
                            conn.waiting = None
                    reserved = n
                data = await reader.readexactly(n)
            finally:
                timer.cancel()
                if reserved:
                    budget.release(reserved)
            if contexts is not None and contexts.trusted != trusted:
                _trust_changed(frm)
                return
            try:
                frame = raft_pb2.Frame.FromString(data)
                batch = [decode_message(b) for b in frame.messages]
            except (ProtoDecodeError, DecodeError) as e:
                _remote_log.warn("undecodable", "undecodable raft frame from %r: %s", frm[:64], e)
                return
            if frm in self._peers and (not self._cluster_ids
                                       or set(frame.cluster_ids) & set(self._cluster_ids)):
                # a member's report of its own cluster only (the peer door's rule for messages;
                # a stranger can neither fill this map nor raise an alarm)
                self._peer_alarms[frm] = (tuple((a.reason, a.message) for a in frame.alarms),
                                          loop.time())
            if batch:
                self._deliver(frm, tuple(frame.cluster_ids), batch)

    def _deliver(self, frm: str, cluster_ids: tuple[str, ...], messages: list[Message]) -> None:
        RECEIVED.labels(frm if frm in self._peers else "unknown").inc(len(messages))  # bounded labels
        try:
            self._on_messages(PeerFrame(frm, cluster_ids, messages))
        except Exception:
            log.exception("on_messages failed on %d messages from %s", len(messages), frm)


def _trust_changed(frm: str) -> None:
    """The trust bundle changed since a connection's handshake: it is closed; its sender
    reconnects, and its certificate is checked against the new bundle."""
    INBOUND_CLOSED.labels("trust_changed").inc()
    log.info("closing the raft connection from %r: this node's trusted CAs changed", frm[:64])


def _implements_protocol(t: TcpRaftTransport) -> RaftTransport:
    return t  # mypy checks that TcpRaftTransport satisfies RaftTransport


def _describe(e: BaseException) -> str:
    return type(e).__name__ if not str(e) else f"{type(e).__name__}: {e}"
