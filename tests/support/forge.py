"""Forged Raft peer messages, as an attacker who reaches a node's raft port would send
them (issue 18's "mallory"): one frame on the node's `RaftTransport.Send` stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc
from doq_proto.raft.v1 import raft_pb2, raft_pb2_grpc

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
               timeout_s: float = 10.0, alarms: Sequence[tuple[str, str]] = ()) -> raft_pb2.SendSummary:
    """Open a stream to `raft_addr` (metadata as a member would send), write one frame,
    half-close; returns the receiver's summary (raises grpc.aio.AioRpcError if refused).
    `alarms`: the storage alarms (reason, message) the frame reports for its sender."""

    async def run() -> raft_pb2.SendSummary:
        channel = (grpc.aio.secure_channel(raft_addr, credentials) if credentials
                   else grpc.aio.insecure_channel(raft_addr))
        async with channel:
            call = raft_pb2_grpc.RaftTransportStub(channel).Send(
                metadata=((FROM_KEY, stream_from), (TO_KEY, to)), timeout=timeout_s)
            try:
                await call.write(raft_pb2.Frame(
                    messages=[codec.encode_message(m) for m in messages], cluster_ids=list(cluster_ids),
                    alarms=[raft_pb2.StorageAlarm(reason=r, message=m) for r, m in alarms]))
                await call.done_writing()
            except grpc.aio.AioRpcError:
                pass  # the receiver ended the call while this wrote (a busy machine): its status says why
            return await call

    return asyncio.run(run())
