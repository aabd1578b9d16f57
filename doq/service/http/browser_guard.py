"""The browser guard of a node that requires no keys (the loopback dev mode, `--insecure`).

Without keys, anything that can send the node an HTTP request may do everything; on a
loopback node that is meant to be "processes of this machine". A web page the user visits
is not one of them, but a browser would carry its requests there: a cross-site form POST
(`/cluster/join` with a remote address copies every message away) or, through DNS
rebinding, a page of another site reading the answers. So, while keys are not required:

- a request whose `Origin` is not the node itself (its `Host`) is refused, and so is one
  a browser marks `Sec-Fetch-Site: cross-site` (older browsers send no `Origin` on a form
  POST); the dashboard's own requests are same-origin and pass;
- on a node whose HTTP address is loopback, a `Host` that is not a loopback name or address
  is refused (DNS rebinding: the attacker's name resolving to 127.0.0.1).

Refusals are 403 problem+json (`CROSS_ORIGIN`, `HOST_NOT_LOCAL`) and change nothing.
Clients that are not browsers (curl, the Python client, `doq`) send neither header and a
loopback `Host`, so the seed's examples work as written. A node that requires keys does not
need this (a browser holds no key) and does not install it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from doq.tls.mode import is_loopback

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _host_name(host_header: str) -> str:
    """The name or address of a `Host` value (`[::1]:8000` -> `::1`, `localhost:80` -> `localhost`)."""
    try:
        return urlsplit("//" + host_header).hostname or ""
    except ValueError:
        return ""


def refusal(headers: dict[bytes, bytes], loopback_http: bool) -> tuple[str, str] | None:
    """(reason, detail) if the request must be refused, else None (pure; see the module)."""
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    origin = headers.get(b"origin", b"").decode("latin-1").strip().lower()
    if loopback_http and host and not is_loopback(_host_name(host)):
        return "HOST_NOT_LOCAL", f"this node answers only loopback names, not Host {host[:100]!r}"
    if origin and origin != "null":
        parts = urlsplit(origin)
        if parts.netloc != host:
            return "CROSS_ORIGIN", "a request from another web origin is refused by a node that requires no keys"
    elif origin == "null" or headers.get(b"sec-fetch-site", b"").lower() == b"cross-site":
        return "CROSS_ORIGIN", "a request from another web origin is refused by a node that requires no keys"
    return None


class BrowserGuard:
    """ASGI middleware applying `refusal` to every HTTP request."""

    def __init__(self, app: ASGIApp, loopback_http: bool) -> None:
        self.app = app
        self.loopback_http = loopback_http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.lower(): v for k, v in scope.get("headers") or ()
                       if k.lower() in (b"host", b"origin", b"sec-fetch-site")}
            refused = refusal(headers, self.loopback_http)
            if refused is not None:
                await _problem(send, scope.get("path", ""), *refused)
                return
        await self.app(scope, receive, send)


async def _problem(send: Send, path: str, reason: str, detail: str) -> None:
    body = json.dumps({"type": f"urn:doq:problem:{reason}", "title": "Forbidden", "status": 403,
                       "detail": detail, "reason": reason, "retryable": False, "leader_hint": "",
                       "instance": path}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/problem+json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
