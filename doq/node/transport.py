"""Raft peer transport over gRPC: service `doq.raft.v1.RaftTransport` on `--raft-addr`.

Implements `doq.node.transport_base.RaftTransport`. Contract:

- `send(messages)` never blocks and never fails because of a peer: each message is
  encoded (`doq.raft.codec.encode_message`) and appended to its receiver's queue. A
  message is dropped, and counted in `doq_raft_messages_dropped_total{peer,reason}`, when
  its receiver is unknown (`unknown_peer`), its queue is full (`queue_full`: bounded by
  `queue_max_messages` and `queue_max_bytes`; an empty queue always takes one message),
  or it is larger than `MAX_MESSAGE_BYTES` (`too_large`). Raft retries what is lost.
- One task per peer keeps one long-lived client stream to it. Each time the task wakes,
  everything queued for the peer (up to `max_frame_bytes`, at least one message) becomes
  one `Frame`. Messages to one peer arrive in the order they were given to `send`; the
  frame in flight when a stream breaks may be lost.
- Opening a stream is a handshake: the receiver checks that it is the node the sender
  means (metadata `doq-raft-to`) and accepts with initial metadata `doq-raft-accepted`
  (its node id); anything else is a failed attempt. A failed or
  broken stream is reopened on a fresh channel after an exponential, jittered, bounded
  backoff (`backoff_delay_s`), which restarts after each successful handshake.
- Every frame carries this node's cluster ids (`set_cluster_ids`). Inbound frames are
  decoded and handed to `on_messages` as a `PeerFrame` (the stream's sender, the frame's
  cluster ids, its messages), one call per frame, on the event loop thread; the node's
  peer door decides what reaches the core. Call every method from the event loop thread.
- With `tls` (a secure node): mutual TLS with the cluster CA (doq/tls/creds.py). A
  sender checks that the receiver's certificate names the node it means; the receiver
  refuses a stream without a certificate of the cluster CA (in the TLS handshake) or
  whose certificate's common name is not the stream's sender (PERMISSION_DENIED, counted
  as `doq_raft_streams_refused_total{reason="certificate"}`). The material is live
  (`doq.tls.live`): a renewed certificate or a new trust bundle is used from the next
  handshake on, and an inbound stream opened under another trust bundle is ended
  (UNAVAILABLE) at its next frame, so its sender handshakes again against the new one.
- Every frame carries the sender's storage alarms (`set_local_alarms`); the receiver keeps
  each peer's last report with its time (`peer_alarms`).
- The port is reachable before any peer is authenticated, so a connection must finish
  its (TLS and HTTP/2) handshake within `connect_timeout_s` (the time a sender itself
  waits for a stream to open; gRPC's own default is 120 s) and one without a stream is
  closed after `2 * connect_timeout_s` (`server_options`): a stranger's half-open or idle
  connections cost the node seconds, not minutes. There is deliberately no bound on the
  number of connections: whoever fills it would lock members out (a member reconnects on
  a fresh connection after every broken stream); the network (a NetworkPolicy) is what
  keeps strangers from the port.
- `stop()` gives connected peers up to `flush_timeout_s` to receive what is queued
  (half-close, so a last TIMEOUT_NOW of a leadership transfer goes out), then cancels
  everything; no task of the transport survives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from doq_proto.raft.v1 import raft_pb2, raft_pb2_grpc
from prometheus_client import Counter

from doq.node.rate_log import RateLimitedLog
from doq.node.transport_base import OnMessages, PeerFrame, RaftTransport
from doq.raft.codec import DecodeError, decode_message, encode_message
from doq.raft.types import Message
from doq.tls.certs import NodeTls
from doq.tls.creds import (
    peer_channel_credentials,
    peer_channel_options,
    peer_common_name,
)
from doq.tls.live import LiveTls

log = logging.getLogger(__name__)
_remote_log = RateLimitedLog(log)  # what a remote party can cause at will

FROM_KEY = "doq-raft-from"
TO_KEY = "doq-raft-to"
ACCEPTED_KEY = "doq-raft-accepted"
"""Initial metadata of an accepted stream: the receiver's node id (the handshake)."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest encoded Raft message (e.g. a snapshot chunk) the transport carries."""
_GRPC_MAX_BYTES = 2 * MAX_MESSAGE_BYTES  # a frame: messages up to max_frame_bytes, or one large one
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 5_000),  # detect a dead or stopped peer within ~10 s
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),  # gRPC's default (1 minute) overrides the line above
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_CHANNEL_OPTIONS = [
    *_KEEPALIVE,
    ("grpc.max_send_message_length", _GRPC_MAX_BYTES),
    ("grpc.max_receive_message_length", 1024 * 1024),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", _GRPC_MAX_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def server_options(connect_timeout_s: float) -> list[tuple[str, int]]:
    """The Raft port's server options: a connection that has not finished its handshake
    within `connect_timeout_s` (a sender gives up on it by then) is closed, as is one
    without a stream for twice that (a member's connection always carries its stream)."""
    handshake_ms = max(1, round(connect_timeout_s * 1000))
    return [*_SERVER_OPTIONS, ("grpc.server_handshake_timeout_ms", handshake_ms),
            ("grpc.max_connection_idle_ms", 2 * handshake_ms)]

SENT = Counter("doq_raft_messages_sent_total", "Raft messages written to a peer's stream", ["peer"])
FRAMES = Counter("doq_raft_frames_sent_total", "Frames (batches of Raft messages) written to a peer's stream", ["peer"])
DROPPED = Counter("doq_raft_messages_dropped_total", "Raft messages dropped before sending", ["peer", "reason"])
STREAM_FAILURES = Counter("doq_raft_stream_failures_total", "Peer streams that failed to open or broke", ["peer"])
STREAMS_REFUSED = Counter("doq_raft_streams_refused_total",
                          "Inbound peer streams refused before any message was read", ["reason"])
RECEIVED = Counter("doq_raft_messages_received_total",
                   "Raft messages received (peer: a peer this node sends to, else \"unknown\")", ["peer"])


def backoff_delay_s(attempt: int, rng: random.Random, initial_s: float = 0.05, max_s: float = 2.0) -> float:
    """Delay before reconnect attempt `attempt` (0-based): `initial_s * 2**attempt` capped at
    `max_s`, times a uniform jitter in [0.5, 1] (so peers do not retry in lockstep)."""
    base = min(max_s, initial_s * (2.0 ** min(attempt, 32)))
    return base * rng.uniform(0.5, 1.0)


@dataclass
class PeerStats:
    """Counters of one peer, for this transport instance (the metrics are process-wide)."""

    sent_messages: int = 0
    sent_frames: int = 0
    dropped: int = 0
    handshakes: int = 0  # streams opened successfully
    failures: int = 0  # streams that failed to open or broke


class _StreamClosed(Exception):
    """The receiver ended the stream without an error (it should not)."""


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


class GrpcRaftTransport:
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
    ) -> None:
        self.node_id = node_id
        self._live = tls if isinstance(tls, LiveTls) or tls is None else LiveTls(tls)
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
        self._server: grpc.aio.Server | None = None
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
        """Send to `node_id` at `raft_addr` from now on (a new address reopens the stream;
        queued messages are kept). Setting this node itself is ignored."""
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
        """Forget `node_id`: its stream is closed and its queued messages dropped."""
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
        server = grpc.aio.server(options=server_options(self._connect_timeout_s))
        raft_pb2_grpc.add_RaftTransportServicer_to_server(_Servicer(self), server)
        try:
            if self._live is not None:  # each handshake gets the material current then (doq.tls.live)
                self.port = server.add_secure_port(self.listen_addr, self._live.server_credentials(peer=True))
            else:
                self.port = server.add_insecure_port(self.listen_addr)
        except RuntimeError as e:
            raise OSError(f"cannot listen for Raft peers on {self.listen_addr}: {e}") from e
        await server.start()
        self._closing.clear()
        self._server = server
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
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._retired.clear()
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
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

    async def _run_peer(self, peer: _Peer) -> None:
        """Keep one stream open to `peer` and pump its queue into it, until stopped."""
        attempt = 0
        metadata = ((FROM_KEY, self.node_id), (TO_KEY, peer.node_id))
        while not self._closing.is_set():
            channel = self._channel(peer)
            try:
                call = raft_pb2_grpc.RaftTransportStub(channel).Send(metadata=metadata)
                call.add_done_callback(lambda _c: peer.wake.set())
                md = await asyncio.wait_for(call.initial_metadata(), self._connect_timeout_s)
                if (ACCEPTED_KEY, peer.node_id) not in list(md or ()):
                    if call.done():
                        await call  # refused or unreachable: raises the call's error
                    raise _StreamClosed("no handshake")
                attempt = 0
                peer.stats.handshakes += 1
                if not peer.connected:
                    peer.connected = True
                    log.info("raft stream to %s at %s open", peer.node_id, peer.addr)
                await self._pump(peer, call)
                return
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError, _StreamClosed) as e:
                peer.stats.failures += 1
                peer.stream_failures.inc()
                if peer.connected:
                    peer.connected = False
                    log.warning("raft stream to %s at %s lost: %s", peer.node_id, peer.addr, _describe(e))
                else:
                    log.debug("raft stream to %s at %s not open: %s", peer.node_id, peer.addr, _describe(e))
            finally:
                await channel.close()
            delay_s = backoff_delay_s(attempt, self._rng, self._backoff_initial_s, self._backoff_max_s)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay_s)

    def _channel(self, peer: _Peer) -> grpc.aio.Channel:
        tls = self.tls
        if tls is None:
            return grpc.aio.insecure_channel(peer.addr, options=_CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(peer.addr, peer_channel_credentials(tls),
                                       options=[*_CHANNEL_OPTIONS, *peer_channel_options(peer.node_id)])

    async def _pump(self, peer: _Peer, call: grpc.aio.StreamUnaryCall) -> None:
        """Write frames while the stream lives; on stop, flush, half-close and return."""
        while True:
            peer.wake.clear()
            if call.done():
                await call
                raise _StreamClosed()
            if peer.queue:
                batch = peer.take(self._max_frame_bytes)
                await call.write(raft_pb2.Frame(messages=batch, cluster_ids=self._cluster_ids,
                                                alarms=self._local_alarms))
                peer.stats.sent_frames += 1
                peer.stats.sent_messages += len(batch)
                peer.frames.inc()
                peer.sent.inc(len(batch))
                continue
            if self._closing.is_set():
                await call.done_writing()
                await call
                return
            await peer.wake.wait()

    # -- receiving -----------------------------------------------------------------------

    def _deliver(self, frm: str, cluster_ids: tuple[str, ...], messages: list[Message]) -> None:
        RECEIVED.labels(frm if frm in self._peers else "unknown").inc(len(messages))  # bounded labels
        try:
            self._on_messages(PeerFrame(frm, cluster_ids, messages))
        except Exception:
            log.exception("on_messages failed on %d messages from %s", len(messages), frm)


def _implements_protocol(t: GrpcRaftTransport) -> RaftTransport:
    return t  # mypy checks that GrpcRaftTransport satisfies RaftTransport


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return type(e).__name__ if not str(e) else f"{type(e).__name__}: {e}"


class _Servicer(raft_pb2_grpc.RaftTransportServicer):
    """The receiving side: checks the handshake, decodes frames, hands them over."""

    def __init__(self, transport: GrpcRaftTransport) -> None:
        self._t = transport

    async def Send(  # noqa: N802 - the RPC's name
        self, request_iterator: AsyncIterator[raft_pb2.Frame], context: grpc.aio.ServicerContext
    ) -> raft_pb2.SendSummary:
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        frm, to = md.get(FROM_KEY, ""), md.get(TO_KEY, "")
        if self._t.tls is not None and peer_common_name(context.auth_context()) != frm:
            STREAMS_REFUSED.labels("certificate").inc()
            _remote_log.warn("certificate", "refused a raft stream from %r: its certificate names %r",
                             frm[:64], peer_common_name(context.auth_context())[:64])
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "the client certificate does not name the stream's sender")
        if to != self._t.node_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"this is node {self._t.node_id!r}, not {to[:64]!r}"
            )
        await context.send_initial_metadata(((ACCEPTED_KEY, self._t.node_id),))
        frames = messages = 0
        live = self._t._live
        trusted = live.current.ca_cert if live is not None else b""
        async for frame in request_iterator:
            if live is not None and (now := live.current.ca_cert) is not trusted:
                if now != trusted:
                    # the trust bundle changed since this stream's handshake: the sender
                    # reconnects and its certificate is checked against the new one
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "this node's trusted CAs changed: reconnect")
                trusted = now
            try:
                batch = [decode_message(b) for b in frame.messages]
            except DecodeError as e:
                _remote_log.warn("undecodable", "undecodable raft message from %r: %s", frm[:64], e)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable raft message: {e}")
            frames += 1
            messages += len(batch)
            if frm in self._t._peers and (not self._t._cluster_ids
                                          or set(frame.cluster_ids) & set(self._t._cluster_ids)):
                # a member's report of its own cluster only (the peer door's rule for messages;
                # a stranger can neither fill this map nor raise an alarm)
                self._t._peer_alarms[frm] = (tuple((a.reason, a.message) for a in frame.alarms),
                                             asyncio.get_running_loop().time())
            if batch:
                self._t._deliver(frm, tuple(frame.cluster_ids), batch)
        return raft_pb2.SendSummary(frames=frames, messages=messages)
