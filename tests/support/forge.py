"""Forged Raft peer messages, as an attacker who reaches a node's raft port would send
them (issue 18's "mallory"): one frame on a connection of the node's peer wire
(`doq.node.transport`: plain TCP, or TLS on a secure node)."""

from __future__ import annotations

import socket
import ssl
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from doq_proto.raft.v1 import raft_pb2

from doq.node import transport
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


class PeerRefused(ConnectionError):
    """The raft port did not take the frame. `stage`: "tls" (the opener's TLS handshake
    failed: the receiver's certificate did not verify or name the node meant; with TLS
    1.3 the receiver's verdict on the opener's certificate arrives later) or "handshake"
    (the connection ended before the receiver accepted the handshake unit: a certificate
    the receiver refused, one naming another sender, another receiver, a plaintext
    opener of a secure port)."""

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"{stage}: {detail}")
        self.stage = stage


def peer_context(ca_pem: bytes, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> ssl.SSLContext:
    """A TLS client context for the raft port: verifies the receiver against `ca_pem`
    (its certificate must name the `to` of `send_frame`) and presents `cert_pem` with
    `key_pem` if given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=ca_pem.decode())
    if cert_pem is not None and key_pem is not None:
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d) / "c.pem", Path(d) / "k.pem"
            cert.write_bytes(cert_pem)
            key.write_bytes(key_pem)
            ctx.load_cert_chain(cert, key)
    return ctx


def send_frame(raft_addr: str, *, stream_from: str, to: str, messages: Sequence[Message],
               cluster_ids: Sequence[str] = (), ssl_context: ssl.SSLContext | None = None,
               server_hostname: str | None = None, timeout_s: float = 10.0,
               alarms: Sequence[tuple[str, str]] = ()) -> None:
    """Open a connection to `raft_addr` (TLS with `ssl_context`, checking that the
    receiver's certificate names `server_hostname`, default `to`), send the handshake as
    a member would, one frame, and end the connection; return once the receiver has
    read the frame (it closes its side after the frame). Raises `PeerRefused` if the
    frame was not taken. `alarms`: the storage alarms (reason, message) the frame
    reports for its sender."""
    frame = raft_pb2.Frame(messages=[codec.encode_message(m) for m in messages], cluster_ids=list(cluster_ids),
                           alarms=[raft_pb2.StorageAlarm(reason=r, message=m) for r, m in alarms])
    host, _, port = raft_addr.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw:
        sock: socket.socket = raw
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(raw, server_hostname=server_hostname or to)
            except OSError as e:  # ssl.SSLError included
                raise PeerRefused("tls", repr(e)) from None
        try:
            sock.sendall(transport.hello(stream_from, to))
            answer = _read_unit(sock)
        except ssl.SSLError as e:  # TLS 1.3: the receiver's verdict on our certificate arrives here
            raise PeerRefused("tls", repr(e)) from None
        except OSError as e:
            raise PeerRefused("handshake", repr(e)) from None
        if answer != transport.ACCEPT + to.encode():
            raise PeerRefused("handshake", f"answered {answer[:80]!r}")
        sock.sendall(transport.unit(frame.SerializeToString()))
        _finish(sock)


def _finish(sock: socket.socket) -> None:
    """End our side and wait for the receiver to close its own (after reading the frame)."""
    try:
        if isinstance(sock, ssl.SSLSocket):
            sock = sock.unwrap()  # close_notify: the receiver reads the end of the stream
        else:
            sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
    except (OSError, ValueError):
        pass  # reset: it closed


def _read_unit(sock: socket.socket) -> bytes:
    """One unit of at most `transport.MAX_HELLO_BYTES` (b"" where the stream ended or the
    bytes are not a unit of this wire)."""
    head = _recv_exactly(sock, 4)
    if len(head) < 4:
        return head
    n = int.from_bytes(head, "big")
    if n > transport.MAX_HELLO_BYTES:
        return head
    return _recv_exactly(sock, n)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes, or fewer where the stream ended."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
