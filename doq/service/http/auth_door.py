"""The HTTP side of the client door: two ASGI middlewares over the one table.

`AuthMiddleware` (outermost but the body limit): matches the request to its route (the
app's own routes, hot ones first), looks the route's (method, path template) up in
`doq.auth.table.HTTP_RULES`, and checks `Authorization: Bearer KEY` once per request:
401 problem+json (with `WWW-Authenticate: Bearer`) without a valid key, 403 without the
scope or for a queue outside the key's prefix (the `{name}` path parameter). Requests a
follower relays to the leader carry the header on, and the leader checks it again. A
path no route matches goes on (404/405 from the app); Swagger UI's assets are open.

The principal of an admitted request is put in `current_principal` for the request (the
service filters queue listings by the key's prefixes with it).

`AuditMiddleware` (inside the follower forwarding, so only requests this node serves
itself): logs and counts the admin actions (`doq.auth.audit`) with their status.

On a node that requires no key, a request without `Authorization` passes the auth check
untouched (no route matching).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from doq.auth import audit
from doq.auth.authorizer import Authorizer, current_principal
from doq.auth.table import HTTP_RULES, OPEN_PATH_PREFIXES, UNLISTED, Rule
from doq.errors import DoqError
from doq.service.http.problems import problem_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_AUTHORIZATION = b"authorization"
KEY_ID_SCOPE = "doq.key_id"
"""ASGI scope entry AuthMiddleware sets: the caller's key id ("" anonymous)."""


class RouteRules:
    """(method, path) -> (rule, path parameters) over the app's routes (their order)."""

    def __init__(self, routes: Sequence[Any]) -> None:
        self._routes = routes
        self._compiled: list[tuple[frozenset[str], re.Pattern[str], Rule]] | None = None

    def _compile(self) -> list[tuple[frozenset[str], re.Pattern[str], Rule]]:
        out = []
        for r in self._routes:
            methods, regex = getattr(r, "methods", None), getattr(r, "path_regex", None)
            if methods and regex is not None:
                ms = frozenset(methods)
                for m in ms:
                    if m != "HEAD":
                        # keyed by the documented path (`{group}`, not `{group:path}`)
                        path = getattr(r, "path_format", r.path)
                        out.append((frozenset((m,)), regex, HTTP_RULES.get((m, path), UNLISTED)))
        return out

    def match(self, method: str, path: str) -> tuple[Rule, dict[str, str]] | None:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._compile()
        if method == "HEAD":
            method = "GET"
        for methods, regex, rule in compiled:
            if method in methods:
                m = regex.match(path)
                if m is not None:
                    return rule, m.groupdict()
        return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v  # type: ignore[no-any-return]
    return None


class AuthMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, authorizer: Authorizer, rules: RouteRules) -> None:
        self.app = app
        self.authz = authorizer
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        authorization = _header(scope, _AUTHORIZATION)
        authz = self.authz
        if authorization is None and not authz.required:
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if path.startswith(OPEN_PATH_PREFIXES):
            return await self.app(scope, receive, send)
        found = self.rules.match(scope["method"], path)
        if found is None or found[0].open:
            return await self.app(scope, receive, send)
        rule, params = found
        try:
            who = authz.authenticate(authorization)
            authz.check_queue(who, rule, params.get(rule.queue) if rule.queue else None)
        except DoqError as e:
            headers = {"WWW-Authenticate": "Bearer"} if e.kind == "unauthenticated" else None
            return await problem_response(e, path, headers)(scope, receive, send)  # type: ignore[arg-type]
        scope[KEY_ID_SCOPE] = who.key_id
        token = current_principal.set(who)  # the service reads the caller's scopes from it
        try:
            await self.app(scope, receive, send)
        finally:
            current_principal.reset(token)


class AuditMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, authorizer: Authorizer, rules: RouteRules, node_id: str) -> None:
        self.app = app
        self.authz = authorizer
        self.rules = rules
        self.node_id = node_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        found = self.rules.match(scope["method"], scope["path"])
        if found is None or not found[0].audit:
            return await self.app(scope, receive, send)
        rule, params = found
        status = [500]
        body: list[bytes] = []
        created = rule.audit in _TARGET_IN_ANSWER  # the target is named in the (small) answer

        async def send_and_see(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif created and message["type"] == "http.response.body":
                body.append(message.get("body", b""))
            await send(message)

        key_id = scope.get(KEY_ID_SCOPE, "")
        target = params.get(rule.queue or "", "") or next(iter(params.values()), "")
        try:
            await self.app(scope, receive, send_and_see)
        finally:
            if created and status[0] < 400:
                target = _target_in_answer(rule.audit, b"".join(body))
            audit.record(rule.audit, key_id, target, "ok" if status[0] < 400 else f"http {status[0]}", self.node_id)


_TARGET_IN_ANSWER: dict[str, Callable[[Any], Any]] = {
    "key.create": lambda doc: doc["id"],  # the new key's id, never the key
    "queue.create": lambda doc: doc["queue"]["name"],
    "leader.transfer": lambda doc: doc["leader_id"],
}


def _target_in_answer(action: str, body: bytes) -> str:
    """The target of an action whose path does not name it, from its JSON answer."""
    try:
        return str(_TARGET_IN_ANSWER[action](json.loads(body)))
    except (ValueError, KeyError, TypeError):
        return ""


def install_audit(app: Any, authorizer: Authorizer, node_id: str) -> None:
    """Add `AuditMiddleware`: call before the follower forwarding is added (so it is inside)."""
    app.add_middleware(AuditMiddleware, authorizer=authorizer, rules=RouteRules(app.router.routes), node_id=node_id)


def install_auth(app: Any, authorizer: Authorizer) -> None:
    """Add `AuthMiddleware`: call after the follower forwarding is added (so it is outside)."""
    app.add_middleware(AuthMiddleware, authorizer=authorizer, rules=RouteRules(app.router.routes))
