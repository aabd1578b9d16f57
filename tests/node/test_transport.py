"""TcpRaftTransport with real sockets on 127.0.0.1 (port 0), plaintext and with mutual TLS
(real certificates of a test CA, Python's `ssl`): order per peer, bounded queues that never
block the caller or other peers, reconnection after a restart, clean stop, the handshake's
and the TLS handshake's refusals, live TLS material. Every contract test runs on both wires
(`wire`)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from doq.node import transport
from doq.node.transport import TcpRaftTransport, backoff_delay_s
from doq.node.transport_base import PeerFrame
from doq.raft.types import Message, MessageType, SnapshotMeta
from doq.tls.certs import (
    NodeTls,
    generate_ca,
    install_enrolled,
    issue_node_cert,
    join_bundle,
    read_node_tls,
)
from doq.tls.creds import peer_server_context
from doq.tls.live import LiveTls
from tests.support.forge import PeerRefused, peer_context, send_frame
from tests.support.proc import free_port, refused_addr

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


class Pki:
    """A test cluster CA and node material issued from it, each node in its own tls dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca_cert, self.ca_key = generate_ca()

    def node(self, node_id: str, *, ca: tuple[bytes, bytes] | None = None, trust: bytes | None = None) -> NodeTls:
        """`node_id`'s material: a certificate of this CA (or of `ca`), trusting this CA (or `trust`)."""
        ca_cert, ca_key = ca or (self.ca_cert, self.ca_key)
        cert, key = issue_node_cert(ca_cert, ca_key, node_id, ["127.0.0.1"])
        d = self.root / f"{node_id}-{random.getrandbits(32):08x}"
        install_enrolled(d, trust or self.ca_cert, cert, key)
        return read_node_tls(d)

    def client(self, node_id: str | None) -> ssl.SSLContext:
        """A forger's context presenting a certificate of this CA for `node_id` (None: none)."""
        if node_id is None:
            return peer_context(self.ca_cert)
        tls = self.node(node_id)
        return peer_context(self.ca_cert, tls.node_cert, tls.node_key)


@pytest.fixture(params=["plain", "tls"])
def wire(request: pytest.FixtureRequest, tmp_path: Path) -> Pki | None:
    """None: plaintext transports; a Pki: every transport with a certificate of its CA."""
    return Pki(tmp_path) if request.param == "tls" else None


def make(wire: Pki | None, node_id: str, addr: str, inbox: Inbox, **kw: object) -> TcpRaftTransport:
    tls = wire.node(node_id) if wire is not None else None
    return TcpRaftTransport(node_id, addr, inbox, tls=tls, **kw)  # type: ignore[arg-type]


def forger(wire: Pki | None, node_id: str) -> ssl.SSLContext | None:
    return wire.client(node_id) if wire is not None else None


@asynccontextmanager
async def transports(wire: Pki | None, *ids: str, **kw: object
                     ) -> AsyncIterator[tuple[dict[str, TcpRaftTransport], dict[str, Inbox]]]:
    """Started transports for `ids`, each knowing every other one."""
    inboxes = {i: Inbox() for i in ids}
    ts = {i: make(wire, i, "127.0.0.1:0", inboxes[i], **kw) for i in ids}
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


def refused_certificate_total() -> float:
    return REGISTRY.get_sample_value("doq_raft_streams_refused_total", {"reason": "certificate"}) or 0.0


def test_backoff_grows_is_bounded_and_jittered() -> None:
    rng = random.Random(7)
    delays = [backoff_delay_s(a, rng, 0.05, 2.0) for a in range(40)]
    assert all(0.025 <= d <= 2.0 for d in delays)
    assert delays[0] <= 0.05 and delays[6] >= 1.0  # 0.05 * 2**6 = 3.2 → capped at 2.0, jitter ≥ 0.5
    assert len({round(d, 9) for d in delays[10:]}) > 1  # jittered, not lockstep


async def test_two_transports_exchange_messages_in_order(wire: Pki | None) -> None:
    async with transports(wire, "a", "b") as (ts, inbox):
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


async def test_every_frame_carries_the_senders_cluster_ids_and_stream_sender(wire: Pki | None) -> None:
    async with transports(wire, "a", "b") as (ts, inbox):
        ts["a"].set_cluster_ids(["cid-now", "cid-before-restore"])
        ts["a"].send([msg("a", "b", s) for s in range(10)])
        await until(count_is(inbox["b"], 10), "10 messages")
        assert inbox["b"].frames
        assert all(f.sender == "a" and f.cluster_ids == ("cid-now", "cid-before-restore")
                   for f in inbox["b"].frames)


