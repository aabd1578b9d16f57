"""The peer wire's security review (peer14's findings, docs/benchmarks.md "peer15"), each
as a test that fails without its fix: no TLS session resumption past a trust change; one
inbound connection per sender; a deadline per frame; a node-wide budget of bytes held by
large frames being received; a bound on connections not yet authenticated; SSL contexts
built from the checked bytes at reload (a failed build keeps the previous ones, and is
not taken as done); `stop()` ends connections still in their TLS handshake, without a
traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from doq_proto.raft.v1 import raft_pb2
from prometheus_client import REGISTRY

from doq.node import transport
from doq.node.transport import TcpRaftTransport
from doq.raft.codec import encode_message
from doq.tls.certs import generate_ca, issue_node_cert, join_bundle
from doq.tls.live import LiveTls
from tests.node.test_transport import DEADLINE_S, Inbox, Pki, keep_sending, make, msg, until
from tests.support.forge import send_frame
from tests.support.proc import refused_addr

MiB = 1024 * 1024


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(params=["plain", "tls"])
def wire(request: pytest.FixtureRequest, tmp_path: Path) -> Pki | None:
    return Pki(tmp_path) if request.param == "tls" else None


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@asynccontextmanager
async def receiver(wire: Pki | None, **kw: object) -> AsyncIterator[tuple[TcpRaftTransport, Inbox]]:
    inbox = Inbox()
    t = make(wire, "b", "127.0.0.1:0", inbox, **kw)
    await t.start()
    try:
        yield t, inbox
    finally:
        await t.stop()


async def open_as(wire: Pki | None, t: TcpRaftTransport, frm: str
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `t` that has sent the handshake as `frm` (with `frm`'s certificate
    on a secure wire) and read the receiver's acceptance."""
    ctx = wire.client(frm) if wire is not None else None
    reader, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx,
                                                   server_hostname=t.node_id if ctx else None)
    writer.write(transport.hello(frm, t.node_id))
    assert await transport.read_unit(reader, 100) == transport.ACCEPT + t.node_id.encode()
    return reader, writer


