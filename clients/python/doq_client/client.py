# Generated from doq_client/aio.py by clients/python/unasync.py: do not edit.
# Edit aio.py, then run `python clients/python/unasync.py`.
# The imports keep the source's order:
# ruff: noqa: I001
"""`DoqClient`: the synchronous client (thread-safe; one `grpc.Channel` per node address).

Every method is one unary call; failures raise `doq_client.errors.DoqClientError`
subclasses.
A call answered through a follower (which relays it to the leader and names the leader in
the answer's initial metadata) moves the client to the leader for the next calls; a call
refused by a follower, or cut off with its node, goes to the leader and is tried again
when that is safe; with `retry=RetryPolicy(...)` other retryable failures are retried too
(`doq_client.retry` says exactly when). Streaming helpers: `producer()` and `consumer()`;
they follow the leader too.

One source for both clients: `doq_client.client` (`DoqClient`) is generated from
`doq_client.aio` by `clients/python/unasync.py` (edit `aio.py`, then run it; `--check`
fails while the generated file is stale). What a call sends and how its answer reads is
`doq_client._ops`; where gRPC's sync and asyncio APIs differ, `doq_client._transport`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import grpc

from doq_client import _handle, _ops, _redrive
from doq_client._auth import resolve_key
from doq_client._redrive import RedriveTask
from doq_client._routing import Router, parse_targets
from doq_client._transport import CHANNEL_OPTIONS as CHANNEL_OPTIONS
from doq_client._transport import (
    DEFAULT_TARGET,
    LIST_SERVERS_TIMEOUT_S,
    SyncChannel,
    checked,
    given_channel_sync,
    initial_metadata,
    tls_credentials,
    unary_sync,
)
from doq_client._transport import open_channel_sync as _open_channel
from doq_client._worker_core import worker_options
from doq_client.consumer import Consumer
from doq_client.producer import Producer
from doq_client.worker import Handler, Worker
from doq_client.errors import DoqClientError, from_rpc_error
from doq_client.retry import NO_RETRY, Attempts, FailoverPolicy, RetryPolicy, is_failover
from doq_client.types import (
    AckResult,
    Content,
    EnqueueResult,
    GroupInfo,
    Message,
    Queue,
    QueueSettings,
)
from doq_proto.v1 import doq_pb2 as pb

T = TypeVar("T")
log = logging.getLogger(__name__)


class DoqClient:
    """Synchronous doq client; thread-safe.

    `targets`: the nodes' gRPC addresses, ``"HOST:PORT"``, several comma-separated, or a
    list; the first is tried first, and the client remembers the leader once it knows it.
    `channel`: use this channel as the only target instead (it is not closed by
    `close()`); the synchronous client adds the key to a `grpc.Channel`'s calls, the
    asyncio client sends on a `grpc.aio.Channel` what it was made to send (make it with
    `interceptors=doq_client.key_interceptors(key)`). `timeout_s` is the deadline of
    each unary call attempt (None = no deadline; long polls add their `wait_ms`).
    `failover` bounds the search for a leader (default `FailoverPolicy()`: 15 s); `retry`
    enables retries of other retryable errors (see `doq_client.retry`). `ca_file`: connect
    with TLS and verify the nodes' certificates with this CA (PEM; a secure cluster's
    `ca.crt`); None: plain gRPC. `key`: the client key sent with every call and stream
    (default `$DOQ_KEY`; none: for a node that requires no key).
    """

    def __init__(
        self,
        targets: str | Sequence[str] = DEFAULT_TARGET,
        *,
        channel: SyncChannel | None = None,
        timeout_s: float | None = 30.0,
        retry: RetryPolicy | None = None,
        failover: FailoverPolicy | None = None,
        ca_file: str | None = None,
        key: str | None = None,
    ) -> None:
        self._own_channels = channel is None
        self.key = resolve_key(key)
        if channel is None:
            tls = tls_credentials(ca_file)
            self.router: Router[SyncChannel] = Router(
                checked(parse_targets(targets), self.key, tls), lambda addr: _open_channel(addr, tls, self.key))
        else:
            given = given_channel_sync(channel, self.key)
            self.router = Router(["(channel)"], lambda _: given, fixed=True)
        self.timeout_s = timeout_s
        self.retry = retry or NO_RETRY
        self.failover = failover or FailoverPolicy()

    @property
    def channel(self) -> SyncChannel:
        """The channel to the current target (the leader, once known)."""
        return self.router.channel(self.router.current)

    @property
    def stub(self) -> Any:
        """A `DOQStub` on the current target."""
        return self.router.pick()[1]

    def close(self) -> None:
        """Close the channels the client opened (not a `channel` it was given)."""
        opened = self.router.close()
        if self._own_channels:
            for ch in opened:
                ch.close()

    def __enter__(self) -> DoqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, op: _ops.Op[T], extra_timeout_s: float = 0.0) -> T:
        """Send `op` to the current target; follow the leader and retry as `doq_client.retry` says."""
        timeout = None if self.timeout_s is None else self.timeout_s + extra_timeout_s
        tries = Attempts(self.retry, self.failover, op.repeatable)
        while True:
            addr, stub = self.router.pick()
            try:
                response, metadata = unary_sync(stub, op, timeout)
            except grpc.RpcError as e:
                err = from_rpc_error(e)
                if tries.unknown and err.reason in op.gone:
                    return cast(T, None)
                if not is_failover(err):
                    self.router.follow(addr, initial_metadata(e))
                hinted = self._redirect(err, addr) if is_failover(err) else False
                delay = tries.next_delay(err, hinted)
                if delay is None:
                    raise err from None
                time.sleep(delay)
                continue
            self.router.follow(addr, metadata)
            value = op.convert(response)
            return op.repeat(value) if tries.unknown and op.repeat else value

    def _redirect(self, err: DoqClientError, failed: str) -> bool:
        """After a failover error from `failed`: move to the leader (see `Router.moved`);
        when the error names the leader by id only, ask `failed` (alive: it answered) for
        the members' addresses first. True if the new target is a named leader."""
        if err.leader_hint and not err.leader_addr and not self.router.knows(err.leader_hint):
            try:
                self.router.learn(
                    self.router.stub(failed).ListServers(
                        pb.ListServersRequest(), timeout=LIST_SERVERS_TIMEOUT_S
                    )
                )
            except grpc.RpcError as e:
                log.debug("ListServers on %s failed: %s", failed, e)
        return self.router.moved(err, failed)

    # -- queues -----------------------------------------------------------------------
    def create_queue(
        self, name: str, type: str = "delayed", settings: QueueSettings | None = None
    ) -> Queue:
        """Create a queue ("delayed" or "fair"); raises AlreadyExists if it exists."""
        return self._call(_ops.create_queue(name, type, settings))

    def update_queue(self, name: str, settings: QueueSettings) -> Queue:
        """Replace a queue's settings."""
        return self._call(_ops.update_queue(name, settings))

    def create_key(self, scopes: Sequence[str]) -> dict[str, Any]:
        """A new client key (admin): {"id", "key", "scopes", "created_ms"}; "key" is shown only here."""
        return self._call(_ops.create_key(scopes))

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key's {"id", "scopes", "created_ms"} (admin; never the key itself)."""
        return self._call(_ops.list_keys())

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key (admin): every node refuses it from then on."""
        self._call(_ops.revoke_key(key_id))

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages; raises NotFound if it does not exist."""
        self._call(_ops.delete_queue(name))

    def get_queue(self, name: str) -> Queue:
        """A queue with its current counts."""
        return self._call(_ops.get_queue(name))

    def list_queues(self) -> list[Queue]:
        """Every queue, by name: follows the pages of `list_queues_page` to the last."""
        out: list[Queue] = []
        token = ""
        while True:
            page, token = self.list_queues_page(token)
            out += page
            if not token:
                return out

    def list_queues_page(self, page_token: str = "", max_results: int = 0) -> tuple[list[Queue], str]:
        """One page of queues by name: at most `max_results` (0: the node's default, 1000;
        at most 1000) after `page_token`; returns (queues, the next page's token, "" on the
        last page)."""
        return self._call(_ops.list_queues_page(page_token, max_results))

    def set_group_policy(
        self, queue: str, group: str, weight: int | None = None, *, max_per_second: int | None = None
    ) -> GroupInfo:
        """Give one group of a fair queue its own `weight` (1..10000 deliveries per turn of
        the round-robin) and/or `max_per_second` (0 = no limit); None keeps that one. A
        delayed queue: FailedPrecondition (NOT_FAIR_QUEUE)."""
        return self._call(_ops.set_group_policy(queue, group, weight, max_per_second, False))

    def reset_group(self, queue: str, group: str) -> GroupInfo:
        """Drop a group's own weight and rate: the queue's defaults apply again."""
        return self._call(_ops.set_group_policy(queue, group, None, None, True))

    def list_groups(self, queue: str) -> list[GroupInfo]:
        """A fair queue's groups (with a message ready or in flight, or a policy of their
        own), by name, with their weight, rate and throttling ([] for a delayed queue)."""
        return self._call(_ops.list_groups(queue))

    def purge_queue(self, name: str) -> int:
        """Remove every message of a queue; returns how many were removed."""
        return self._call(_ops.purge_queue(name))

    # -- redrive ----------------------------------------------------------------------
    def redrive(self, queue: str, *, to: str = "", max_per_second: int = 0) -> RedriveTask:
        """Start moving the messages of the dead-letter queue `queue` back to `to` (default:
        the queue whose dead_letter_queue names it), at most `max_per_second` (0: no
        limit), as a task the cluster runs (it survives a failover). Moved messages keep
        content, group, metadata, priority and dedup id; their attempt count restarts at
        0. Raises FailedPrecondition (REDRIVE_RUNNING) while one runs on `queue`."""
        return self._call(_redrive.start(queue, to, max_per_second))

    def get_redrive(self, queue: str) -> RedriveTask:
        """The last redrive started on `queue`, with its progress (NotFound
        REDRIVE_NOT_FOUND if none)."""
        return self._call(_redrive.get(queue))

    def cancel_redrive(self, queue: str) -> RedriveTask:
        """Stop `queue`'s running redrive (messages moved stay moved); an ended one is
        returned as it is."""
        return self._call(_redrive.cancel(queue))

    # -- messages ---------------------------------------------------------------------
    def enqueue(
        self,
        queue: str,
        content: Content,
        *,
        group: str = "",
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        dedup_id: str = "",
        delay_ms: int = 0,
    ) -> EnqueueResult:
        """Store one message (durably) and return its id.

        `str` content is sent as UTF-8. With `dedup_id`, a repeat within the queue's dedup
        window returns the original id with `duplicate=True` (safe to retry).
        """
        return self._call(
            _ops.enqueue(queue, content, group, priority, metadata, dedup_id, delay_ms)
        )

    def enqueue_batch(
        self, requests: Iterable[pb.EnqueueRequest]
    ) -> list[EnqueueResult | DoqClientError]:
        """Enqueue many messages in one call (build them with `doq_client.enqueue_request`).

        All or nothing: one invalid message raises its error (`InvalidArgument` or
        `TooLarge`, naming `messages[i]`) and nothing is enqueued. Otherwise one result
        per request, in order; a queue's command-level failure (e.g. `QueueNotFound`) is
        the result of each of that queue's messages (other queues' messages are stored).
        """
        return self._call(_ops.enqueue_batch(requests))

    def dequeue(
        self,
        queue: str,
        *,
        ack: bool = False,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_timeout_ms: int = 0,
    ) -> list[Message]:
        """Lease up to `max_messages` (or with `ack=True`, remove them on delivery).

        Waits up to `wait_ms` for a message (long poll); returns [] if none came.
        """
        op = _ops.dequeue(queue, ack, max_messages, wait_ms, visibility_timeout_ms)
        return self._call(op, wait_ms / 1000)

    def get(self, queue: str, id: int) -> Message:
        """One message by id (any state); raises NotFound."""
        return self._call(_ops.get(queue, id))

    def peek(self, queue: str, limit: int = 20, *, state: str = "ready", offset: int = 0) -> list[Message]:
        """Look at up to `limit` (1..100) messages in `state` without taking them: "ready"
        (the order the next dequeues take them), "delayed" (by due time) or "in_flight" (by
        lease expiry), from position `offset` on (pages go no deeper than 10000). Nothing
        is leased and no attempt counted."""
        return self._call(_ops.peek(queue, state, offset, limit))

    def delete(self, queue: str, id: int, lease_id: int = 0) -> None:
        """Delete one message by id. A message in flight (delivered, not settled) needs the
        delivery's `lease_id` unless the key is an admin (FailedPrecondition
        MESSAGE_IN_FLIGHT); a `lease_id` must be the current delivery's (StaleLease)."""
        self._call(_ops.delete(queue, id, lease_id))

    def ack(self, queue: str, id: int, lease_id: int = 0) -> None:
        """Acknowledge (remove) a leased message; with `lease_id`, only that delivery's lease."""
        self._call(_ops.ack(queue, id, lease_id))

    def ack_batch(
        self, queue: str, ids: Sequence[int], lease_ids: Sequence[int] = ()
    ) -> list[AckResult]:
        """Acknowledge many leased messages; one result per id, in order.

        `lease_ids`: empty, or one per id (0 = any lease); else InvalidArgument.
        """
        return self._call(_ops.ack_batch(queue, ids, lease_ids))

    def nack(
        self,
        queue: str,
        id: int,
        *,
        lease_id: int = 0,
        delay_ms: int = 0,
        priority: int | None = None,
        release: bool = False,
    ) -> None:
        """Return a leased message to the queue, after `delay_ms`, optionally re-prioritised.

        `release=True` undoes the delivery instead: the attempt is not counted and the
        message is ready at once (no `delay_ms`, no `priority`).
        """
        self._call(_ops.nack(queue, id, lease_id, delay_ms, priority, release))

    def touch(
        self, queue: str, id: int, *, lease_id: int = 0, visibility_timeout_ms: int = 0
    ) -> int:
        """Extend a lease (by `visibility_timeout_ms` or the queue's); returns the new expiry (Unix ms)."""
        return self._call(_ops.touch(queue, id, lease_id, visibility_timeout_ms))

    def update_priority(self, queue: str, id: int, priority: int) -> Message:
        """Change a message's priority; returns the updated message."""
        return self._call(_ops.update_priority(queue, id, priority))

    # -- streams ----------------------------------------------------------------------
    def producer(
        self, *, window: int = 1024, batch: int | None = None, auto_dedup: bool = True, **kw: Any
    ) -> Producer:
        """A pipelined producer that follows this client's leader and coalesces messages into
        frames (`batch=0`: one message per frame; see `doq_client.producer`)."""
        return Producer(self, window=window, batch=batch, auto_dedup=auto_dedup, **kw)

    def consumer(self, queue: str, **kw: Any) -> Consumer:
        """A prefetching consumer that follows this client's leader (see `doq_client.consumer`)."""
        return Consumer(self, queue, **kw)

    @overload
    def worker(self, queue: str, handler: Handler, /, *, concurrency: int = 1, **options: Any) -> Worker: ...
    @overload
    def worker(self, queue: str, /, *, concurrency: int = 1, **options: Any) -> Callable[[Handler], Worker]: ...

    def worker(self, queue: str, handler: Handler | None = None, /, *, concurrency: int = 1,
               **options: Any) -> Worker | Callable[[Handler], Worker]:
        """A worker (`Worker`) running `handler` on `queue`'s messages, at most
        `concurrency` at once, its leases extended while it runs, nacked with backoff when
        it raises (see `doq_client.worker`); without `handler`, a decorator that makes
        one. `options`: `visibility_timeout_ms`, `backoff` (a `Backoff`), `extend_at`,
        `grace_s`, `poll_wait_ms`, `hooks` (a `WorkerHooks`), `rng`."""
        opts, own = worker_options(concurrency, options)

        def make(fn: Handler) -> Worker:
            return Worker(self, queue, fn, opts, **own)  # type: ignore[arg-type]

        return make if handler is None else make(handler)


_handle.provide("sync", DoqClient)
