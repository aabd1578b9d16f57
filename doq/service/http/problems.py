"""`application/problem+json` (RFC 9457) for every error the gateway returns.

Domain errors take their status from `doq.errors.STATUS_TABLE`; request validation
errors become 400, unknown paths 404, wrong methods 405, oversized bodies 413, and an
unexpected exception a 500 problem (logged) rather than a bare traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from doq.errors import DoqError, status_of

PROBLEM_JSON = "application/problem+json"
_GENERIC_REASON = {
    400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 406: "NOT_ACCEPTABLE",
    413: "TOO_LARGE", 415: "UNSUPPORTED_MEDIA_TYPE", 500: "INTERNAL",
}
_TITLES = {
    400: "Invalid argument", 404: "Not found", 405: "Method not allowed", 406: "Not acceptable",
    413: "Too large", 415: "Unsupported media type", 500: "Internal error",
}


class BadRequest(DoqError):
    """A request the gateway refuses before calling the service (status chosen per case)."""

    kind = "invalid_argument"
    default_reason = "INVALID_ARGUMENT"

    def __init__(
        self, message: str, *, status: int = 400, reason: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message, reason=reason or _GENERIC_REASON.get(status, "INVALID_ARGUMENT"))
        self.status = status
        self.errors = errors


def problem_dict(err: DoqError, instance: str | None = None) -> dict[str, Any]:
    """The problem object of a domain error."""
    if isinstance(err, BadRequest):
        status, title = err.status, _TITLES.get(err.status, "Bad request")
    else:
        row = status_of(err)
        status, title = row.http_status, row.title
    doc: dict[str, Any] = {
        "type": f"urn:doq:problem:{err.reason}",
        "title": title,
        "status": status,
        "detail": err.message,
        "reason": err.reason,
        "retryable": err.retryable,
        "leader_hint": err.leader_hint,
    }
    if instance is not None:
        doc["instance"] = instance
    if isinstance(err, BadRequest) and err.errors:
        doc["errors"] = err.errors
    return doc


def problem_response(err: DoqError, instance: str | None = None, headers: dict[str, str] | None = None) -> Response:
    doc = problem_dict(err, instance)
    hdrs = dict(headers or {})
    if err.retryable and doc["status"] in (429, 503):
        hdrs.setdefault("Retry-After", "1")
    return Response(to_json(doc), status_code=doc["status"], media_type=PROBLEM_JSON, headers=hdrs)


def _loc(loc: Sequence[Any]) -> list[str | int]:
    return [x if isinstance(x, int) else str(x) for x in loc]


def from_validation_errors(errors: Sequence[Any], prefix: tuple[str, ...] = ()) -> BadRequest:
    """A 400 BadRequest listing pydantic/FastAPI field errors, with a readable detail."""
    items = [
        {"loc": _loc((*prefix, *e.get("loc", ()))), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in errors
    ]
    if any(e["type"] == "json_invalid" for e in items):
        bad = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = bad.get("ctx") or {}
        return BadRequest(f"malformed JSON body: {ctx.get('error', bad.get('msg', ''))}", reason="MALFORMED_JSON",
                          errors=items)
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}" for e in items[:5]]
    more = f" (and {len(items) - 5} more)" if len(items) > 5 else ""
    return BadRequest("invalid request: " + "; ".join(parts) + more, reason="INVALID_REQUEST", errors=items)


def allowed_methods(request: Request) -> str:
    """The `Allow` header of a 405: the methods of every route of the app whose path matches
    (Starlette's own lists only the first such route's), HEAD with GET."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install_handlers(app: FastAPI) -> None:
    """Make every error of the app a problem+json response."""

    async def on_doq_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DoqError)
        return problem_response(exc, request.url.path)

    async def on_request_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return problem_response(from_validation_errors(exc.errors()), request.url.path)

    async def on_pydantic(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ValidationError)
        return problem_response(from_validation_errors(exc.errors(), ("body",)), request.url.path)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        if status == 404:
            detail = f"no such path: {request.method} {request.url.path} (see /docs)"
        elif status == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        else:
            detail = str(exc.detail)
        headers = dict(exc.headers or {})
        if status == 405:
            headers["Allow"] = allowed_methods(request)
        return problem_response(BadRequest(detail, status=status), request.url.path, headers)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response is sent, so the server logs the traceback.
        err = DoqError(f"internal error: {type(exc).__name__}")
        return problem_response(err, request.url.path)

    app.add_exception_handler(DoqError, on_doq_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(ValidationError, on_pydantic)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