async def closed_by_receiver(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def frame_of(frm: str, to: str, seq: int, data: bytes = b"") -> bytes:
    return raft_pb2.Frame(messages=[encode_message(msg(frm, to, seq, data))]).SerializeToString()


# -- 1. a resumed TLS session must not pass a change of the trusted CAs (t1_resume) --------


def _client_ctx(version: ssl.TLSVersion, trust: bytes, cert: bytes, key: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ctx.maximum_version = version
    ctx.load_verify_locations(cadata=trust.decode())
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "c.crt").write_bytes(cert)
        (Path(d) / "c.key").write_bytes(key)
        ctx.load_cert_chain(Path(d) / "c.crt", Path(d) / "c.key")
    return ctx


def _send_one(port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None, seq: int
              ) -> tuple[bool, ssl.SSLSession | None, bool | None]:
    """(accepted, the session to resume, whether this one was resumed): a's handshake to b
    and one frame, as the reviewer's script did."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    try:
        ss = ctx.wrap_socket(raw, server_hostname="b", session=session)
    except OSError:
        raw.close()
        return False, None, None
    with ss:
        try:
            ss.sendall(transport.hello("a", "b"))
            want = transport.unit(transport.ACCEPT + b"b")
            buf = b""
            while len(buf) < len(want):
                got = ss.recv(100)
                if not got:
                    break
                buf += got
        except OSError:
            return False, None, ss.session_reused
        if buf != want:
            return False, None, ss.session_reused
        ss.sendall(transport.unit(frame_of("a", "b", seq)))
        sess, reused = ss.session, ss.session_reused
        try:
            ss.shutdown(socket.SHUT_WR)
            while ss.recv(100):
                pass
        except OSError:
            pass
        return True, sess, reused


@pytest.mark.parametrize("version", ["1.2", "1.3"])
async def test_a_resumed_session_does_not_pass_a_removed_ca(pki: Pki, version: str) -> None:
    """a's certificate is of CA0, which b trusts beside its own CA; a connects once and
    keeps its TLS session (a TLS 1.3 ticket, a TLS 1.2 session id). b's bundle drops CA0:
    a fresh handshake is refused (the control), and so is one offering the session:
    nothing of it reaches b's core. TLS 1.3: b issues no ticket, so there is nothing to
    resume; TLS 1.2: each handshake uses the contexts of its generation, whose session
    cache never held a's session (before, the listener's first context kept its cache
    across reloads and resumed it)."""
    tls_version = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}[version]
    ca0 = generate_ca("a's CA")
    live_b = LiveTls(pki.node("b", trust=join_bundle(pki.ca_cert, ca0[0])))
    inbox = Inbox()
    b = TcpRaftTransport("b", "127.0.0.1:0", inbox, tls=live_b)
    await b.start()
    try:
        a_tls = pki.node("a", ca=ca0)
        ctx = _client_ctx(tls_version, pki.ca_cert, a_tls.node_cert, a_tls.node_key)
        accepted, session, reused = await asyncio.to_thread(_send_one, b.port, ctx, None, 1)
        assert accepted and not reused and session is not None
        await until(lambda: inbox.seqs("a") == [1], "the first frame")

        (live_b.directory / "ca.crt").write_bytes(pki.ca_cert)  # CA0 trusted no more
        live_b.reload()
        accepted, _, _ = await asyncio.to_thread(_send_one, b.port, ctx, None, 2)
        assert not accepted  # the control: a full handshake checks a's certificate

        accepted, _, reused = await asyncio.to_thread(_send_one, b.port, ctx, session, 3)
        assert not accepted and not reused  # a full handshake, refused in it
        assert inbox.seqs("a") == [1]
    finally:
        await b.stop()


@asynccontextmanager
async def _b_and_a_client(pki: Pki, version: str
                          ) -> AsyncIterator[tuple[TcpRaftTransport, Inbox, ssl.SSLContext]]:
    """A started secure transport `b`, its inbox, and a client context with `a`'s
    certificate limited to TLS `version` ("1.2" or "1.3")."""
    tls_version = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}[version]
    inbox = Inbox()
    b = TcpRaftTransport("b", "127.0.0.1:0", inbox, tls=pki.node("b"))
    await b.start()
    try:
        a_tls = pki.node("a")
        yield b, inbox, _client_ctx(tls_version, pki.ca_cert, a_tls.node_cert, a_tls.node_key)
    finally:
        await b.stop()


@pytest.mark.parametrize("version", ["1.2", "1.3"])
async def test_the_peer_port_gives_no_session_to_resume(pki: Pki, version: str) -> None:
    """No TLS 1.3 ticket, no TLS 1.2 ticket: a client offering the session of its last
    connection gets a full handshake (and passes, its certificate being trusted)."""
    async with _b_and_a_client(pki, version) as (b, inbox, ctx):
        session = None
        for seq in (1, 2, 3):
            accepted, session, reused = await asyncio.to_thread(_send_one, b.port, ctx, session, seq)
            assert accepted and not reused
        await until(lambda: inbox.seqs("a") == [1, 2, 3], "three frames")


@pytest.mark.parametrize("version", ["1.2", "1.3"])
async def test_a_resumed_session_is_refused_whatever_the_context_allows(
        pki: Pki, version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The belt: the transport's dialer never resumes, so a connection that resumed a
    TLS session is refused after its TLS handshake (counted), even under unchanged trust
    and even with server contexts that issue tickets (forced here: the node's own issue
    none). The control: the same client's full handshakes pass."""
    real = transport.peer_server_context

    def with_tickets(material: object) -> ssl.SSLContext:
        ctx = real(material)  # type: ignore[arg-type]
        ctx.options &= ~ssl.OP_NO_TICKET
        ctx.num_tickets = 2
        return ctx

    monkeypatch.setattr(transport, "peer_server_context", with_tickets)
    async with _b_and_a_client(pki, version) as (b, inbox, ctx):
        accepted, session, reused = await asyncio.to_thread(_send_one, b.port, ctx, None, 1)
        assert accepted and not reused
        refused = sample("doq_raft_streams_refused_total", reason="session_reused")
        accepted, _, reused = await asyncio.to_thread(_send_one, b.port, ctx, session, 2)
        assert reused and not accepted
        assert sample("doq_raft_streams_refused_total", reason="session_reused") == refused + 1
        accepted, _, _ = await asyncio.to_thread(_send_one, b.port, ctx, None, 3)
        assert accepted
        await until(lambda: inbox.seqs("a") == [1, 3], "the full handshakes' frames")


# -- 2. half-received frames: one connection per sender, a deadline, a budget (big_prefix) ----


