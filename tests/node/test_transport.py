"""The peer transports on 127.0.0.1, each test for both (`GrpcRaftTransport` over real gRPC,
`TcpRaftTransport` over asyncio TCP streams) unless its name says which: order per peer,
bounded queues that never block the caller or other peers, reconnection after a restart,
the handshake, clean stop."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest
from doq_proto.raft.v1 import raft_pb2, raft_pb2_grpc

from doq.node import tcp_transport
from doq.node.tcp_transport import TcpRaftTransport
from doq.node.transport import GrpcRaftTransport, backoff_delay_s
from doq.node.transport_base import PeerFrame
from doq.raft.types import Message, MessageType, SnapshotMeta
from tests.support.proc import free_port

DEADLINE_S = 60.0  # generous: only a failing test waits it out (a loaded machine is slow)


class Inbox:
    """Collects what a transport delivers, by sender."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.frames: list[PeerFrame] = []
        self.calls = 0

    def __call__(self, frame: PeerFrame) -> None:
        self.calls += 1
        self.frames.append(frame)
        self.messages.extend(frame.messages)

    def seqs(self, frm: str) -> list[int]:
        return [m.index for m in self.messages if m.frm == frm]


def count_is(inbox: Inbox, n: int) -> Callable[[], bool]:
    return lambda: len(inbox.messages) == n


def msg(frm: str, to: str, seq: int, data: bytes = b"") -> Message:
    return Message(type=MessageType.APP, to=to, frm=frm, term=1, index=seq, data=data)


