"""The one door every call goes through: who calls (`Caller`), for what (`Action`), on
which queue, and the node's limits (`Limits`).

Contract:
- Every public method of the facade (`QueueService`) and every stream session takes a
  `Caller` (keyword `caller`; `INTERNAL`, the node's own trusted calls, by default) and
  calls `Door.admit(caller, action, queue)` once before it validates or proposes
  anything: once per unary call, once per stream when its first request names the queue
  (a producer stream: once per queue it names). An admit that raises a `DoqError` (e.g.
  `PermissionDenied`) refuses the call and nothing changes.
- The adapters build the `Caller` in one place each (`doq.service.grpc_server.grpc_caller`,
  `doq.service.http.routes.http_caller`): the transport, and the authenticated principal
  read from `current_principal`, which an authentication layer (a gRPC server
  interceptor, an HTTP dependency or middleware) sets for the call; the facade never
  looks at transport metadata itself.
- `Door.limits` is the node's one settings object of request and stream bounds, read by
  the facade and the sessions (nothing else holds a bound of its own).

A check plugged in with `Door.add_check` runs on the event loop for every admitted call:
keep it O(1) (a dict look-up), never blocking.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from doq.auth.authorizer import Principal, visible_queue
from doq.auth.authorizer import current_principal as _auth_principal
from doq.queues.model import MessageView, QueueInfo
from doq.service import metrics
from doq.service.limits import Limits


class Action(enum.Enum):
    """What a call does (one per facade operation): what a check authorizes."""

    CREATE_QUEUE = "create_queue"
    UPDATE_QUEUE = "update_queue"
    DELETE_QUEUE = "delete_queue"
    PURGE_QUEUE = "purge_queue"
    GET_QUEUE = "get_queue"
    LIST_QUEUES = "list_queues"
    ENQUEUE = "enqueue"  # also every batch, columnar frame and producer stream
    DEQUEUE = "dequeue"  # also every dequeue stream (its acks and nacks included)
    ACK = "ack"
    NACK = "nack"
    TOUCH = "touch"
    UPDATE_PRIORITY = "update_priority"
    GET_MESSAGE = "get_message"
    PEEK = "peek"  # browse messages without taking them
    DELETE_MESSAGE = "delete_message"
    REDRIVE = "redrive"  # start or cancel a dead-letter queue's redrive (doq.service.redrive)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes one call or stream: its transport ("grpc", "http", "internal") and its
    authenticated principal (None: not authenticated; its type belongs to the
    authentication layer). `counters` are the message counters of its transport."""

    transport: str
    principal: object | None = None
    counters: metrics.Transport = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counters", metrics.transport(self.transport))


INTERNAL = Caller("internal")
"""The node's own calls (and in-process tests): trusted, counted apart."""

current_principal = _auth_principal
"""The principal the authentication layer found for the current call (set per call by
its gRPC interceptor and HTTP middleware, `doq.auth.authorizer.current_principal`; both
run in the call's own context)."""


def deletes_any(caller: Caller) -> bool:
    """May the caller delete a message someone else holds (in flight) without its lease?
    An admin key, and a caller without a key checked (the node's own calls; a node that
    requires no keys, where such a caller may do everything, as `doq.auth` treats it)."""
    principal = caller.principal
    return principal is None or (isinstance(principal, Principal) and principal.is_admin)


def without_leases(caller: Caller, views: list[MessageView]) -> list[MessageView]:
    """The messages of a look (`Get`, `Peek`, the answer of `UpdatePriority`) as this caller may see them: a delivery's lease
    id is the capability to settle it (ack, nack, touch, delete), so only the dequeue that
    made the delivery hands it out; a look shows it (else 0) only to a caller that may
    settle any delivery anyway (`deletes_any`: an admin key, or no key checked)."""
    if deletes_any(caller):
        return views
    return [dataclasses.replace(m, lease_id=0) if m.lease_id else m for m in views]


def visible(caller: Caller, queues: list[QueueInfo]) -> list[QueueInfo]:
    """The queues of a listing the caller may see: those its key may read (a key limited
    to queue-name prefixes sees only its queues; no key checked, admin, or a scope without
    prefix: all). The one filter of every listing that names queues."""
    principal = caller.principal
    test = visible_queue(principal) if isinstance(principal, Principal) else None
    return queues if test is None else [q for q in queues if test(q.name)]

Check = Callable[[Caller, Action, "str | None"], None]
"""`check(caller, action, queue)`: raises a DoqError to refuse; queue is None for calls
on no one queue (`list_queues`)."""


class AdmittedQueues(set[str]):
    """The queue names a stream had admitted by the door, so each is admitted once, not
    per message: a cache of at most `capacity` names, emptied when full (a name is then
    simply admitted again: an O(1) check). A stream that names ever new queues thus holds
    at most `capacity` names. Membership is the set's own (no Python call per message)."""

    __slots__ = ("capacity",)

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, capacity)

    def remember(self, queue: str) -> None:
        if len(self) >= self.capacity:
            self.clear()
        self.add(queue)


class Door:
    """The admission point of one facade: its limits and the checks every call passes."""

    __slots__ = ("limits", "_checks")
    limits: Limits

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._checks: tuple[Check, ...] = ()

    def add_check(self, check: Check) -> None:
        """Run `check` for every call admitted from now on (after those added before)."""
        self._checks = (*self._checks, check)

    def admit(self, caller: Caller, action: Action, queue: str | None = None) -> None:
        """Let the call in, or raise the DoqError of the first check that refuses it."""
        for check in self._checks:
            check(caller, action, queue)