async def test_a_sender_keeps_one_inbound_connection(wire: Pki | None) -> None:
    """A second accepted handshake from the same sender closes its first connection
    (counted); the second carries frames. Another sender's connection is left alone."""
    async with receiver(wire) as (t, inbox):
        r1, w1 = await open_as(wire, t, "x")
        ry, wy = await open_as(wire, t, "y")
        before = sample("doq_raft_inbound_closed_total", reason="replaced")
        r2, w2 = await open_as(wire, t, "x")
        assert await closed_by_receiver(r1)
        assert sample("doq_raft_inbound_closed_total", reason="replaced") == before + 1
        w2.write(transport.unit(frame_of("x", "b", 7)))
        wy.write(transport.unit(frame_of("y", "b", 8)))
        await until(lambda: inbox.seqs("x") == [7] and inbox.seqs("y") == [8], "both frames")
        for w in (w1, w2, wy):
            w.close()


async def test_a_frame_not_received_within_its_deadline_closes_the_connection(wire: Pki | None) -> None:
    """A sender announcing a frame and trickling it is closed once the frame's bound
    (here injected tiny: 0.01 s + size at 1 GiB/s) passes, counted; nothing is delivered,
    and nothing stays reserved. A sender whose frame arrives whole is not affected (the
    control, on a transport with the default bound)."""
    async with receiver(wire, frame_floor_s=0.01, frame_rate_bytes_per_s=1024 * MiB,
                        budget_exempt_bytes=0) as (t, inbox):
        reader, writer = await open_as(wire, t, "x")
        before = sample("doq_raft_inbound_closed_total", reason="frame_deadline")
        writer.write(struct.pack(">I", 2 * MiB) + b"\0" * 1000)  # then nothing more
        assert await closed_by_receiver(reader)
        assert sample("doq_raft_inbound_closed_total", reason="frame_deadline") == before + 1
        assert inbox.messages == [] and t.budget.held_bytes == 0
        writer.close()
    async with receiver(wire) as (t, inbox):
        reader, writer = await open_as(wire, t, "x")
        writer.write(transport.unit(frame_of("x", "b", 1, b"z" * 2 * MiB)))
        await until(lambda: inbox.seqs("x") == [1], "the whole frame")
        writer.close()


async def test_large_frames_being_received_are_bounded_node_wide(wire: Pki | None) -> None:
    """The reviewer's big_prefix: four members each announce a large frame and send part
    of it. With a budget of 3 MiB and frames of ~2 MiB, one is read and three wait
    without reading (counted); the held bytes are the budget's and the gauge's. A small
    frame from a fifth sender is delivered meanwhile (exempt: heartbeats keep flowing).
    The first frame completed, the next waiter takes the budget; the connections closed,
    nothing stays held."""
    with refused_addr() as dead:
        await _bounded_node_wide(wire, dead)


async def _bounded_node_wide(wire: Pki | None, dead: str) -> None:
    async with receiver(wire, frame_budget_bytes=3 * MiB, budget_exempt_bytes=64 * 1024,
                        frame_floor_s=3600.0) as (t, inbox):
        for i in range(4):
            t.set_peer(f"x{i}", dead)  # members: the members' budget (unreachable: no matter)
        gauge_before = sample("doq_raft_frame_bytes_held")
        waits_before = sample("doq_raft_frame_budget_waits_total")
        frames = {f"x{i}": frame_of(f"x{i}", "b", i, b"z" * 2 * MiB) for i in range(4)}
        conns = {}
        for frm, frame in frames.items():
            conns[frm] = await open_as(wire, t, frm)
            conns[frm][1].write(struct.pack(">I", len(frame)) + frame[:100_000])
            await until(lambda: t.budget.held_bytes > 0, "the first frame reserved")
        await until(lambda: t.budget.waiting == 3, "three frames waiting")
        first = next(f for f in frames if t.budget.held_bytes == len(frames[f]))
        assert t.budget.held_bytes == len(frames[first]) <= 3 * MiB
        assert sample("doq_raft_frame_bytes_held") - gauge_before == t.budget.held_bytes
        assert sample("doq_raft_frame_budget_waits_total") == waits_before + 3

        _, wm = await open_as(wire, t, "member")
        wm.write(transport.unit(frame_of("member", "b", 99)))
        await until(lambda: inbox.seqs("member") == [99], "a small frame while the budget is spent")

        conns[first][1].write(frames[first][100_000:])
        idx = int(first[1:])
        await until(lambda: inbox.seqs(first) == [idx], "the reserved frame")
        await until(lambda: t.budget.waiting == 2 and t.budget.held_bytes > 0, "the next waiter reserved")
        assert t.budget.held_bytes <= 3 * MiB
        for _, w in conns.values():
            w.close()
        wm.close()
        await until(lambda: t.budget.held_bytes == 0 and t.budget.waiting == 0, "everything released")
        assert sample("doq_raft_frame_bytes_held") == gauge_before