async def test_three_transports_keep_order_per_peer(wire: Pki | None) -> None:
    async with transports(wire, "a", "b", "c") as (ts, inbox):
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


async def test_dead_peer_queue_is_bounded_and_does_not_block_others(wire: Pki | None) -> None:
    with refused_addr() as dead:  # nobody listens there
        async with transports(wire, "a", "c", queue_max_messages=50) as (ts, inbox):
            ts["a"].set_peer("dead", dead)
            for r in range(20):  # rounds of 50 (c's queue holds 50 too): each round fits c's queue
                ts["a"].send([m for s in range(r * 50, r * 50 + 50)
                              for m in (msg("a", "dead", s), msg("a", "c", s))])
                await until(count_is(inbox["c"], r * 50 + 50), "c received the round")
            assert inbox["c"].seqs("a") == list(range(1000))
            queued, _ = ts["a"].queued("dead")
            assert queued <= 50
            assert ts["a"].peer_stats("dead").dropped >= 950
            await until(lambda: ts["a"].peer_stats("dead").failures >= 2, "retrying the dead peer")
            assert ts["a"].peer_stats("dead").handshakes == 0


async def stalled_receiver(wire: Pki | None, node_id: str) -> asyncio.Server:
    """Accepts the handshake as `node_id`, then never reads (a slow or frozen peer)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await transport.read_unit(reader, transport.MAX_HELLO_BYTES)
        writer.write(transport.unit(transport.ACCEPT + node_id.encode()))
        held.append(writer)

    ctx = peer_server_context(wire.node(node_id)) if wire is not None else None
    return await asyncio.start_server(accept, "127.0.0.1", 0, ssl=ctx)


async def test_stalled_peer_does_not_block_the_caller_or_other_peers(wire: Pki | None) -> None:
    server = await stalled_receiver(wire, "slow")
    try:
        async with transports(wire, "a", "c", queue_max_bytes=2 * 1024 * 1024) as (ts, inbox):
            ts["a"].set_peer("slow", f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
            chunk = b"x" * (256 * 1024)
            for s in range(400):  # 100 MiB for the stalled peer: far beyond any socket buffer
                ts["a"].send([msg("a", "slow", s, chunk), msg("a", "c", s)])
                if s % 20 == 0:
                    await asyncio.sleep(0.005)
            await until(lambda: len(inbox["c"].messages) == 400, "c received everything")
            assert inbox["c"].seqs("a") == list(range(400))
            assert ts["a"].peer_stats("slow").handshakes == 1
            _, queued_bytes = ts["a"].queued("slow")
            assert queued_bytes <= 2 * 1024 * 1024
            assert ts["a"].peer_stats("slow").dropped > 0
    finally:
        server.close()


async def test_restarted_peer_is_reconnected(wire: Pki | None) -> None:
    port_b = free_port()
    inbox_a, inbox_b1, inbox_b2 = Inbox(), Inbox(), Inbox()
    a = make(wire, "a", "127.0.0.1:0", inbox_a, backoff_max_s=0.2)
    b1 = make(wire, "b", f"127.0.0.1:{port_b}", inbox_b1)
    await a.start()
    await b1.start()
    a.set_peer("b", f"127.0.0.1:{port_b}")
    try:
        a.send([msg("a", "b", 0)])
        await until(lambda: inbox_b1.seqs("a") == [0], "first delivery")
        await b1.stop()
        b2 = make(wire, "b", f"127.0.0.1:{port_b}", inbox_b2)
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


async def test_stream_to_the_wrong_node_is_refused(wire: Pki | None) -> None:
    async with transports(wire, "a", "c") as (ts, inbox):
        ts["a"].set_peer("b", f"127.0.0.1:{ts['c'].port}")  # b's address points at c
        ts["a"].send([msg("a", "b", 1)])
        await until(lambda: ts["a"].peer_stats("b").failures >= 2, "refusals")
        assert ts["a"].peer_stats("b").handshakes == 0
        assert inbox["c"].messages == []


async def test_large_snapshot_chunk_and_unknown_peer(wire: Pki | None) -> None:
    async with transports(wire, "a", "b") as (ts, inbox):
        data = random.Random(1).randbytes(24 * 1024 * 1024)
        snap = Message(type=MessageType.SNAP, to="b", frm="a", term=3, offset=0, data=data, done=True,
                       snapshot=SnapshotMeta(index=10, term=3))
        ts["a"].send([msg("a", "b", 1), snap, msg("a", "b", 2), msg("a", "nobody", 3)])
        await until(lambda: len(inbox["b"].messages) == 3, "the chunk and its neighbours")
        got = inbox["b"].messages
        assert [m.type for m in got] == [MessageType.APP, MessageType.SNAP, MessageType.APP]
        assert got[1].data == data and got[1].snapshot == SnapshotMeta(index=10, term=3) and got[1].done


async def test_stop_flushes_then_leaves_no_tasks(wire: Pki | None) -> None:
    with refused_addr() as dead:
        before = asyncio.all_tasks()
        async with transports(wire, "a", "b") as (ts, inbox):
            ts["a"].set_peer("dead", dead)
            ts["a"].set_peer("b", f"127.0.0.1:{ts['b'].port}")
            await until(lambda: ts["a"].peer_stats("b").handshakes == 1, "connection open")
            ts["a"].send([msg("a", "b", s) for s in range(100)] + [msg("a", "dead", 0)])
            ts["a"].remove_peer("dead")
            ts["a"].set_peer("dead", dead)
            await ts["a"].stop()  # flushes to b before closing
            assert inbox["b"].seqs("a") == list(range(100))
        await asyncio.sleep(0)
        assert asyncio.all_tasks() - before == set()


async def test_receiver_checks_the_handshake_and_every_frame(wire: Pki | None) -> None:
    """A handshake naming another receiver is refused; an undecodable frame ends the
    connection; neither delivers anything. The control: a good one is delivered."""
    async with transports(wire, "b") as (ts, inbox):
        addr = f"127.0.0.1:{ts['b'].port}"
        for bad_to in ("", "b2"):
            with pytest.raises(PeerRefused) as e:
                await asyncio.to_thread(send_frame, addr, stream_from="x", to=bad_to, messages=[],
                                        ssl_context=forger(wire, "x"), server_hostname="b")
            assert e.value.stage == "handshake"
        ctx = forger(wire, "x")
        host, port = "127.0.0.1", ts["b"].port
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="b" if ctx else None)
        writer.write(transport.hello("x", "b"))
        assert await transport.read_unit(reader, 100) == transport.ACCEPT + b"b"
        writer.write(transport.unit(b"\x0a\x09\x00garbage!"))  # messages: one undecodable message
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # closed by the receiver
        writer.close()
        assert inbox["b"].messages == []
        await asyncio.to_thread(send_frame, addr, stream_from="x", to="b", messages=[msg("x", "b", 7)],
                                ssl_context=forger(wire, "x"))
        assert inbox["b"].seqs("x") == [7]


def test_an_http_request_to_the_raft_port_is_told_what_port_it_reached() -> None:
    async def run() -> bytes:
        t = TcpRaftTransport("b", "127.0.0.1:0", Inbox())
        await t.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", t.port)
            writer.write(b"GET /cluster HTTP/1.1\r\nHost: x\r\n\r\n")
            got = await asyncio.wait_for(reader.read(), DEADLINE_S)
            writer.close()
            return got
        finally:
            await t.stop()

    assert asyncio.run(run()) == transport.NOT_A_PEER_LINE


async def test_only_a_member_of_the_same_cluster_can_report_a_storage_alarm(wire: Pki | None) -> None:
    """The leader refuses growth on its members' storage alarms (`peer_alarms`): a frame
    from a node that is not a configured peer, or from a peer's id with another cluster's
    id, records nothing, so a stranger who reaches the raft port cannot stop the cluster's
    writes. The same report from the member of this cluster is recorded (the control)."""
    t = make(wire, "leader", "127.0.0.1:0", Inbox())
    await t.start()
    member = ExitStack()
    try:
        t.set_peer("member", member.enter_context(refused_addr()))  # a configured peer, not running
        t.set_cluster_ids(["cluster-a"])
        addr, full = f"127.0.0.1:{t.port}", [("NOSPACE", "disk full")]
        for frm, cluster_ids in [("mallory", ["cluster-a"]), ("member", ["cluster-b"]), ("mallory", [])]:
            await asyncio.to_thread(send_frame, addr, stream_from=frm, to="leader", messages=[],
                                    cluster_ids=cluster_ids, alarms=full, ssl_context=forger(wire, frm))
            assert t.peer_alarms(max_age_s=3600) == {}, (frm, cluster_ids)
        await asyncio.to_thread(send_frame, addr, stream_from="member", to="leader", messages=[],
                                cluster_ids=["cluster-a"], alarms=full, ssl_context=forger(wire, "member"))
        assert t.peer_alarms(max_age_s=3600) == {"member": (("NOSPACE", "disk full"),)}
    finally:
        await t.stop()
        member.close()


def _own_socket(addr: tuple[str, int]) -> socket.socket:
    """A duplicate of this process's TCP socket bound to `addr` (found among its fds)."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getsockname() == addr:
                return sock
        except OSError:
            pass
        sock.close()
    raise AssertionError(f"no socket bound to {addr}")


