"""Follower forwarding: requests only the leader can decide are relayed to it.

`LeaderForwardMiddleware` (ASGI) sits inside the body limit. On a node that is not the
leader, a request for which `must_lead` holds is sent to the leader's HTTP address (from
the node's `ClusterAdmin.cluster_status()`) and the leader's answer is relayed as it
comes (status, headers, streamed body), with `X-Doq-Leader: <leader HOST:PORT>` added.

- `must_lead`: every write (POST/PUT/PATCH/DELETE) except `POST /db/backup` (any member
  backs up its own state), and the GET dequeue `/API/v1/queues/{name}/messages`. Reads
  are served locally (the node makes them linearizable).
- Served locally instead (the node then answers NOT_LEADER itself if it must): on the
  leader, when no leader is known, and for a request that was already forwarded once
  (header `X-Doq-Forwarded-By`), so two nodes with stale views never bounce a request.
- The leader unreachable (connect or I/O error before its answer started): 503 problem
  LEADER_UNREACHABLE, retryable. Each forwarded request uses its own connection.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11

from doq.errors import DoqError, OutcomeUnknown, Unavailable
from doq.node.cluster_wire import LEADER_HEADER, leader_http_addr
from doq.service.http.cluster import admin_of
from doq.service.http.problems import problem_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FORWARDED_HEADER = "X-Doq-Forwarded-By"
"""Request header set on a forwarded request: the id of the node that forwarded it."""
_DEQUEUE_PATH = re.compile(r"^/API/v1/queues/[^/]+/messages$")
# join-tokens: loopback only (enroll.py); /cluster/tls/*: this node's own TLS files and
# CA key (doq.service.http.tls_routes): no leadership needed
_LOCAL_WRITES = frozenset({"/db/backup", "/cluster/join-tokens", "/cluster/tls/renew", "/cluster/tls/sign",
                           "/cluster/tls/trust", "/cluster/tls/ca/begin", "/cluster/tls/ca/promote",
                           "/cluster/tls/reload"})
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})  # methods that change nothing
_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"expect", b"host",
})
_FORWARDED = FORWARDED_HEADER.lower().encode()
_LEADER = LEADER_HEADER.lower().encode()
_CHUNK = 64 * 1024


def must_lead(method: str, path: str) -> bool:
    """Whether only the leader can answer `method path` (see the module docstring)."""
    if method in ("GET", "HEAD"):
        return _DEQUEUE_PATH.match(path) is not None
    return method != "OPTIONS" and path not in _LOCAL_WRITES


class LeaderForwardMiddleware:
    """See the module docstring. `node` offers `is_leader`, `node_id` and `cluster_status()`."""

    def __init__(self, app: ASGIApp, node: Any, connect_timeout_s: float = 5.0, read_timeout_s: float = 300.0,
                 ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None) -> None:
        self.app = app
        self.node = node
        # a secure node: HTTPS to the leader, verified by the cluster CA (a callable: the
        # context of the node's current trust bundle, doq.tls.live)
        self._ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        ctx = self._ssl_context
        return ctx() if callable(ctx) else ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.node.is_leader or not must_lead(scope["method"], scope["path"]):
            return await self.app(scope, receive, send)
        status = self.node.cluster_status()
        target = leader_http_addr(status)
        if not target or status.leader_id == status.node_id or any(k == _FORWARDED for k, _ in scope["headers"]):
            return await self.app(scope, receive, send)
        await _Forward(scope, receive, send, target, str(status.node_id), self).run()


class _Forward:
    """One request relayed to the leader over its own HTTP/1.1 connection."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, target: str, node_id: str,
                 mw: LeaderForwardMiddleware) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.target, self.node_id, self.mw = target, node_id, mw
        self.started = False
        self.request_sent = False  # some of the request may have reached the leader

    async def run(self) -> None:
        host, _, port = self.target.rpartition(":")
        ctx = self.mw.ssl_context
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx,
                                        server_hostname=host.strip("[]") if ctx else None),
                self.mw.connect_timeout_s)
        except (OSError, ValueError, TimeoutError) as e:
            return await self._unreachable(e)
        conn = h11.Connection(h11.CLIENT)
        try:
            await self._send_request(conn, writer)
            await self._relay_until_client_gone(conn, reader)
        except _ClientGone:
            return
        except (OSError, TimeoutError, h11.ProtocolError, _Closed) as e:
            if self.started:
                raise  # the answer is half sent: the server drops the client connection
            await self._unreachable(e, unknown=self.request_sent and self.scope["method"] not in _SAFE)
        finally:
            writer.close()

    async def _send_request(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        s = self.scope
        headers = [(k, v) for k, v in s["headers"] if k.lower() not in _HOP_BY_HOP]
        if not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"transfer-encoding", b"chunked"))
        headers += [(b"host", self.target.encode()), (b"connection", b"close"),
                    (_FORWARDED, self.node_id.encode())]
        path = s.get("raw_path") or s["path"].encode()
        if s.get("query_string"):
            path += b"?" + s["query_string"]
        self.request_sent = True
        writer.write(conn.send(h11.Request(method=s["method"], target=path, headers=headers)))
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise _ClientGone()
            if body := msg.get("body", b""):
                writer.write(conn.send(h11.Data(data=body)))
                await writer.drain()
            if not msg.get("more_body", False):
                break
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _relay_until_client_gone(self, conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        """Relay the leader's answer; if the client disconnects first, stop and drop the
        upstream connection (closed by `run`), so the leader ends a long poll that would
        otherwise take a message for a client that is gone."""
        relay = asyncio.ensure_future(self._relay_response(conn, reader))
        gone = asyncio.ensure_future(self._client_disconnect())
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not relay.done():
                relay.cancel()
        if not relay.done() or relay.cancelled():
            raise _ClientGone()
        relay.result()

    async def _client_disconnect(self) -> None:
        """Return once the client has disconnected (the request body was read already)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _relay_response(self, conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(_CHUNK), self.mw.read_timeout_s))
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                headers = [(k, v) for k, v in event.headers if k not in _HOP_BY_HOP]
                if not any(k == _LEADER for k, _ in headers):
                    headers.append((_LEADER, self.target.encode()))
                await self.send({"type": "http.response.start", "status": event.status_code, "headers": headers})
                self.started = True
            elif isinstance(event, h11.Data):
                await self.send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            elif isinstance(event, h11.EndOfMessage):
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            else:
                raise _Closed(f"the leader closed the connection ({type(event).__name__})")

    async def _unreachable(self, e: BaseException, *, unknown: bool = False) -> None:
        """Answer 503 LEADER_UNREACHABLE: retryable when the request cannot have reached the
        leader; not retryable (outcome unknown) when a request that changes state may have
        reached it and the answer was lost."""
        hint = self.mw.node.cluster_status().leader_id
        why = f"{type(e).__name__}: {e}"
        err: DoqError = (
            OutcomeUnknown(f"the leader at {self.target} did not answer a request it may have applied: {why}",
                           reason="LEADER_UNREACHABLE", leader_hint=hint) if unknown else
            Unavailable(f"this node is not the leader and the leader at {self.target} did not answer: {why}",
                        reason="LEADER_UNREACHABLE", leader_hint=hint))
        await problem_response(err, self.scope["path"], {LEADER_HEADER: self.target})(
            self.scope, self.receive, self.send)  # type: ignore[arg-type]


class _Closed(Exception):
    """The leader closed the connection before its answer was complete."""


class _ClientGone(Exception):
    """The client disconnected while its request was being sent on."""


def install_leader_forwarding(app: Any, node: Any,
                              ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None) -> None:
    """Add `LeaderForwardMiddleware` to a Starlette/FastAPI `app` when `node` has a
    `ClusterAdmin` (`cluster_admin()`); call it before adding the body limit so the limit
    runs first."""
    if admin_of(node) is not None:
        app.add_middleware(LeaderForwardMiddleware, node=node, ssl_context=ssl_context)