async def test_non_members_large_frames_never_make_a_members_wait(wire: Pki | None) -> None:
    """The second review's budget.py: two senders that are not members (on a secure node,
    removed members whose certificates are still trusted) each announce a large frame and
    trickle it. They reserve from a budget of their own (one frame at a time: the second
    waits), so a member's large frame reserves from the members' budget at once and is
    delivered meanwhile. (With one shared budget, the member's frame waits behind them.)"""
    with refused_addr() as dead:
        async with receiver(wire, frame_budget_bytes=3 * MiB, others_budget_bytes=3 * MiB,
                            budget_exempt_bytes=64 * 1024, frame_floor_s=3600.0) as (t, inbox):
            t.set_peer("m", dead)  # a member (this node sends to it), unreachable: no matter
            conns = []
            for i in range(2):
                frame = frame_of(f"x{i}", "b", i, b"z" * 2 * MiB)
                conns.append(await open_as(wire, t, f"x{i}"))
                conns[-1][1].write(struct.pack(">I", len(frame)) + frame[:100_000])
                await until(lambda: t.others_budget.held_bytes > 0, "the first non-member frame reserved")
            await until(lambda: t.others_budget.waiting == 1, "the second non-member frame waiting")
            assert t.budget.held_bytes == 0 and t.budget.waiting == 0
            _, wm = await open_as(wire, t, "m")
            wm.write(transport.unit(frame_of("m", "b", 99, b"y" * 2 * MiB)))
            await until(lambda: inbox.seqs("m") == [99], "the member's large frame")
            assert t.others_budget.waiting == 1 and t.budget.held_bytes == 0
            for _, w in conns:
                w.close()
            wm.close()
            await until(lambda: t.others_budget.held_bytes == 0 and t.others_budget.waiting == 0,
                        "everything released")


async def test_a_connection_from_before_a_trust_change_reserves_nothing(pki: Pki) -> None:
    """A sender's connection opened under the old trust bundle is closed at its next
    frame's length prefix (counted), before anything is reserved or read, and a hello
    whose TLS handshake checked the old bundle does not replace the sender's connection."""
    live = LiveTls(pki.node("b"))
    inbox = Inbox()
    t = TcpRaftTransport("b", "127.0.0.1:0", inbox, tls=live, budget_exempt_bytes=64 * 1024,
                         frame_floor_s=3600.0)
    await t.start()
    try:
        reader, writer = await open_as(pki, t, "x")
        ctx = pki.client("x")
        r2, w2 = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx, server_hostname="b")
        (live.directory / "ca.crt").write_bytes(join_bundle(pki.ca_cert, generate_ca("next")[0]))
        live.reload()
        before = sample("doq_raft_inbound_closed_total", reason="trust_changed")
        waits = sample("doq_raft_frame_budget_waits_total")
        writer.write(struct.pack(">I", 2 * MiB) + b"\0" * 1000)
        assert await closed_by_receiver(reader)
        assert t.budget.held_bytes == 0 and t.others_budget.held_bytes == 0
        assert sample("doq_raft_frame_budget_waits_total") == waits
        w2.write(transport.hello("x", "b"))  # its TLS handshake checked the old bundle
        assert await closed_by_receiver(r2)
        assert sample("doq_raft_inbound_closed_total", reason="trust_changed") == before + 2
        assert inbox.messages == []
        for w in (writer, w2):
            w.close()
    finally:
        await t.stop()


async def test_a_stranger_never_gets_past_the_handshake_prefix(wire: Pki | None) -> None:
    """Before its handshake is accepted, a connection's first unit is at most
    MAX_HELLO_BYTES: a stranger announcing 128 MiB is answered and closed, reserving
    nothing."""
    async with receiver(wire) as (t, _):
        ctx = wire.client("x") if wire is not None else None
        reader, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx,
                                                       server_hostname="b" if ctx else None)
        writer.write(struct.pack(">I", 128 * MiB - 1) + b"\0" * 1000)
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == transport.NOT_A_PEER_LINE
        assert t.budget.held_bytes == 0
        writer.close()


