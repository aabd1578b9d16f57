"""Bounded request bodies: refuse with 413 by Content-Length, or while the body streams in.

The middleware reads the whole body (at most `limit` bytes) BEFORE the app runs and
replays it, so an oversized request never reaches a handler and never changes anything.
Paths in `streamed` (the multipart restore upload, which the form parser spools to disk
as it arrives) are not buffered: a declared Content-Length over their limit is refused at
once, before a byte of the body is read, and a body that grows past it is cut there (the
app's next read fails, its answer is replaced by the 413; nothing was restored, since a
restore starts only once the whole upload is in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from doq.service.http.problems import BadRequest, problem_response

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyLimitMiddleware:
    """ASGI middleware: `limit_for(path)` gives the largest body accepted for a path."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int],
                 streamed: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.limit_for = limit_for
        self.streamed = dict(streamed or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        streamed = path in self.streamed
        limit = self.streamed[path] if streamed else self.limit_for(path)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._too_large(scope, send, declared, limit, partial=False)
            return
        if streamed:
            await self._stream(scope, receive, send, limit)
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

    async def _stream(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Pass the body through as it arrives, cut at `limit` bytes (see the module doc)."""
        size = 0
        cut = False
        started = False

        async def counted() -> Message:
            nonlocal size, cut
            if cut:
                return {"type": "http.disconnect"}
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                cut = True
                raise _Cut()
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if cut:
                return  # the 413 below answers instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _Cut:
            pass
        except Exception:
            if not cut:
                raise
        if cut and not started:
            await self._too_large(scope, send, size, limit, partial=True)

    @staticmethod
    async def _too_large(scope: Scope, send: Send, size: int, limit: int, *, partial: bool) -> None:
        err = BadRequest(
            f"request body of {'at least ' if partial else ''}{size} bytes exceeds the limit of {limit} bytes "
            f"for {scope['path']}",
            status=413, reason="BODY_TOO_LARGE",
        )
        resp = problem_response(err, scope["path"], {"Connection": "close"})
        await resp(scope, _empty_receive, send)


class _Cut(Exception):
    """A streamed body passed its limit."""


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