def _keeps_alive(sock: socket.socket) -> bool:
    ok = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        ok = ok and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == transport.KEEPALIVE_S
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        ok = ok and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000 * transport.KEEPALIVE_S
    return ok


async def test_connections_keep_alive_so_a_silent_peer_is_dropped() -> None:
    """Both ends of a connection between two transports turn on TCP keepalive and a user
    timeout (a partitioned peer's connection ends, as gRPC's keepalive made it): read on
    the transports' own sockets, the receiver's accepted one and the sender's dialled one."""
    async with transports(None, "a", "b") as (ts, inbox):
        ts["a"].send([msg("a", "b", 1)])
        await until(lambda: inbox["b"].seqs("a") == [1], "a delivery")
        (conn,) = ts["b"]._inbound.values()
        accepted = conn.writer.get_extra_info("socket")
        assert _keeps_alive(accepted)
        dialled = _own_socket(accepted.getpeername())
        try:
            assert _keeps_alive(dialled)
        finally:
            dialled.close()


# -- TLS: the refusals (each with its control: the same connection with the right material passes)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@asynccontextmanager
async def secure_receiver(pki: Pki, node_id: str = "b", **kw: object) -> AsyncIterator[tuple[TcpRaftTransport, Inbox]]:
    inbox = Inbox()
    t = make(pki, node_id, "127.0.0.1:0", inbox, **kw)
    await t.start()
    try:
        yield t, inbox
    finally:
        await t.stop()