# -- 3. connections before authentication are bounded --------------------------------------


async def idle_connection(wire: Pki | None, t: TcpRaftTransport) -> asyncio.StreamWriter:
    """A connection that never sends its handshake unit (past its TLS handshake, a
    member's certificate, on a secure wire: asyncio's server hands the node a connection
    once TLS is done)."""
    ctx = wire.client("idle") if wire is not None else None
    _, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx,
                                              server_hostname=t.node_id if ctx else None)
    return writer


async def test_connections_not_yet_authenticated_are_bounded_per_address(wire: Pki | None) -> None:
    """Two connections from 127.0.0.1 that never send their handshake unit fill the bound
    per address (injected: 2); a third is closed as the node takes it, counted. Once they
    end, a member connects again (the bound counts only connections not yet
    authenticated)."""
    async with receiver(wire, max_unauthenticated_per_address=2, connect_timeout_s=3600.0) as (t, inbox):
        idle = [await idle_connection(wire, t) for _ in range(2)]
        await until(lambda: t._unauthenticated_total == 2, "two connections accepted")
        before = sample("doq_raft_streams_refused_total", reason="unauthenticated_limit")
        ctx = wire.client("x") if wire is not None else None
        reader, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx,
                                                       server_hostname="b" if ctx else None)
        assert await closed_by_receiver(reader)
        assert sample("doq_raft_streams_refused_total", reason="unauthenticated_limit") == before + 1
        writer.close()
        for w in idle:
            w.close()
        await until(lambda: t._unauthenticated_total == 0, "the idle connections ended")
        _, w = await open_as(wire, t, "a")
        w.write(transport.unit(frame_of("a", "b", 1)))
        await until(lambda: inbox.seqs("a") == [1], "a member's frame")
        w.close()


async def test_connections_not_yet_authenticated_are_bounded_node_wide(pki: Pki) -> None:
    async with receiver(pki, max_unauthenticated=1, connect_timeout_s=3600.0) as (t, _):
        idle = await idle_connection(pki, t)
        await until(lambda: t._unauthenticated_total == 1, "one connection accepted")
        before = sample("doq_raft_streams_refused_total", reason="unauthenticated_limit")
        reader, writer = await asyncio.open_connection("127.0.0.1", t.port, ssl=pki.client("x"),
                                                       server_hostname="b")
        assert await closed_by_receiver(reader)
        assert sample("doq_raft_streams_refused_total", reason="unauthenticated_limit") == before + 1
        writer.close()
        idle.close()


# -- 4. the SSL contexts: the checked bytes, built at reload, a failure keeps the last good --


async def test_contexts_are_built_at_reload_from_the_checked_bytes(pki: Pki) -> None:
    """The reviewer's t8: b's bundle grows (a reload); right after LiveTls read and checked
    the files, its key file on disk becomes another key (a rotation between its renames),
    and stays so. b keeps handshaking with the material it checked: a's frames arrive
    under the new bundle, no build failed. Then a good reload (the bundle without the
    extra CA) switches: the contexts trust the new bundle."""
    live_b = LiveTls(pki.node("b"))
    key_file = live_b.directory / "node.key"

    def rename_race(_material: object) -> None:  # subscribed before the transport's
        key_file.write_bytes(issue_node_cert(pki.ca_cert, pki.ca_key, "b", [])[1])

    live_b.subscribe(rename_race)
    inbox_b = Inbox()
    b = TcpRaftTransport("b", "127.0.0.1:0", inbox_b, tls=live_b)
    a = TcpRaftTransport("a", "127.0.0.1:0", Inbox(), tls=pki.node("a"), backoff_max_s=0.2)
    await b.start()
    await a.start()
    try:
        failures = sample("doq_raft_tls_context_failures_total")
        grown = join_bundle(pki.ca_cert, generate_ca("next")[0])
        (live_b.directory / "ca.crt").write_bytes(grown)
        live_b.reload()
        assert key_file.read_bytes() != live_b.current.node_key  # the files on disk do not hold together
        a.set_peer("b", f"127.0.0.1:{b.port}")
        await keep_sending(a, "b", lambda: bool(inbox_b.messages), "a delivery with the checked material")
        assert sample("doq_raft_tls_context_failures_total") == failures
        assert b._contexts is not None and b._contexts.trusted == grown

        live_b._subscribers.remove(rename_race)
        key_file.write_bytes(live_b.current.node_key)
        (live_b.directory / "ca.crt").write_bytes(pki.ca_cert)
        live_b.reload()
        assert b._contexts.trusted == pki.ca_cert
    finally:
        await a.stop()
        await b.stop()


