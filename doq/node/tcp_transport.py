"""Raft peer transport over plain asyncio TCP streams: a plaintext node's (`doq serve` without TLS).

Implements `doq.node.transport_base.RaftTransport` with the contract of
`doq.node.transport.GrpcRaftTransport` (its module docstring), whose queues, counters and
peer bookkeeping it shares (it subclasses it); only the wire differs. Why: one
AppendEntries and its answer cross the peer transport twice per call, and grpc.aio costs
~0.15 ms of the event loop's CPU per frame written plus a wake-up of its poller thread per
frame read; a round trip between two loops measured 0.29-0.32 ms over grpc.aio streams
against 0.05-0.06 ms over asyncio streams on uvloop (docs/benchmarks.md, lat9). A secure
node keeps the gRPC transport (mutual TLS with live material).

The wire, on `--raft-addr` (a node speaks one transport: members of one cluster run the
same version and the same security, docs/reference.md "Upgrading"):

- Every unit is a 4-byte big-endian length, then that many bytes.
- The opener's first unit is the handshake `MAGIC + sender id + b"\\0" + receiver id`
  (at most `MAX_HELLO_BYTES`), within `connect_timeout_s` of the connection. The receiver
  answers `ACCEPT + its node id` when it is the node meant, else closes the connection
  (a refusal); the opener counts anything else within `connect_timeout_s` as a failed
  attempt (reopened after `backoff_delay_s`, as the gRPC transport does).
- Then each unit is one serialized `doq.raft.v1.Frame` (messages, cluster ids, alarms),
  at most `_FRAME_MAX_BYTES`; a unit that does not parse, or a message that does not
  decode, closes the connection. The receiver never writes after the handshake; the
  opener reads only to learn of its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct

from doq_proto.raft.v1 import raft_pb2
from google.protobuf.message import DecodeError as ProtoDecodeError

from doq.node.transport import (
    MAX_MESSAGE_BYTES,
    STREAM_FAILURES,
    GrpcRaftTransport,
    _Peer,
    _remote_log,
    _StreamClosed,
    backoff_delay_s,
)
from doq.raft.codec import DecodeError, decode_message

log = logging.getLogger(__name__)

MAGIC = b"doq-raft-1\0"
ACCEPT = b"doq-raft-accept\0"
MAX_HELLO_BYTES = 1024
_FRAME_MAX_BYTES = 2 * MAX_MESSAGE_BYTES  # messages up to max_frame_bytes, or one large one
_LEN = struct.Struct(">I")


async def _read_unit(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One length-prefixed unit; raises `asyncio.IncompleteReadError` at the stream's end
    and ValueError past `max_bytes`."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > max_bytes:
        raise ValueError(f"a unit of {n} bytes (limit {max_bytes})")
    return await reader.readexactly(n)


def _unit(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


KEEPALIVE_S = 5
"""A connection whose peer stops answering (a partition, a dead host) is closed within
~3 × this (TCP keepalive probes, and `TCP_USER_TIMEOUT` for unacknowledged data), as the
gRPC transport's keepalive does; the sender then reconnects."""


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """Turn on TCP keepalive (`KEEPALIVE_S`) where the platform has the options."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S),
                            ("TCP_KEEPCNT", 2), ("TCP_USER_TIMEOUT", 3 * KEEPALIVE_S * 1000)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class TcpRaftTransport(GrpcRaftTransport):
    """The peer transport of node `node_id` over asyncio TCP streams (see the module doc);
    the constructor's arguments are `GrpcRaftTransport`'s, without `tls`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        if kwargs.get("tls") is not None:
            raise ValueError("TcpRaftTransport is plaintext only; a secure node uses GrpcRaftTransport")
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._tcp_server: asyncio.Server | None = None
        self._inbound: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen on `listen_addr` and connect to the peers set so far."""
        host, _, port = self.listen_addr.rpartition(":")
        try:
            server = await asyncio.start_server(self._accept, host.strip("[]") or None, int(port))
        except (OSError, ValueError) as e:
            raise OSError(f"cannot listen for Raft peers on {self.listen_addr}: {e}") from e
        self._tcp_server = server
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
        server, self._tcp_server = self._tcp_server, None
        if server is not None:
            server.close()
        tasks += self._inbound
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._retired.clear()
        self._inbound.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), self._flush_timeout_s)
        self._started = False

    # -- sending ---------------------------------------------------------------------------
    async def _run_peer(self, peer: _Peer) -> None:
        """Keep one connection open to `peer` and pump its queue into it, until stopped."""
        attempt = 0
        host, _, port = peer.addr.rpartition(":")
        hello = _unit(MAGIC + self.node_id.encode() + b"\0" + peer.node_id.encode())
        while not self._closing.is_set():
            writer: asyncio.StreamWriter | None = None
            try:
                reader, opened = await asyncio.wait_for(
                    asyncio.open_connection(host.strip("[]"), int(port)), self._connect_timeout_s)
                writer = opened
                _keepalive(opened)
                opened.write(hello)
                answer = await asyncio.wait_for(_read_unit(reader, MAX_HELLO_BYTES), self._connect_timeout_s)
                if answer != ACCEPT + peer.node_id.encode():
                    raise _StreamClosed("no handshake")
                attempt = 0
                peer.stats.handshakes += 1
                if not peer.connected:
                    peer.connected = True
                    log.info("raft stream to %s at %s open", peer.node_id, peer.addr)
                await self._pump_tcp(peer, reader, opened)
                return
            except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, _StreamClosed) as e:
                peer.stats.failures += 1
                STREAM_FAILURES.labels(peer.node_id).inc()
                if peer.connected:
                    peer.connected = False
                    log.warning("raft stream to %s at %s lost: %s", peer.node_id, peer.addr, e or type(e).__name__)
                else:
                    log.debug("raft stream to %s at %s not open: %r", peer.node_id, peer.addr, e)
            finally:
                if writer is not None:
                    writer.close()
            delay_s = backoff_delay_s(attempt, self._rng, self._backoff_initial_s, self._backoff_max_s)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay_s)

    async def _pump_tcp(self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
                    writer.write(_LEN.pack(len(frame)))
                    writer.write(frame)
                    if writer.transport.get_write_buffer_size() > self._max_frame_bytes:
                        await writer.drain()  # a slow receiver: queue here, not in the socket buffer
                    peer.stats.sent_frames += 1
                    peer.stats.sent_messages += len(batch)
                    peer.frames.inc()
                    peer.sent.inc(len(batch))
                    continue
                if self._closing.is_set():
                    await writer.drain()
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
                    return
                await peer.wake.wait()
        finally:
            ended.cancel()

    # -- receiving -------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._inbound.add(task)
        try:
            _keepalive(writer)
            await self._serve(reader, writer)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the sender went away, or was refused
        finally:
            self._inbound.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One inbound connection: the handshake, then frames until it ends."""
        hello = await asyncio.wait_for(_read_unit(reader, MAX_HELLO_BYTES), self._connect_timeout_s)
        if not hello.startswith(MAGIC) or hello.count(b"\0") != 2:
            return
        frm_b, _, to_b = hello[len(MAGIC):].partition(b"\0")
        frm, to = frm_b.decode(errors="replace"), to_b.decode(errors="replace")
        if to != self.node_id:
            log.debug("refused a raft stream from %r meant for %r", frm[:64], to[:64])
            return
        writer.write(_unit(ACCEPT + self.node_id.encode()))
        while True:
            data = await _read_unit(reader, _FRAME_MAX_BYTES)
            try:
                frame = raft_pb2.Frame.FromString(data)
                batch = [decode_message(b) for b in frame.messages]
            except (ProtoDecodeError, DecodeError) as e:
                _remote_log.warn("undecodable", "undecodable raft frame from %r: %s", frm[:64], e)
                return
            if frm in self._peers and (not self._cluster_ids or set(frame.cluster_ids) & set(self._cluster_ids)):
                # a member's report of its own cluster only (as GrpcRaftTransport)
                self._peer_alarms[frm] = (tuple((a.reason, a.message) for a in frame.alarms),
                                          asyncio.get_running_loop().time())
            if batch:
                self._deliver(frm, tuple(frame.cluster_ids), batch)
