"""The HTTP address's answers while a node cannot serve yet (it waits to join a cluster).

A node started with `--join` and an empty store asks the cluster to add it before it
runs its gateway, which can take a while (no leader yet, a replacement waiting for a
quorum). Meanwhile this minimal responder holds its HTTP address, so the others — a
start script's seed deciding whether to bootstrap above all — learn what it is:

- `GET /cluster/identity` → 200, the store's identity (`NodeIdentity`, JSON as
  `doq.node.cluster_wire.identity_to_json`);
- `GET /livez` → 200 (the process works: it is waiting, not stuck);
- `GET /readyz` → 503 `{"ready": false, "leader": false, "leader_hint": "", "reasons": [...]}`;
- anything else → 503 `application/problem+json` (reason `STARTING`, retryable).

HTTP/1.1 with one request per connection (`Connection: close`): probes and the join
client only. `stop()` frees the address for the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from typing import Any

from doq.node.cluster import NodeIdentity
from doq.node.cluster_wire import identity_to_json

log = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 16 * 1024
_READ_TIMEOUT_S = 5.0


class StartupResponder:
    """See the module docstring. `reason` is the readiness reason shown ("joining")."""

    def __init__(self, identity: NodeIdentity, reason: str) -> None:
        self.identity = identity
        self.reason = reason
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> StartupResponder:
        """Listen on host:port (over TLS with `ssl_context`: a secure node speaks HTTPS only);
        raises OSError if the address is taken."""
        self._server = await asyncio.start_server(self._handle, host or None, port, reuse_address=True,
                                                  ssl=ssl_context)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, str, Any]:
        """(status, content type, body) for one request (pure: tested directly)."""
        path = path.split("?", 1)[0]
        if method in ("GET", "HEAD"):
            if path == "/cluster/identity":
                return 200, "application/json", identity_to_json(self.identity)
            if path == "/livez":
                return 200, "application/json", {"status": "ok", "reasons": []}
            if path == "/readyz":
                return 503, "application/json", {"ready": False, "leader": False, "leader_hint": "",
                                                 "reasons": [self.reason]}
        return 503, "application/problem+json", {
            "type": "about:blank", "title": "Service Unavailable", "status": 503,
            "detail": f"node {self.identity.node_id} is starting ({self.reason}); retry later",
            "reason": "STARTING", "retryable": True}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            if len(head) > _MAX_HEAD_BYTES:
                return
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, ctype, body = self.answer(method, path)
            raw = json.dumps(body, separators=(",", ":")).encode()
            reason = {200: "OK", 503: "Service Unavailable"}[status]
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(raw)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (raw if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, OSError):
            pass  # a client that went away or sent no request: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