async def test_a_failed_context_build_keeps_the_last_good_and_is_not_taken_as_done(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload whose contexts cannot be built (forced) is counted and logged; b keeps the
    previous contexts, and a's connection, opened under them, is not closed as if the
    trust had changed: frames keep arriving on it. The next reload builds again and
    switches."""
    live_b = LiveTls(pki.node("b"))
    inbox_b = Inbox()
    b = TcpRaftTransport("b", "127.0.0.1:0", inbox_b, tls=live_b)
    a = TcpRaftTransport("a", "127.0.0.1:0", Inbox(), tls=pki.node("a"), backoff_max_s=0.2)
    await b.start()
    await a.start()
    try:
        a.set_peer("b", f"127.0.0.1:{b.port}")
        await keep_sending(a, "b", lambda: bool(inbox_b.messages), "a first delivery")
        real = transport.peer_server_context

        def broken(_material: object) -> ssl.SSLContext:
            raise ssl.SSLError("forced")

        monkeypatch.setattr(transport, "peer_server_context", broken)
        failures = sample("doq_raft_tls_context_failures_total")
        grown = join_bundle(pki.ca_cert, generate_ca("next")[0])
        (live_b.directory / "ca.crt").write_bytes(grown)
        live_b.reload()
        assert sample("doq_raft_tls_context_failures_total") == failures + 1
        assert b._contexts is not None and b._contexts.trusted == pki.ca_cert
        n = len(inbox_b.messages)
        await keep_sending(a, "b", lambda: len(inbox_b.messages) >= n + 20, "frames on the same connection")
        assert a.peer_stats("b").handshakes == 1

        monkeypatch.setattr(transport, "peer_server_context", real)
        live_b.reload()
        assert b._contexts.trusted == grown
        await keep_sending(a, "b", lambda: a.peer_stats("b").handshakes == 2, "a handshake under the new bundle")
    finally:
        await a.stop()
        await b.stop()


# -- 7. stop() ends connections in their TLS handshake, without a traceback ------------------


async def test_stop_ends_every_inbound_connection_without_a_traceback(
        pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """Open at stop: a connection past TLS that never sends its handshake unit (its bound
    is an hour), an authenticated one idle, one in the middle of a frame. stop() closes
    all three and nothing logs a traceback or a CancelledError."""
    caplog.set_level(logging.DEBUG)
    t = make(pki, "b", "127.0.0.1:0", Inbox(), connect_timeout_s=3600.0)
    await t.start()
    r0, w0 = await asyncio.open_connection("127.0.0.1", t.port, ssl=pki.client("z"), server_hostname="b")
    r1, w1 = await open_as(pki, t, "a")
    r2, w2 = await open_as(pki, t, "c")
    w2.write(struct.pack(">I", 2 * MiB) + b"\0" * 1000)
    await until(lambda: len(t._inbound) == 3, "three connections")
    await t.stop()
    for r in (r0, r1, r2):
        assert await closed_by_receiver(r)
    for _ in range(5):
        await asyncio.sleep(0)
    for w in (w0, w1, w2):
        w.close()
    assert "Traceback" not in caplog.text and "CancelledError" not in caplog.text


def test_a_tls_hello_sent_at_once_is_taken_on_uvloop(tmp_path: Path) -> None:
    """The node runs on uvloop: a TLS opener that sends its ClientHello at once (as every
    client does) is served, 30 times in a row (a plain accept that started TLS per
    connection lost a ClientHello read before it, about half the time)."""
    import uvloop

    async def run() -> int:
        pki = Pki(tmp_path)
        inbox = Inbox()
        t = make(pki, "b", "127.0.0.1:0", inbox)
        await t.start()
        try:
            ctx = pki.client("a")
            for i in range(30):
                await asyncio.to_thread(send_frame, f"127.0.0.1:{t.port}", stream_from="a", to="b",
                                        messages=[msg("a", "b", i)], ssl_context=ctx)
            return len(inbox.messages)
        finally:
            await t.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(run()) == 30
