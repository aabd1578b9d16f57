"""The gRPC side of the client door: two server interceptors over the one table.

`AuthInterceptor` (first in the chain): checks the caller's `authorization: Bearer KEY`
metadata once per call or stream against `doq.auth.table.GRPC_RULES`; refuses with
UNAUTHENTICATED (no valid key) or PERMISSION_DENIED (no scope). A key whose scope is
limited to a queue prefix is checked against the queue each request names (the rule's
field; `str.startswith` over the key's prefixes): once for a unary call, per request
frame of an enqueue stream, the first request of a dequeue stream (which names the queue
for the whole call; the later requests pass through untouched). On a follower that
relays the call to the leader (raw bytes), the queue check is the leader's: it checks the
same key against the same replicated table.

`AuditInterceptor` (after the follower forwarder, so it sees only calls this node serves
itself): logs and counts the admin actions (`doq.auth.audit`).

The principal of an admitted call is put in `current_principal` (the call's own task),
so the service knows the caller's scopes (a prefix key lists only its queues).

Calls of other services (grpc.health.v1, reflection) are open, and bounded (`OpenCalls`:
at most `MAX_OPEN_CALLS` in progress at once). A node that requires no key lets a call
of the doq service without `authorization` through untouched (no wrapper, no cost).

Calls of one key in progress at once are bounded (`KeyCalls`, `--max-calls-per-key`), so
one key cannot hold every call gRPC admits (`--max-calls`) with long polls or streams:
past it a call of that key is refused RESOURCE_EXHAUSTED (`KEY_CALLS_LIMIT`, retryable)
before its request is read. The slot is freed when the call's task ends (the interceptor
runs in the call's own task), so the handler is not wrapped for it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc
from doq_proto.v1 import doq_pb2 as pb

from doq.auth import audit
from doq.auth.authorizer import Authorizer, Principal, current_principal
from doq.auth.table import BATCH_QUEUES, DOQ_SERVICE, GRPC_RULES, UNLISTED, Rule
from doq.errors import DoqError, Overloaded, status_of

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def _authorization(details: grpc.HandlerCallDetails) -> str | bytes | None:
    md: Sequence[Any] = details.invocation_metadata or ()  # type: ignore[attr-defined]
    for k, v in md:
        if k == "authorization":
            return v  # type: ignore[no-any-return]
    return None


def rule_of(method: str) -> Rule | None:
    """The rule of a full method name (None: not the doq service: open)."""
    rule = GRPC_RULES.get(method)
    if rule is None and method.startswith(DOQ_SERVICE):
        return UNLISTED
    return rule


async def abort(context: grpc.aio.ServicerContext, err: DoqError) -> None:
    context.set_trailing_metadata((("doq-reason", err.reason), ("doq-retryable", "true" if err.retryable else "false"),
                                   ("doq-leader", "")))
    await context.abort(grpc.StatusCode[status_of(err).grpc_code], err.message)


def _refusing(err: DoqError) -> grpc.RpcMethodHandler:
    """A handler that ends the call with `err` at once, reading nothing. It takes the
    request as a stream whatever the method's kind (the wire is the same for every kind):
    for a unary method, gRPC would otherwise receive the whole request (up to the message
    limit, 16 MiB by default) before the handler runs, so anyone who reaches the port could
    make the node read and hold that much per call without a key."""
    async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await abort(context, err)
        yield b""  # unreachable: makes this an async generator

    return grpc.stream_stream_rpc_method_handler(refuse)


def _rebuilt(handler: grpc.RpcMethodHandler, behavior: Any) -> grpc.RpcMethodHandler:
    """`handler` with another behavior of the same kind (same (de)serializers)."""
    if handler.request_streaming and handler.response_streaming:
        factory = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        factory = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        factory = grpc.unary_stream_rpc_method_handler
    else:
        factory = grpc.unary_unary_rpc_method_handler
    return factory(behavior, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def _original(handler: grpc.RpcMethodHandler) -> Any:
    return handler.stream_stream or handler.stream_unary or handler.unary_stream or handler.unary_unary


def queues_of(request: Any, field: str) -> Iterable[str]:
    """The queue names a request names through the rule's `field` (empty ones skipped)."""
    if field == BATCH_QUEUES:
        if not request.messages:  # a columns frame (the producers'): one queue
            queue = request.columns.queue_name
            return (queue,) if queue else ()
        names = {m.queue_name for m in request.messages}
        if request.HasField("columns"):
            names.add(request.columns.queue_name)
        names.discard("")
        return names
    queue = getattr(request, field)
    return (queue,) if queue else ()


