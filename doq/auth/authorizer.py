"""`Authorizer`: from an `Authorization` value to a `Principal`, and a `Principal` against a `Rule`.

When keys are required (`required`, see `doq.auth.mode`), a call without a valid key is
refused (`Unauthenticated`: no key, another scheme, a malformed, unknown or revoked
token). When they are not (a loopback node without `--secure`), a call without a key is
`ANONYMOUS`, allowed everything; a call that presents a key is still held to it (an
invalid key is refused, a valid one gets only its scopes), as Kubernetes treats a bad
token even where anonymous access is on.

Keys are read from the replicated table as last committed (`keys()`: a dict by id), so
every member decides alike once it has applied the same log; a revoked key stops working
on a member as soon as that member applies the revocation. Errors never echo the token.
A node that requires keys but whose table is still empty (a new cluster before its first
admin key commits, a new member before the table reaches it) answers a presented key with
`Unavailable` (`NO_KEYS_YET`, retryable) rather than calling a key it cannot know invalid.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

from doq.auth import tokens
from doq.auth.table import READ, Rule
from doq.errors import PermissionDenied, Unauthenticated, Unavailable
from doq.queues.apikeys import KeyRecord, Scope


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: a key's id and scopes, or the anonymous caller of an open node."""

    key_id: str
    scopes: tuple[Scope, ...]
    anonymous: bool = False
    is_admin: bool = False  # anonymous, or a key with the admin scope (`principal_of`)

    def may_call(self, rule: Rule) -> bool:
        """May this caller make the call on some queue (the queue not yet known)?"""
        if rule.open or rule.any_key or self.is_admin:
            return True
        return any(s.name in rule.scopes for s in self.scopes)

    def unrestricted(self, rule: Rule) -> bool:
        """May it make the call on every queue (so no per-queue check is needed)?"""
        if rule.open or rule.any_key or self.is_admin or not rule.queue:
            return self.may_call(rule)
        return any(s.name in rule.scopes and not s.prefix for s in self.scopes)

    def prefixes(self, rule: Rule) -> tuple[str, ...]:
        """The queue-name prefixes its scopes grant for `rule` ("" = every queue): a queue
        is allowed iff `queue.startswith(prefixes)` (one C call per request frame)."""
        return tuple(s.prefix for s in self.scopes if s.name in rule.scopes)

    def may(self, rule: Rule, queue: str | None) -> bool:
        """May it make the call on `queue` (None: the call names none)?"""
        if rule.open or rule.any_key or self.is_admin:
            return True
        return any(s.allows(name, queue) for s in self.scopes for name in rule.scopes)


ANONYMOUS = Principal("", (), anonymous=True, is_admin=True)

current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "doq_current_principal", default=None)
"""The principal the client door found for the current call: set once per call or stream
by the gRPC `AuthInterceptor` and the HTTP `AuthMiddleware` (both run in the call's own
context; None: no key was checked, e.g. a call without a key on a node that requires
none). The service reads it through `doq.service.door.Caller`."""

_READ_RULE = Rule(READ, "name")


def visible_queue(principal: Principal | None) -> Callable[[str], bool] | None:
    """The test a queue name must pass to appear in a listing (queue lists, `/events`)
    for this caller: the queues it may read (`produce`, `consume` or `metrics` on them).
    None: the caller sees every queue (no key checked, admin, or a scope without prefix)."""
    if principal is None or principal.unrestricted(_READ_RULE):
        return None
    prefixes = principal.prefixes(_READ_RULE)
    return lambda name: name.startswith(prefixes)


def principal_of(rec: KeyRecord) -> Principal:
    return Principal(rec.id, rec.scopes, is_admin=any(s.name == "admin" for s in rec.scopes))


class Authorizer:
    """The checks both doors make; `keys` returns the committed key table."""

    def __init__(self, keys: Callable[[], dict[str, KeyRecord]], *, required: bool) -> None:
        self.keys = keys
        self.required = required

    def authenticate(self, authorization: str | bytes | None) -> Principal:
        """The caller of a call with this `Authorization` value (None: no header).
        Raises Unauthenticated."""
        if authorization is None:
            if self.required:
                raise Unauthenticated("this node requires a key: send 'Authorization: Bearer KEY'",
                                      reason="KEY_REQUIRED")
            return ANONYMOUS
        token = tokens.bearer_token(authorization)
        if token is None:
            raise Unauthenticated("the Authorization header must be 'Bearer KEY'", reason="INVALID_KEY")
        key_id = tokens.key_id_of(token)
        keys = self.keys()
        if self.required and not keys:
            raise Unavailable("this node knows no client key yet (a new cluster is registering its first admin "
                              "key, or this member has not yet received the key table): retry",
                              reason="NO_KEYS_YET")
        rec = keys.get(key_id) if key_id is not None else None
        if rec is None or not tokens.matches(token, rec.secret_hash):
            raise Unauthenticated("the key is not valid (unknown, malformed or revoked)", reason="INVALID_KEY")
        return principal_of(rec)

    @staticmethod
    def deny(principal: Principal, rule: Rule, queue: str | None = None) -> PermissionDenied:
        what = " or ".join(rule.scopes) + (f" on queue {queue!r}" if queue else "")
        return PermissionDenied(f"key {principal.key_id} lacks the scope this call needs: {what}",
                                reason="SCOPE_REQUIRED")

    def check_call(self, principal: Principal, rule: Rule) -> None:
        """Raise PermissionDenied if the caller may not make this call on any queue."""
        if not principal.may_call(rule):
            raise self.deny(principal, rule)

    def check_queue(self, principal: Principal, rule: Rule, queue: str | None) -> None:
        """Raise PermissionDenied if the caller may not make this call on `queue`."""
        if not principal.may(rule, queue):
            raise self.deny(principal, rule, queue)
