"""Reading JSON request bodies cheaply, and documenting them and the error responses.

Handlers take the raw `Request` and parse with `Model.model_validate_json` (one pass in
Rust, strict types; a number of integral value written with a fraction, `24129.0`, is an
integer as JSON Schema says, read exactly on a second pass only for a body the first
refused); `body_doc(Model)` declares the same model as the operation's
request body in the OpenAPI document, and `errors(...)` declares problem+json answers.
"""

from __future__ import annotations

import decimal
import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from doq.service.http.problems import PROBLEM_JSON, BadRequest

M = TypeVar("M", bound=BaseModel)
_HUGE = decimal.Decimal(2) ** 128  # an integral number beyond it stays a float (and is refused)

# Every model used as a request body; `docs.build_openapi` adds them to the components.
BODY_MODELS: dict[str, type[BaseModel]] = {}

_JSON_TYPES = ("application/json", "application/x-www-form-urlencoded")  # the latter: curl -d default


async def read_json(request: Request, model: type[M], *, required: bool = True) -> M:
    """Parse the body as `model`; an empty optional body gives the model's defaults."""
    body = await request.body()
    ctype = request.headers.get("content-type")
    if ctype:
        base = ctype.split(";", 1)[0].strip().lower()
        if base not in _JSON_TYPES and not base.endswith("+json"):
            raise BadRequest(f"expected a JSON body (Content-Type: application/json), got {base!r}",
                             status=415, reason="UNSUPPORTED_MEDIA_TYPE")
    if not body.strip():
        if required:
            raise BadRequest("a JSON body is required", reason="MISSING_BODY")
        return model()
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        if not any(isinstance(x := err.get("input"), float) and x.is_integer() for err in e.errors()):
            raise
        again = _integral_floats_as_ints(body)  # JSON Schema's integers include 24129.0
        if again is None:
            raise
        return model.model_validate_json(again)


def _integral_floats_as_ints(body: bytes) -> bytes | None:
    """`body` with every number written with a fraction or exponent but of integral value
    (`24129.0`, `1e3`) written as an integer, read exactly (no float rounding); None if
    there is none or the body is not JSON. Only called for a body strict validation refused
    (the fast path never pays for it)."""
    found = False

    def number(text: str) -> object:
        nonlocal found
        d = decimal.Decimal(text)
        if d.is_finite() and d == d.to_integral_value() and abs(d) < _HUGE:
            found = True
            return int(d)
        return float(text)

    try:
        doc = json.loads(body, parse_float=number)
    except ValueError:
        return None
    return json.dumps(doc).encode() if found else None


def operation_id(route: APIRoute) -> str:
    """OpenAPI operationId: the handler's name (create_queue, enqueue, dequeue, ack, ...)."""
    return route.name


def body_doc(model: type[BaseModel], *, required: bool = True, description: str | None = None) -> dict[str, Any]:
    """`openapi_extra` declaring `model` as the JSON request body."""
    BODY_MODELS[model.__name__] = model
    doc: dict[str, Any] = {
        "required": required,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
    }
    if description:
        doc["description"] = description
    return {"requestBody": doc}


_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, wrong types, unknown fields or invalid values.",
    401: "No valid key: send `Authorization: Bearer KEY` (reason KEY_REQUIRED / INVALID_KEY).",
    403: "The key lacks the scope this call needs, or its queue prefix excludes the queue.",
    404: "No such queue or message (reason QUEUE_NOT_FOUND / MESSAGE_NOT_FOUND).",
    409: "Conflict: the queue exists, the message is not in flight, or the lease is stale.",
    413: "The request body or the message is too large.",
    415: "The body is not JSON.",
    429: "Overloaded: too many commands waiting for commit; retry later.",
    507: "A storage alarm (DATA_SIZE_LIMIT, DISK_FREE_LIMIT or NOSPACE): a node is short of space and "
         "refuses writes that grow the state until space is freed; reads, dequeues, acks and deletes "
         "still work; retryable.",
    503: "Unavailable: not applied (NOT_LEADER, SHUTTING_DOWN, ...; see leader_hint; retryable: true) or "
         "its outcome unknown (OUTCOME_UNKNOWN; retryable: false: repeat only with a dedup_id or lease id).",
}


def errors(*statuses: int, notes: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for problem+json answers (401, 403, 429, 503 are always added);
    `notes` replaces the generic description of a status for this operation."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, 401, 403, 429, 503}):
        out[status] = {
            "description": (notes or {}).get(status) or _DESCRIPTIONS.get(status, "Error"),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return out