class _FirstChecked:
    """A request stream whose first request is checked (a dequeue stream: its first
    request names the queue for the whole call); the later ones pass untouched (a plain
    method call each, no coroutine)."""

    __slots__ = ("_check", "_first", "_it")

    def __init__(self, requests: AsyncIterator[Any], check: Callable[[Any], Awaitable[None]]) -> None:
        self._it = requests.__aiter__()
        self._check = check
        self._first = True

    def __aiter__(self) -> _FirstChecked:
        return self

    def __anext__(self) -> Awaitable[Any]:
        if self._first:
            self._first = False
            return self._checked_first()
        return self._it.__anext__()

    async def _checked_first(self) -> Any:
        r = await self._it.__anext__()
        await self._check(r)
        return r


def _queue_checked(handler: grpc.RpcMethodHandler, authz: Authorizer, who: Principal, rule: Rule) -> grpc.RpcMethodHandler:
    """`handler` checking the queue each request names against `who`'s prefixes: each
    request of a unary call or enqueue stream, the first of a dequeue stream."""
    field = rule.queue
    inner = _original(handler)
    prefixes = who.prefixes(rule)

    def refused(request: Any) -> str | None:
        """The first queue of `request` outside the key's prefixes (None: all allowed)."""
        for queue in queues_of(request, field):
            if not queue.startswith(prefixes):
                return queue
        return None

    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        if (queue := refused(request)) is not None:
            await abort(context, authz.deny(who, rule, queue))

    if handler.request_streaming:

        async def each_checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for r in requests:
                if (queue := refused(r)) is not None:  # no coroutine per frame unless refused
                    await abort(context, authz.deny(who, rule, queue))
                yield r

        def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if rule.first_request_only:
                return _FirstChecked(requests, lambda r: check(r, context))
            return each_checked(requests, context)

        if handler.response_streaming:
            async def stream_behavior(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for resp in inner(checked(requests, context), context):
                    yield resp
        else:
            async def stream_behavior(requests: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[misc]
                return await inner(checked(requests, context), context)
        return _rebuilt(handler, stream_behavior)

    if handler.response_streaming:
        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(request, context)
            async for resp in inner(request, context):
                yield resp
        return _rebuilt(handler, unary_stream)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(request, context)
        return await inner(request, context)
    return _rebuilt(handler, unary)


MAX_OPEN_CALLS = 16
"""Calls of the services that need no key (health, reflection) in progress at once on a
node: they are probes and tools. Past it a call is refused RESOURCE_EXHAUSTED
(`OPEN_CALLS_LIMIT`) before its request is read."""


class OpenCalls:
    """Bounds the calls of the services that need no key (`MAX_OPEN_CALLS`): without a
    bound, anyone who reaches the port could hold any number of `Health/Watch` or
    reflection streams, or of requests of up to the message limit being received, without
    a key. Each call's handler takes its request as a stream (so gRPC reads nothing before
    the handler runs), takes a slot first (or refuses), and frees it when it ends."""

    def __init__(self, capacity: int = MAX_OPEN_CALLS) -> None:
        self.capacity = capacity
        self.in_progress = 0

    def _take(self) -> bool:
        if self.in_progress >= self.capacity:
            return False
        self.in_progress += 1
        return True

    def _refused(self) -> DoqError:
        return Overloaded(f"too many calls of health or reflection in progress on this node (at most "
                          f"{self.capacity})", reason="OPEN_CALLS_LIMIT")

    def bounded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` (of any kind) as a stream-request handler that holds a slot."""
        inner = _original(handler)
        unary_in, streams_out = not handler.request_streaming, handler.response_streaming
        calls = self

        async def requests_of(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            if not unary_in:
                return requests
            async for r in requests:
                return r
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request")

        if streams_out and inspect.isasyncgenfunction(inner):
            async def gen(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                if not calls._take():
                    await abort(context, calls._refused())
                try:
                    async for r in inner(await requests_of(requests, context), context):
                        yield r
                finally:
                    calls.in_progress -= 1
            behavior: Any = gen
        else:
            async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                if not calls._take():
                    await abort(context, calls._refused())
                try:
                    return await inner(await requests_of(requests, context), context)
                finally:
                    calls.in_progress -= 1
            behavior = call
        factory = grpc.stream_stream_rpc_method_handler if streams_out else grpc.stream_unary_rpc_method_handler
        return factory(behavior, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)


class KeyCalls:
    """Calls in progress per key: at most `capacity` of one key at once (a node without
    keys: its anonymous calls are not counted here; `--max-calls` bounds every call).
    `take` is called from the interceptor, in the call's own task: the slot is given back
    when that task ends, however the call ends (answered, failed, cancelled)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_progress: dict[str, int] = {}

    def take(self, key_id: str) -> DoqError | None:
        """Take a slot of `key_id` for the current call; the refusal if it holds `capacity`."""
        held = self.in_progress.get(key_id, 0)
        if held >= self.capacity:
            return Overloaded(f"key {key_id} has {held} calls in progress on this node, the most one key may "
                              f"(--max-calls-per-key): retry once some end", reason="KEY_CALLS_LIMIT")
        task = asyncio.current_task()
        if task is None:  # not in a call's task: nothing would give the slot back
            return None
        self.in_progress[key_id] = held + 1
        task.add_done_callback(lambda _t: self._release(key_id))
        return None

    def _release(self, key_id: str) -> None:
        held = self.in_progress.pop(key_id) - 1
        if held:
            self.in_progress[key_id] = held


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """See the module docstring. `max_calls_per_key`: `KeyCalls`' bound."""

    def __init__(self, authorizer: Authorizer, max_calls_per_key: int = 1024) -> None:
        self.authz = authorizer
        self.open_calls = OpenCalls()
        self.key_calls = KeyCalls(max_calls_per_key)

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        rule = rule_of(handler_call_details.method)  # type: ignore[attr-defined]
        if rule is None:  # health, reflection: open, and bounded
            handler = await continuation(handler_call_details)
            return None if handler is None else self.open_calls.bounded(handler)
        if rule.open:
            return await continuation(handler_call_details)
        authorization = _authorization(handler_call_details)
        authz = self.authz
        if authorization is None and not authz.required:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        try:
            who = authz.authenticate(authorization)
            authz.check_call(who, rule)
        except DoqError as e:
            return _refusing(e)
        if not who.anonymous and (busy := self.key_calls.take(who.key_id)) is not None:
            return _refusing(busy)
        current_principal.set(who)  # the call's own task: its handler (the service) reads it
        if who.unrestricted(rule) or handler.request_deserializer is None:  # None: relayed as bytes
            return handler
        return _queue_checked(handler, authz, who, rule)


class AuditInterceptor(grpc.aio.ServerInterceptor):
    """See the module docstring. `node_id` names this node in the audit lines."""

    def __init__(self, authorizer: Authorizer, node_id: str) -> None:
        self.authz = authorizer
        self.node_id = node_id

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        rule = rule_of(handler_call_details.method)  # type: ignore[attr-defined]
        if handler is None or rule is None or not rule.audit or handler.request_streaming or handler.response_streaming:
            return handler
        try:
            key_id = self.authz.authenticate(_authorization(handler_call_details)).key_id
        except DoqError:
            return handler  # refused by AuthInterceptor already
        inner = _original(handler)
        action, field, node_id = rule.audit, rule.queue, self.node_id

        async def audited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            target = ",".join(sorted(queues_of(request, field))) if field else str(getattr(request, "id", ""))
            try:
                response = await inner(request, context)
            except BaseException:
                code = context.code()
                audit.record(action, key_id, target, code.name if isinstance(code, grpc.StatusCode) else "error",
                             node_id)
                raise
            if isinstance(response, pb.CreateKeyResponse):
                target = response.key_info.id  # the new key's id (never the key)
            audit.record(action, key_id, target, "ok", node_id)
            return response
        return _rebuilt(handler, audited)
