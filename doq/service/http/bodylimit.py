"""Bounded request bodies: refuse with 413 by Content-Length, or while the body streams in.

The middleware reads the whole body (at most `limit` bytes) BEFORE the app runs and
replays it, so an oversized request never reaches a handler and never changes anything.
Paths in `unbounded` (the multipart restore upload, spooled to disk by the form parser)
are passed through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from doq.service.http.problems import BadRequest, problem_response

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyLimitMiddleware:
    """ASGI middleware: `limit_for(path)` gives the largest body accepted for a path."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int], unbounded: Collection[str] = ()) -> None:
        self.app = app
        self.limit_for = limit_for
        self.unbounded = frozenset(unbounded)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS or scope["path"] in self.unbounded:
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(scope, send, declared, limit, partial=False)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before sending its body: nothing to do
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    await self._too_large(scope, send, size, limit, partial=True)
                    return
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _too_large(scope: Scope, send: Send, size: int, limit: int, *, partial: bool) -> None:
        err = BadRequest(
            f"request body of {'at least ' if partial else ''}{size} bytes exceeds the limit of {limit} bytes "
            f"for {scope['path']}",
            status=413, reason="BODY_TOO_LARGE",
        )
        resp = problem_response(err, scope["path"], {"Connection": "close"})
        await resp(scope, _empty_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}