async def forge_to(t: TcpRaftTransport, frm: str, ctx: ssl.SSLContext | None) -> None:
    await asyncio.to_thread(send_frame, f"127.0.0.1:{t.port}", stream_from=frm, to=t.node_id,
                            messages=[msg(frm, t.node_id, 1)], ssl_context=ctx)


async def test_tls_a_member_certificate_passes(pki: Pki) -> None:
    async with secure_receiver(pki) as (t, inbox):
        await forge_to(t, "a", pki.client("a"))
        assert inbox.seqs("a") == [1]


async def test_tls_refuses_an_opener_without_a_client_certificate(pki: Pki) -> None:
    """Refused in the TLS handshake (the receiver's own check of the name, after it, never
    runs: its counter does not move)."""
    async with secure_receiver(pki) as (t, inbox):
        before = refused_certificate_total()
        with pytest.raises(PeerRefused):
            await forge_to(t, "a", pki.client(None))
        assert refused_certificate_total() == before
        assert inbox.messages == []


async def test_tls_refuses_a_certificate_of_another_ca(pki: Pki) -> None:
    other = generate_ca()
    stranger = pki.node("a", ca=other)
    async with secure_receiver(pki) as (t, inbox):
        before = refused_certificate_total()
        with pytest.raises(PeerRefused):
            await forge_to(t, "a", peer_context(pki.ca_cert, stranger.node_cert, stranger.node_key))
        assert refused_certificate_total() == before  # refused in the TLS handshake
        assert inbox.messages == []


async def test_tls_refuses_a_member_certificate_claiming_another_sender(pki: Pki) -> None:
    """A real member's certificate (CN "c") used to claim to be "a": refused after the TLS
    handshake, counted as a certificate refusal."""
    async with secure_receiver(pki) as (t, inbox):
        before = refused_certificate_total()
        with pytest.raises(PeerRefused) as e:
            await forge_to(t, "a", pki.client("c"))
        assert e.value.stage == "handshake"
        assert refused_certificate_total() == before + 1
        assert inbox.messages == []


