"""Forged Raft peer messages, as an attacker who reaches a node's raft port would send
them (issue 18's "mallory"): one frame on the node's `RaftTransport.Send` stream."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence

import grpc
from doq_proto.raft.v1 import raft_pb2, raft_pb2_grpc

from doq.node import tcp_transport
from doq.node.transport import FROM_KEY, TO_KEY
from doq.queues.codec import encode_batch
from doq.queues.commands import CommandBatch, DeleteQueue
from doq.raft import codec
from doq.raft.types import Entry, EntryType, Message, MessageType


def delete_queue_append(*, frm: str, to: str, term: int, index: int, queue: str) -> Message:
    """An APP of `term` after (`index`, `term - 1`) carrying DeleteQueue(`queue`), committing it."""
    batch = CommandBatch(int(time.time() * 1000), [DeleteQueue(queue)])
    entry = Entry(term, index + 1, EntryType.NORMAL, encode_batch(batch))
    return Message(type=MessageType.APP, to=to, frm=frm, term=term, log_term=term - 1, index=index,
                   entries=(entry,), commit=index + 1)


def send_frame(raft_addr: str, *, stream_from: str, to: str, messages: Sequence[Message],
               cluster_ids: Sequence[str] = (), credentials: grpc.ChannelCredentials | None = None,
               timeout_s: float = 10.0, alarms: Sequence[tuple[str, str]] = (),
               grpc_wire: bool | None = None) -> raft_pb2.SendSummary:
    """Open a stream to `raft_addr` (the handshake as a member would send it), write one
    frame, close; returns the receiver's summary (raises grpc.aio.AioRpcError if refused).
    `alarms`: the storage alarms (reason, message) the frame reports for its sender.
    `grpc_wire`: speak gRPC (a secure node's transport; the default with `credentials`)
    or the TCP wire of `doq.node.tcp_transport` (a plaintext node's; the default without):
    then the summary is what was written, and a refused handshake raises ConnectionError."""
    frame = raft_pb2.Frame(messages=[codec.encode_message(m) for m in messages], cluster_ids=list(cluster_ids),
                           alarms=[raft_pb2.StorageAlarm(reason=r, message=m) for r, m in alarms])
    if not (credentials is not None if grpc_wire is None else grpc_wire):
        return _send_tcp(raft_addr, stream_from, to, frame, timeout_s)

    async def run() -> raft_pb2.SendSummary:
        channel = (grpc.aio.secure_channel(raft_addr, credentials) if credentials
                   else grpc.aio.insecure_channel(raft_addr))
        async with channel:
            call = raft_pb2_grpc.RaftTransportStub(channel).Send(
                metadata=((FROM_KEY, stream_from), (TO_KEY, to)), timeout=timeout_s)
            try:
                await call.write(frame)
                await call.done_writing()
            except grpc.aio.AioRpcError:
                pass  # the receiver ended the call while this wrote (a busy machine): its status says why
            return await call

    return asyncio.run(run())


def _send_tcp(raft_addr: str, stream_from: str, to: str, frame: raft_pb2.Frame,
              timeout_s: float) -> raft_pb2.SendSummary:
    """`send_frame` over `doq.node.tcp_transport`'s wire."""
    host, _, port = raft_addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(tcp_transport._unit(tcp_transport.MAGIC + stream_from.encode() + b"\0" + to.encode()))
        head = _recv_exactly(sock, 4)
        answer = _recv_exactly(sock, int.from_bytes(head, "big")) if head else b""
        if answer != tcp_transport.ACCEPT + to.encode():
            raise ConnectionError(f"the raft port at {raft_addr} refused the handshake")
        sock.sendall(tcp_transport._unit(frame.SerializeToString()))
        sock.shutdown(socket.SHUT_WR)
        _recv_exactly(sock, 1)  # the receiver closes once it has read the frame (or refused it)
    return raft_pb2.SendSummary(frames=1, messages=len(frame.messages))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes, or fewer where the stream ended."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
