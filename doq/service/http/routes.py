"""Queue and message endpoints (`/API/v1/...`): thin translations onto `QueueService`.

Each handler builds the call's `Caller` in one place (`http_caller`), maps the request
to the facade's typed arguments, calls one facade method and maps its result to JSON;
validation beyond the body's shape, limits, metrics and queue semantics are the
service's.

`QueueRoutes` holds one method per operation, each declared with `@route(...)` (path,
documentation, 2xx answer) right above it; `build_router` registers them in declaration
order (the order of the OpenAPI document). Handlers read the raw body
(`bodies.read_json`) and return ready-made JSON `Response`s (no per-request
response-model validation); `response_model=`/`responses=` keep the document precise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from doq.errors import DoqError, InvalidArgument, MessageNotFound, status_of
from doq.queues import limits as L
from doq.queues.model import MessageState
from doq.service.api import MAX_PEEK_LIMIT, MAX_PEEK_WINDOW, batch_item_refused
from doq.service.door import Caller, current_principal
from doq.service.held import require_lease, require_leases
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.http.problems import BadRequest
from doq.service.limits import check_queue_name
from doq.service.paging import MAX_QUEUES_PAGE, PAGE_TOKEN_PATTERN

if TYPE_CHECKING:
    from doq.service.api import QueueService

QueueName = Annotated[
    str,
    Path(
        description=f"The queue name: {L.QUEUE_NAME_RULE}.",
        examples=["user_indexing_queue"],
        json_schema_extra={"pattern": L.QUEUE_NAME_PATTERN, "maxLength": L.MAX_QUEUE_NAME_CHARS},
    ),
]
MessageId = Annotated[
    str,
    Path(
        description="The message id (1..2^64-1, as digits).",
        examples=["123"],
        json_schema_extra={"pattern": m.PATH_ID_PATTERN, "maxLength": 20},
    ),
]
JSON = "application/json"
_ANONYMOUS = Caller("http")


def http_caller(request: Request) -> Caller:
    """The `Caller` of an HTTP request: every handler builds it here, once (the principal
    is what the authentication dependency or middleware put in `current_principal`)."""
    principal = current_principal.get()
    return _ANONYMOUS if principal is None else Caller("http", principal)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(m.dumps(obj), status_code=status, media_type=JSON)


_OK = b'{"success":true}'


def _ok() -> Response:
    return Response(_OK, media_type=JSON)


def _id(raw: str) -> int:
    """A path's message id. Digits beyond 2^64-1 name no message (404, as the pattern
    allows them); anything else that is not 1..2^64-1 is refused INVALID_ID."""
    if raw.isascii() and raw.isdigit() and len(raw) <= 20 and int(raw) > m.UINT64_MAX:
        raise MessageNotFound(f"no message has id {raw} (ids are below 2^64)")
    try:
        return m._coerce_id(raw)
    except ValueError as e:
        raise InvalidArgument(f"invalid message id {raw!r}: {e}", reason="INVALID_ID") from None


@contextlib.asynccontextmanager
async def _client_gone(request: Request, wait_ms: int) -> AsyncIterator[asyncio.Event | None]:
    """For a long poll (`wait_ms` > 0): an event set when the client disconnects (ASGI
    `http.disconnect`), so the poll stops waiting and takes nothing. None otherwise."""
    if wait_ms <= 0:
        yield None
        return
    gone = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass  # the (already read) request body
        gone.set()

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()


def _batch_refused(err: DoqError) -> BadRequest:
    """The whole batch is refused because of the message at `err.loc` (status of `err`: 400 or 413)."""
    return BadRequest(
        err.message, status=status_of(err).http_status, reason=err.reason,
        errors=[{"loc": ["body", *err.loc], "msg": err.message, "type": err.reason}],
    )


F = TypeVar("F", bound=Callable[..., Any])


def route(method: str, path: str, *, answer: str, **options: Any) -> Callable[[F], F]:
    """Declare the method below as the handler of `method path`; `answer` documents its 2xx
    response; `options` are `APIRouter.add_api_route` arguments (tags, responses...)."""

    def mark(handler: F) -> F:
        handler.route = (method, path, {"response_description": answer, **options})  # type: ignore[attr-defined]
        return handler

    return mark


class QueueRoutes:
    """The `/API/v1` handlers over one service facade, one method per operation."""

    def __init__(self, api: QueueService) -> None:
        self.api = api

    # -- queues ---------------------------------------------------------------------------
    @route(
        "POST", "/queues", answer="Created: the new queue.", tags=["queues"], status_code=201,
        response_model=m.QueueResult, summary="Create a queue", responses=errors(400, 409, 413, 415, 507, notes={
            429: "QUEUE_LIMIT_REACHED: the cluster holds --max-queues queues (delete one first), or overloaded"}),
        openapi_extra=body_doc(m.CreateQueueBody),
    )
    async def create_queue(self, request: Request) -> Response:
        """Create a `delayed` (default) or `fair` queue. 409 ALREADY_EXISTS if the name is taken."""
        b = await read_json(request, m.CreateQueueBody)
        q = await self.api.create_queue(b.name, b.type, b.settings.to_domain() if b.settings else None,
                                        caller=http_caller(request))
        return _json({"success": True, "queue": m.queue_dict(q)}, 201)

    @route(
        "GET", "/queues", answer="A page of queues, by name.", tags=["queues"], response_model=m.QueueList,
        summary="List queues", responses=errors(400),
    )
    async def list_queues(
        self,
        request: Request,
        page_token: Annotated[str, Query(
            max_length=L.MAX_QUEUE_NAME_CHARS, pattern=PAGE_TOKEN_PATTERN,
            description="The `next_page_token` of the previous page (none: the first page).")] = "",
        max_results: Annotated[int, Query(ge=1, le=MAX_QUEUES_PAGE, description="At most this many queues "
                                          f"(default {MAX_QUEUES_PAGE}).")] = MAX_QUEUES_PAGE,
    ) -> Response:
        """The queues with their settings and message counts, by name, a page at a time:
        `next_page_token` is null on the last page, else pass it as `page_token`."""
        queues, token = await self.api.list_queues_page(page_token, max_results, caller=http_caller(request))
        return _json({"queues": [m.queue_dict(q) for q in queues], "next_page_token": token or None})

    @route(
        "GET", "/queues/{name}", answer="The queue with its counts.", tags=["queues"],
        response_model=m.QueueModel, summary="Get a queue", responses=errors(400, 404),
    )
    async def get_queue(self, name: QueueName, request: Request) -> Response:
        """A queue's settings and counts (ready, delayed, in flight, dead, total)."""
        return _json(m.queue_dict(await self.api.get_queue(name, caller=http_caller(request))))

    @route(
        "PUT", "/queues/{name}", answer="Updated: the queue with its new settings.", tags=["queues"],
        response_model=m.QueueResult, summary="Update a queue's settings",
        responses=errors(400, 404, 413, 415, 507), openapi_extra=body_doc(m.UpdateQueueBody),
    )
    async def update_queue(self, name: QueueName, request: Request) -> Response:
        """Replace the queue's settings (the type cannot change)."""
        b = await read_json(request, m.UpdateQueueBody)
        q = await self.api.update_queue(name, b.settings.to_domain(), caller=http_caller(request))
        return _json({"success": True, "queue": m.queue_dict(q)})

    @route(
        "DELETE", "/queues/{name}", answer="Deleted, with its messages.", tags=["queues"],
        response_model=m.Success, summary="Delete a queue", responses=errors(400, 404),
    )
    async def delete_queue(self, name: QueueName, request: Request) -> Response:
        """Delete the queue and every message in it."""
        await self.api.delete_queue(name, caller=http_caller(request))
        return _ok()

    @route(
        "POST", "/queues/{name}/purge", answer="Purged: how many messages were removed.", tags=["queues"],
        response_model=m.PurgeResult, summary="Purge a queue", responses=errors(400, 404),
    )
    async def purge_queue(self, name: QueueName, request: Request) -> Response:
        """Remove every message (ready, delayed and in flight); the queue stays."""
        purged = await self.api.purge_queue(name, caller=http_caller(request))
        return _json({"success": True, "purged": purged})

    # -- enqueue --------------------------------------------------------------------------
    @route(
        "POST", "/queues/{name}/messages", answer="Enqueued (durable): the new message's id.",
        tags=["messages"], status_code=201, response_model=m.EnqueueResultModel, summary="Enqueue a message",
        responses={
            200: {"description": "A duplicate (dedup_id seen): the original message's id.",
                  "model": m.EnqueueResultModel},
            **errors(400, 404, 413, 415, 507),
        },
        openapi_extra=body_doc(m.EnqueueBody),
    )
    async def enqueue(self, name: QueueName, request: Request) -> Response:
        """Enqueue one message; answers once it is durable. `id` is a string."""
        b = await read_json(request, m.EnqueueBody)
        res = await self.api.enqueue(name, b.to_item(), caller=http_caller(request))
        return _json(m.enqueue_dict(name, res), 200 if res.duplicate else 201)

    @route(
        "POST", "/queues/{name}/messages:batch", answer="Every message enqueued (durable), one result per message.",
        tags=["messages"], response_model=m.BatchEnqueueResult, summary="Enqueue many messages",
        responses=errors(400, 404, 413, 415, 507), openapi_extra=body_doc(m.EnqueueBatchBody),
    )
    async def enqueue_batch(self, name: QueueName, request: Request) -> Response:
        """Enqueue up to 10000 messages in one commit; one result per message, in order.
        All or nothing: an invalid message refuses the whole batch (400, or 413 for one too
        large; `errors[].loc` names it) and nothing is enqueued; a missing queue is a 404."""
        b = await read_json(request, m.EnqueueBatchBody)
        check_queue_name(name)
        try:
            answered = await self.api.enqueue_many(_batch_items(name, b), caller=http_caller(request))
        except DoqError as e:
            if e.loc:  # one message refused the batch (QueueService.enqueue_many's rule)
                raise _batch_refused(e) from None
            raise
        if answered and isinstance(first := answered[0], DoqError) and all(isinstance(x, DoqError) for x in answered):
            raise first  # a command-level failure (no such queue, not the leader, overload, timeout)
        results: list[dict[str, Any]] = []
        for res in answered:
            if isinstance(res, DoqError):  # not expected after the checks above (kept per item)
                results.append({"success": False, "error": m.item_error(res)})
            else:
                d = m.enqueue_dict(name, res)
                del d["queue_name"]
                results.append(d)
        return _json({"results": results})

    # -- dequeue --------------------------------------------------------------------------
    @route(
        "GET", "/queues/{name}/messages", answer="The delivered message (leased, or removed with ack=true).",
        tags=["messages"], response_model=m.MessageModel, summary="Dequeue a message",
        responses={
            204: {"description": "The queue has no deliverable message (after waiting `wait_ms`). No body."},
            **errors(400, 404),
        },
    )
    async def dequeue(
        self,
        request: Request,
        name: QueueName,
        ack: Annotated[bool, Query(description="true: remove on delivery (at-most-once); false: lease it.")] = False,
        wait_ms: Annotated[int, Query(ge=0, le=L.MAX_WAIT_MS, description="Long poll: wait up to this long.")] = 0,
        visibility_timeout_ms: Annotated[
            int, Query(ge=0, le=L.MAX_VISIBILITY_TIMEOUT_MS, description="Lease length; 0 = the queue's setting.")
        ] = 0,
    ) -> Response:
        """Deliver the next message. Without `ack`, it is leased: ack it (`.../ack`) before
        the visibility timeout or it is delivered again. An empty queue answers **204 No Content**."""
        async with _client_gone(request, wait_ms) as gone:
            got = await self.api.dequeue(name, ack=ack, wait_ms=wait_ms, visibility_timeout_ms=visibility_timeout_ms,
                                         stop_waiting=gone, caller=http_caller(request))
        if not got:
            return Response(status_code=204)
        return _json(m.message_dict(got[0]))

    @route(
        "POST", "/queues/{name}/messages:dequeue", answer="The delivered messages (possibly none).",
        tags=["messages"], response_model=m.MessageList, summary="Dequeue many messages",
        responses=errors(400, 404, 413, 415), openapi_extra=body_doc(m.DequeueBody, required=False),
    )
    async def dequeue_batch(self, name: QueueName, request: Request) -> Response:
        """Deliver up to `max_messages`; an empty queue gives `{"messages": []}`."""
        b = await read_json(request, m.DequeueBody, required=False)
        async with _client_gone(request, b.wait_ms) as gone:
            got = await self.api.dequeue(
                name, max_messages=b.max_messages, ack=b.ack, wait_ms=b.wait_ms,
                visibility_timeout_ms=b.visibility_timeout_ms, stop_waiting=gone, caller=http_caller(request),
            )
        return _json({"messages": [m.message_dict(x) for x in got]})

    # -- looking without taking ----------------------------------------------------------
    @route(
        "GET", "/queues/{name}/messages:peek", answer="A page of messages, in the order they leave their state.",
        tags=["messages"], response_model=m.PeekPage, summary="Browse messages without leasing them",
        responses=errors(400, 404),
    )
    async def peek(
        self,
        request: Request,
        name: QueueName,
        state: Annotated[MessageState, Query(description="ready (in delivery order), delayed (by due time) or "
                                                         "in_flight (by lease expiry).")] = MessageState.READY,
        offset: Annotated[int, Query(ge=0, le=MAX_PEEK_WINDOW - 1, description="Position of the first message.")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PEEK_LIMIT, description="At most this many messages.")] = 20,
    ) -> Response:
        """The messages a dequeue would take next (state=ready), or those waiting for their
        time or in flight, **without leasing them or counting an attempt**. Pages go no deeper than
        position 10000 (a page reaching past it is cut there). `next_offset` is null on the last page."""
        got = await self.api.peek(name, state, offset, limit, caller=http_caller(request))
        more = len(got) == limit and offset + limit < MAX_PEEK_WINDOW
        return _json({"messages": [m.message_dict(x) for x in got], "next_offset": offset + limit if more else None})

    @route(
        "GET", "/queues/{name}/groups", answer="The groups of a fair queue, by name.", tags=["queues"],
        response_model=m.GroupList, summary="A fair queue's groups", responses=errors(400, 404),
    )
    async def groups(
        self,
        request: Request,
        name: QueueName,
        offset: Annotated[int, Query(ge=0, description="Position of the first group (by name).")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000, description="At most this many groups.")] = 100,
    ) -> Response:
        """Each group with a message ready or in flight (or a weight or rate of its own): its
        backlog, its messages in flight, its weight and rate in effect and whether it is
        throttled now (is the round-robin fair?). A delayed queue has no groups: `[]`."""
        stats = await self.api.group_stats(name, caller=http_caller(request))
        page = stats[offset:offset + limit]
        return _json({
            "groups": [m.group_dict(g) for g in page],
            "total": len(stats),
            "next_offset": offset + limit if offset + limit < len(stats) else None,
        })

    # -- one message ----------------------------------------------------------------------
    @route(
        "GET", "/queues/{name}/messages/{id}", answer="The message and its state.", tags=["messages"],
        response_model=m.MessageModel, summary="Get a message", responses=errors(400, 404),
    )
    async def get_message(self, name: QueueName, id: MessageId, request: Request) -> Response:
        """A message and its state, without changing it."""
        return _json(m.message_dict(await self.api.get_message(name, _id(id), caller=http_caller(request))))

    @route(
        "DELETE", "/queues/{name}/messages/{id}", answer="Deleted.", tags=["messages"],
        response_model=m.Success, summary="Delete a message", responses=errors(400, 404, 409),
    )
    async def delete_message(
        self, name: QueueName, id: MessageId, request: Request,
        lease_id: Annotated[str | None, Query(
            pattern=m.ID_PATTERN,
            description="The lease id of the delivery (from the dequeue): needed to delete an in-flight "
                        "message unless the key is an admin; when given, it must be the current delivery's "
                        "(0: none given).",
        )] = None,
    ) -> Response:
        """Remove a message. A message not in flight (ready, delayed) goes in any case; one in
        flight (someone holds it) needs `?lease_id=` of its delivery, or an admin key
        (409 `MESSAGE_IN_FLIGHT` without; 409 `STALE_LEASE` with another delivery's)."""
        # the pattern admits only digits: 0 is "none given"; past 2^64-1 no delivery has it
        lease = min(int(lease_id), m.UINT64_MAX) if lease_id else 0
        await self.api.delete_message(name, _id(id), lease, caller=http_caller(request))
        return _ok()

    @route(
        "POST", "/queues/{name}/messages/{id}/ack", answer="Acked: the message is removed.", tags=["messages"],
        response_model=m.Success, summary="Ack a message", responses=errors(400, 404, 409, 413, 415),
        openapi_extra=body_doc(m.LeaseBody, required=False),
    )
    async def ack(self, name: QueueName, id: MessageId, request: Request) -> Response:
        """Acknowledge an in-flight message (removes it). The body is optional: without a
        `lease_id` (the seed's curl) it settles the message's current delivery, whoever holds it."""
        b = await read_json(request, m.LeaseBody, required=False)
        await self.api.ack(name, _id(id), b.lease_id or 0, caller=http_caller(request))
        return _ok()

    @route(
        "POST", "/queues/{name}/messages/{id}/nack", answer="Returned to the queue.", tags=["messages"],
        response_model=m.Success, summary="Nack a message", responses=errors(400, 404, 409, 413, 415),
        openapi_extra=body_doc(m.NackBody),
    )
    async def nack(self, name: QueueName, id: MessageId, request: Request) -> Response:
        """Return an in-flight message to the queue, optionally after `delay_ms` or with a new priority;
        with `release`, as if it had not been delivered (the attempt is not counted)."""
        b = await read_json(request, m.NackBody, required=False)
        require_lease(b.lease_id or 0)
        await self.api.nack(
            name, _id(id), lease_id=b.lease_id or 0, delay_ms=b.delay_ms, priority=b.priority, release=b.release,
            caller=http_caller(request),
        )
        return _ok()

    @route(
        "POST", "/queues/{name}/messages/{id}/touch", answer="The lease is extended.", tags=["messages"],
        response_model=m.TouchResult, summary="Extend a lease", responses=errors(400, 404, 409, 413, 415),
        openapi_extra=body_doc(m.TouchBody),
    )
    async def touch(self, name: QueueName, id: MessageId, request: Request) -> Response:
        """Renew the lease of an in-flight message (by `visibility_timeout_ms` or the queue's setting)."""
        b = await read_json(request, m.TouchBody, required=False)
        require_lease(b.lease_id or 0)
        until = await self.api.touch(
            name, _id(id), lease_id=b.lease_id or 0, visibility_timeout_ms=b.visibility_timeout_ms,
            caller=http_caller(request),
        )
        return _json({"success": True, "lease_expires_at_ms": until})

    @route(
        "PUT", "/queues/{name}/messages/{id}/priority", answer="The message with its new priority.",
        tags=["messages"], response_model=m.MessageResult, summary="Change a message's priority",
        responses=errors(400, 404, 409, 413, 415), openapi_extra=body_doc(m.PriorityBody),
    )
    async def update_priority(self, name: QueueName, id: MessageId, request: Request) -> Response:
        """Set a new priority (re-orders the message; for delayed queues may delay it)."""
        b = await read_json(request, m.PriorityBody)
        view = await self.api.update_priority(name, _id(id), b.priority, caller=http_caller(request))
        return _json({"success": True, "message": m.message_dict(view)})

    @route(
        "POST", "/queues/{name}/messages:ack", answer="One result per id, in order.", tags=["messages"],
        response_model=m.AckBatchResult, summary="Ack many messages", responses=errors(400, 404, 413, 415),
        openapi_extra=body_doc(m.AckBatchBody),
    )
    async def ack_batch(self, name: QueueName, request: Request) -> Response:
        """Ack up to 10000 messages in one commit; one result per id, in order."""
        b = await read_json(request, m.AckBatchBody)
        require_leases(b.ids, b.lease_ids)
        res = await self.api.ack_many(name, b.ids, b.lease_ids, caller=http_caller(request))
        out = []
        for id_, err in zip(b.ids, res, strict=True):
            if err is None:
                out.append({"id": str(id_), "success": True})
            else:
                out.append({"id": str(id_), "success": False, "error": m.item_error(err)})
        return _json({"results": out})


def _batch_items(name: str, body: m.EnqueueBatchBody) -> list[tuple[str, Any]]:
    """Every message of a batch as an item; one whose content cannot be decoded refuses the
    whole batch (the service checks the rest, by the same rule)."""
    items: list[tuple[str, Any]] = []
    for i, msg in enumerate(body.messages):
        try:
            items.append((name, msg.to_item()))
        except DoqError as e:
            raise batch_item_refused(i, e) from None
    return items


def build_router(api: QueueService) -> APIRouter:
    """All `/API/v1` routes bound to one service facade, in `QueueRoutes` order."""
    r = APIRouter(prefix="/API/v1", generate_unique_id_function=operation_id, route_class=LeanRoute)
    handlers = QueueRoutes(api)
    for name, fn in vars(QueueRoutes).items():
        if hasattr(fn, "route"):
            method, path, options = fn.route
            r.add_api_route(path, getattr(handlers, name), methods=[method], **options)
    return r