async def test_tls_a_receiver_whose_certificate_does_not_name_the_node_meant_gets_nothing(pki: Pki) -> None:
    """An impostor with a valid certificate of the cluster CA for "c" that accepts any
    handshake, at the address "b" is expected: the sender's TLS handshake fails (the
    certificate does not name "b"), so nothing is sent to it."""
    heard: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with_hello = await transport.read_unit(reader, transport.MAX_HELLO_BYTES)
        heard.append(with_hello)
        writer.write(transport.unit(transport.ACCEPT + b"b"))
        heard.append(await reader.read())

    server = await asyncio.start_server(impostor, "127.0.0.1", 0, ssl=peer_server_context(pki.node("c")))
    try:
        async with secure_receiver(pki, "a") as (a, _):
            a.set_peer("b", f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
            a.send([msg("a", "b", 1)])
            await until(lambda: a.peer_stats("b").failures >= 2, "failed attempts")
            assert a.peer_stats("b").handshakes == 0
            assert heard == []
    finally:
        server.close()


async def test_tls_port_refuses_a_plaintext_opener(pki: Pki) -> None:
    async with secure_receiver(pki) as (t, inbox):
        with pytest.raises(PeerRefused):
            await forge_to(t, "a", None)
        assert inbox.messages == []


@pytest.mark.parametrize("starts_tls", [False, True])
async def test_tls_a_stranger_that_never_sends_its_handshake_is_closed(pki: Pki, starts_tls: bool) -> None:
    """A connection that never starts TLS, or finishes TLS (a member's certificate) and
    never sends the handshake unit, is closed by the receiver within its bound
    (`connect_timeout_s`, here 0.5 s; the test waits up to 20 s for the close, a third of
    asyncio's own default TLS handshake timeout, so it fails without the node's bound)."""
    async with secure_receiver(pki, connect_timeout_s=0.5) as (t, inbox):
        ctx = pki.client("a") if starts_tls else None
        reader, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx,
                                                       server_hostname="b" if ctx else None)
        try:
            closed = await asyncio.wait_for(reader.read(), 20)
        except (ssl.SSLError, ConnectionError):
            closed = b""
        assert closed == b""
        writer.close()
        assert inbox.messages == []


async def keep_sending(a: TcpRaftTransport, to: str, cond: Callable[[], bool], what: str) -> None:
    """Raft-like: send a message every 20 ms until `cond()`."""
    loop = asyncio.get_running_loop()
    end, seq = loop.time() + DEADLINE_S, 1
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        a.send([msg(a.node_id, to, seq)])
        seq += 1
        await asyncio.sleep(0.02)


async def test_tls_a_new_trust_bundle_ends_connections_opened_under_the_old_one(pki: Pki) -> None:
    """b trusts a's CA (CA0) beside its own. Its bundle changes, still with CA0: a's
    connection, opened before, is closed at its next frame and a handshakes again, and
    later frames arrive. Then the bundle drops CA0: a's connection is closed again and a
    cannot handshake any more (the next handshake uses the current material)."""
    ca0 = generate_ca("a's CA")
    live_b = LiveTls(pki.node("b", trust=join_bundle(pki.ca_cert, ca0[0])))
    inbox_b = Inbox()
    b = TcpRaftTransport("b", "127.0.0.1:0", inbox_b, tls=live_b)
    a = TcpRaftTransport("a", "127.0.0.1:0", Inbox(), tls=pki.node("a", ca=ca0), backoff_max_s=0.2)
    await b.start()
    await a.start()
    try:
        a.set_peer("b", f"127.0.0.1:{b.port}")
        await keep_sending(a, "b", lambda: bool(inbox_b.messages), "a first delivery")
        assert a.peer_stats("b").handshakes == 1
        (live_b.directory / "ca.crt").write_bytes(join_bundle(pki.ca_cert, ca0[0], generate_ca("next")[0]))
        live_b.reload()
        await keep_sending(a, "b", lambda: a.peer_stats("b").handshakes >= 2, "a second handshake")
        a.send([msg("a", "b", 100_000)])
        await until(lambda: 100_000 in inbox_b.seqs("a"), "delivery on the new connection")

        (live_b.directory / "ca.crt").write_bytes(pki.ca_cert)  # CA0 trusted no more
        live_b.reload()
        failures = a.peer_stats("b").failures
        await keep_sending(a, "b", lambda: a.peer_stats("b").failures >= failures + 3, "refused handshakes")
        assert a.peer_stats("b").handshakes == 2
        delivered = len(inbox_b.messages)
        a.send([msg("a", "b", 200_000)])
        await until(lambda: a.peer_stats("b").failures >= failures + 5, "more refused handshakes")
        assert len(inbox_b.messages) == delivered
    finally:
        await a.stop()
        await b.stop()