async def until(cond: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


Kind = type[GrpcRaftTransport]


@pytest.fixture(params=[GrpcRaftTransport, TcpRaftTransport], ids=["grpc", "tcp"])
def kind(request: pytest.FixtureRequest) -> Kind:
    """The transport class under test."""
    return request.param  # type: ignore[no-any-return]


@asynccontextmanager
async def transports(kind: Kind, *ids: str, **kw: object) -> AsyncIterator[tuple[dict[str, GrpcRaftTransport],
                                                                               dict[str, Inbox]]]:
    """Started transports of `kind` for `ids`, each knowing every other one."""
    inboxes = {i: Inbox() for i in ids}
    ts = {i: kind(i, "127.0.0.1:0", inboxes[i], **kw) for i in ids}  # type: ignore[arg-type]
    for t in ts.values():
        await t.start()
    for t in ts.values():
        for other in ts.values():
            t.set_peer(other.node_id, f"127.0.0.1:{other.port}")
    try:
        yield ts, inboxes
    finally:
        for t in ts.values():
            await t.stop()


def test_backoff_grows_is_bounded_and_jittered() -> None:
    rng = random.Random(7)
    delays = [backoff_delay_s(a, rng, 0.05, 2.0) for a in range(40)]
    assert all(0.025 <= d <= 2.0 for d in delays)
    assert delays[0] <= 0.05 and delays[6] >= 1.0  # 0.05 * 2**6 = 3.2 → capped at 2.0, jitter ≥ 0.5
    assert len({round(d, 9) for d in delays[10:]}) > 1  # jittered, not lockstep


async def test_two_transports_exchange_messages_in_order(kind: Kind) -> None:
    async with transports(kind, "a", "b") as (ts, inbox):
        for start in range(0, 2000, 100):
            ts["a"].send([msg("a", "b", s) for s in range(start, start + 100)])
            ts["b"].send([msg("b", "a", s) for s in range(start, start + 100)])
            if start % 500 == 0:
                await asyncio.sleep(0)  # let frames form at different sizes
        await until(lambda: len(inbox["b"].messages) == 2000 and len(inbox["a"].messages) == 2000, "2000 each way")
        assert inbox["b"].seqs("a") == list(range(2000))
        assert inbox["a"].seqs("b") == list(range(2000))
        assert all(m.to == "b" and m.term == 1 for m in inbox["b"].messages)
        stats = ts["a"].peer_stats("b")
        assert stats.sent_messages == 2000 and stats.dropped == 0
        assert stats.sent_frames < 2000  # batched: several messages per frame
        assert inbox["b"].calls == stats.sent_frames  # one on_messages call per frame


async def test_every_frame_carries_the_senders_cluster_ids_and_stream_sender(kind: Kind) -> None:
    async with transports(kind, "a", "b") as (ts, inbox):
        ts["a"].set_cluster_ids(["cid-now", "cid-before-restore"])
        ts["a"].send([msg("a", "b", s) for s in range(10)])
        await until(count_is(inbox["b"], 10), "10 messages")
        assert inbox["b"].frames
        assert all(f.sender == "a" and f.cluster_ids == ("cid-now", "cid-before-restore")
                   for f in inbox["b"].frames)


async def test_three_transports_keep_order_per_peer(kind: Kind) -> None:
    async with transports(kind, "a", "b", "c") as (ts, inbox):
        for s in range(600):
            ts["a"].send([msg("a", "b", s), msg("a", "c", s)])
            ts["b"].send([msg("b", "c", s)])
            if s % 50 == 0:
                await asyncio.sleep(0)
        await until(lambda: len(inbox["b"].messages) == 600 and len(inbox["c"].messages) == 1200, "all delivered")
        assert inbox["b"].seqs("a") == list(range(600))
        assert inbox["c"].seqs("a") == list(range(600))
        assert inbox["c"].seqs("b") == list(range(600))
        assert inbox["a"].messages == []


async def test_dead_peer_queue_is_bounded_and_does_not_block_others(kind: Kind) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nobody listens there
    async with transports(kind, "a", "c", queue_max_messages=50) as (ts, inbox):
        ts["a"].set_peer("dead", dead)
        for r in range(20):  # rounds of 50 (c's queue holds 50 too): each round fits c's queue
            ts["a"].send([m for s in range(r * 50, r * 50 + 50) for m in (msg("a", "dead", s), msg("a", "c", s))])
            await until(count_is(inbox["c"], r * 50 + 50), "c received the round")
        assert inbox["c"].seqs("a") == list(range(1000))
        queued, _ = ts["a"].queued("dead")
        assert queued <= 50
        assert ts["a"].peer_stats("dead").dropped >= 950
        await until(lambda: ts["a"].peer_stats("dead").failures >= 2, "retrying the dead peer")
        assert ts["a"].peer_stats("dead").handshakes == 0


class StalledServicer(raft_pb2_grpc.RaftTransportServicer):
    """Accepts the stream, then never reads from it (a slow or frozen peer)."""

    async def Send(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        await context.send_initial_metadata((("doq-raft-accepted", "slow"),))
        await asyncio.Event().wait()


async def _stalled_tcp_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accepts the handshake, then never reads (a slow or frozen peer)."""
    await tcp_transport._read_unit(reader, tcp_transport.MAX_HELLO_BYTES)
    writer.write(tcp_transport._unit(tcp_transport.ACCEPT + b"slow"))
    await asyncio.Event().wait()


async def test_stalled_peer_does_not_block_the_caller_or_other_peers(kind: Kind) -> None:
    if kind is TcpRaftTransport:
        tcp = await asyncio.start_server(_stalled_tcp_peer, "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
    else:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        raft_pb2_grpc.add_RaftTransportServicer_to_server(StalledServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    try:
        async with transports(kind, "a", "c", queue_max_bytes=2 * 1024 * 1024) as (ts, inbox):
            ts["a"].set_peer("slow", f"127.0.0.1:{port}")
            chunk = b"x" * (256 * 1024)
            for s in range(400):  # 100 MiB for the stalled peer: far beyond any flow-control window
                ts["a"].send([msg("a", "slow", s, chunk), msg("a", "c", s)])
                if s % 20 == 0:
                    await asyncio.sleep(0.005)
            await until(lambda: len(inbox["c"].messages) == 400, "c received everything")
            assert inbox["c"].seqs("a") == list(range(400))
            _, queued_bytes = ts["a"].queued("slow")
            assert queued_bytes <= 2 * 1024 * 1024
            assert ts["a"].peer_stats("slow").dropped > 0
    finally:
        if kind is TcpRaftTransport:
            tcp.close()
        else:
            await server.stop(None)


async def test_restarted_peer_is_reconnected(kind: Kind) -> None:
    port_b = free_port()
    inbox_a, inbox_b1, inbox_b2 = Inbox(), Inbox(), Inbox()
    a = kind("a", "127.0.0.1:0", inbox_a, backoff_max_s=0.2)
    b1 = kind("b", f"127.0.0.1:{port_b}", inbox_b1)
    await a.start()
    await b1.start()
    a.set_peer("b", f"127.0.0.1:{port_b}")
    try:
        a.send([msg("a", "b", 0)])
        await until(lambda: inbox_b1.seqs("a") == [0], "first delivery")
        await b1.stop()
        b2 = kind("b", f"127.0.0.1:{port_b}", inbox_b2)
        await b2.start()
        try:
            loop = asyncio.get_running_loop()
            end, seq = loop.time() + DEADLINE_S, 1
            while not inbox_b2.messages:  # Raft-like: resend until the new process gets one
                assert loop.time() < end, "never reconnected"
                a.send([msg("a", "b", seq)])
                seq += 1
                await asyncio.sleep(0.02)
            before = len(inbox_b2.messages)
            a.send([msg("a", "b", s) for s in range(10_000, 10_100)])
            await until(lambda: len(inbox_b2.messages) == before + 100, "delivery after reconnect")
            got = inbox_b2.seqs("a")
            assert got == sorted(got)  # in order across the reconnect
            assert a.peer_stats("b").handshakes >= 2
        finally:
            await b2.stop()
    finally:
        await a.stop()


async def test_stream_to_the_wrong_node_is_refused(kind: Kind) -> None:
    async with transports(kind, "a", "c") as (ts, inbox):
        ts["a"].set_peer("b", f"127.0.0.1:{ts['c'].port}")  # b's address points at c
        ts["a"].send([msg("a", "b", 1)])
        await until(lambda: ts["a"].peer_stats("b").failures >= 2, "refusals")
        assert ts["a"].peer_stats("b").handshakes == 0
        assert inbox["c"].messages == []


async def test_large_snapshot_chunk_and_unknown_peer(kind: Kind) -> None:
    async with transports(kind, "a", "b") as (ts, inbox):
        data = random.Random(1).randbytes(24 * 1024 * 1024)
        snap = Message(type=MessageType.SNAP, to="b", frm="a", term=3, offset=0, data=data, done=True,
                       snapshot=SnapshotMeta(index=10, term=3))
        ts["a"].send([msg("a", "b", 1), snap, msg("a", "b", 2), msg("a", "nobody", 3)])
        await until(lambda: len(inbox["b"].messages) == 3, "the chunk and its neighbours")
        got = inbox["b"].messages
        assert [m.type for m in got] == [MessageType.APP, MessageType.SNAP, MessageType.APP]
        assert got[1].data == data and got[1].snapshot == SnapshotMeta(index=10, term=3) and got[1].done


async def test_stop_flushes_then_leaves_no_tasks(kind: Kind) -> None:
    before = asyncio.all_tasks()
    dead = f"127.0.0.1:{free_port()}"
    async with transports(kind, "a", "b") as (ts, inbox):
        ts["a"].set_peer("dead", dead)
        ts["a"].set_peer("b", f"127.0.0.1:{ts['b'].port}")
        await until(lambda: ts["a"].peer_stats("b").handshakes == 1, "stream open")
        ts["a"].send([msg("a", "b", s) for s in range(100)] + [msg("a", "dead", 0)])
        ts["a"].remove_peer("dead")
        ts["a"].set_peer("dead", dead)
        await ts["a"].stop()  # flushes to b before closing
        assert inbox["b"].seqs("a") == list(range(100))
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()


@pytest.mark.parametrize("bad_to", ["", "b2"])
async def test_grpc_receiver_checks_handshake_with_raw_client(bad_to: str) -> None:
    async with transports(GrpcRaftTransport, "b") as (ts, inbox):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ts['b'].port}") as ch:
            call = raft_pb2_grpc.RaftTransportStub(ch).Send(metadata=(("doq-raft-from", "x"), ("doq-raft-to", bad_to)))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call  # refused before any frame
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            call2 = raft_pb2_grpc.RaftTransportStub(ch).Send(metadata=(("doq-raft-from", "x"), ("doq-raft-to", "b")))
            await call2.write(raft_pb2.Frame(messages=[b"\x00garbage"]))
            with pytest.raises(grpc.aio.AioRpcError) as e2:
                await call2
            assert e2.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert inbox["b"].messages == []


@pytest.mark.parametrize("hello", [b"", b"nonsense", tcp_transport.MAGIC + b"x\0b2"])
async def test_tcp_receiver_refuses_a_bad_handshake_and_an_undecodable_frame(hello: bytes) -> None:
    async with transports(TcpRaftTransport, "b") as (ts, inbox):
        reader, writer = await asyncio.open_connection("127.0.0.1", ts["b"].port)
        writer.write(tcp_transport._unit(hello))
        assert await reader.read() == b""  # closed without an answer
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", ts["b"].port)
        writer.write(tcp_transport._unit(tcp_transport.MAGIC + b"x\0b"))
        accept = await tcp_transport._read_unit(reader, 1024)
        assert accept == tcp_transport.ACCEPT + b"b"
        writer.write(tcp_transport._unit(raft_pb2.Frame(messages=[b"\x00garbage"]).SerializeToString()))
        assert await reader.read() == b""  # the undecodable frame ended the connection
        writer.close()
        assert inbox["b"].messages == []


async def test_only_a_member_of_the_same_cluster_can_report_a_storage_alarm(kind: Kind) -> None:
    """The leader refuses growth on its members' storage alarms (`peer_alarms`): a frame
    from a node that is not a configured peer, or from a peer's id with another cluster's
    id, records nothing, so a stranger who reaches the raft port cannot stop the cluster's
    writes. The same report from the member of this cluster is recorded (the control)."""
    from tests.support.forge import send_frame

    inbox = Inbox()
    t = kind("leader", "127.0.0.1:0", inbox)
    await t.start()
    try:
        t.set_peer("member", f"127.0.0.1:{free_port()}")  # a configured peer (not running)
        t.set_cluster_ids(["cluster-a"])
        addr, full = f"127.0.0.1:{t.port}", [("NOSPACE", "disk full")]
        for frm, cluster_ids in [("mallory", ["cluster-a"]), ("member", ["cluster-b"]), ("mallory", [])]:
            await asyncio.to_thread(send_frame, addr, stream_from=frm, to="leader", messages=[],
                                    cluster_ids=cluster_ids, alarms=full, grpc_wire=kind is GrpcRaftTransport)
            assert t.peer_alarms(max_age_s=3600) == {}, (frm, cluster_ids)
        await asyncio.to_thread(send_frame, addr, stream_from="member", to="leader", messages=[],
                                cluster_ids=["cluster-a"], alarms=full, grpc_wire=kind is GrpcRaftTransport)
        assert t.peer_alarms(max_age_s=3600) == {"member": (("NOSPACE", "disk full"),)}
    finally:
        await t.stop()


async def test_tcp_connections_keep_alive_so_a_silent_peer_is_dropped() -> None:
    """`TcpRaftTransport` turns on TCP keepalive and a user timeout on both ends of a
    connection (as the gRPC transport's keepalive, a partitioned peer's connection ends)."""
    import socket

    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        tcp_transport._keepalive(writer)
        sock = writer.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == tcp_transport.KEEPALIVE_S
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000 * tcp_transport.KEEPALIVE_S
        writer.close()
    finally:
        server.close()
