"""Domain errors and the one table that maps them to gRPC status codes and HTTP statuses.

No transport imports here: adapters (gRPC server, HTTP gateway) look up `STATUS_TABLE`
by `DoqError.kind`. Every error has a stable `reason` (machine readable) and a
`retryable` flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class DoqError(Exception):
    """Base of every error a client can see.

    `kind` selects the row of STATUS_TABLE; `reason` is a stable UPPER_SNAKE identifier;
    `loc` says which part of the request is at fault when it is one item of it, e.g.
    ("messages", 3) (empty otherwise).
    """

    kind: ClassVar[str] = "internal"
    default_reason: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, reason: str | None = None, leader_hint: str = "", loc: tuple[str | int, ...] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.leader_hint = leader_hint
        self.loc = loc


class InvalidArgument(DoqError):
    kind = "invalid_argument"
    default_reason = "INVALID_ARGUMENT"


class NotFound(DoqError):
    kind = "not_found"
    default_reason = "NOT_FOUND"


class QueueNotFound(NotFound):
    default_reason = "QUEUE_NOT_FOUND"


class MessageNotFound(NotFound):
    default_reason = "MESSAGE_NOT_FOUND"


class AlreadyExists(DoqError):
    kind = "already_exists"
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(DoqError):
    """The request is valid but the current state forbids it (e.g. ack of a ready message)."""

    kind = "failed_precondition"
    default_reason = "FAILED_PRECONDITION"


class StaleLease(DoqError):
    """The lease named by the request expired or was superseded by a newer delivery."""

    kind = "aborted"
    default_reason = "STALE_LEASE"


class Overloaded(DoqError):
    kind = "resource_exhausted"
    default_reason = "OVERLOADED"
    retryable = True


class StorageFull(DoqError):
    """A storage alarm is on (the store reached --max-data-size, the disk is under
    --disk-free-limit, or a write failed for want of space): writes that grow the state
    are refused until space is freed; reads, dequeues, acks and deletes still work."""

    kind = "insufficient_storage"
    default_reason = "NOSPACE"
    retryable = True


class LimitReached(DoqError):
    """A count the node bounds is at its limit (e.g. `--max-queues`): the request is
    refused until something is removed; retrying alone does not help."""

    kind = "limit_reached"
    default_reason = "LIMIT_REACHED"


class TooLarge(DoqError):
    kind = "too_large"
    default_reason = "TOO_LARGE"


class Unauthenticated(DoqError):
    """No valid client key (missing, malformed, unknown or revoked)."""

    kind = "unauthenticated"
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(DoqError):
    """A valid key without the scope (or queue prefix) the call needs."""

    kind = "permission_denied"
    default_reason = "PERMISSION_DENIED"


class NotLeader(DoqError):
    kind = "unavailable"
    default_reason = "NOT_LEADER"
    retryable = True


class Unavailable(DoqError):
    kind = "unavailable"
    default_reason = "UNAVAILABLE"
    retryable = True


class OutcomeUnknown(DoqError):
    """The command is in the log of a node that lost its leadership (or stopped) before the
    entry's fate was known: a later leader may still commit it, or not. Not retryable as
    such: a repeat is safe only when it cannot apply twice (a dedup id, a lease id)."""

    kind = "unavailable"
    default_reason = "OUTCOME_UNKNOWN"


@dataclass(frozen=True, slots=True)
class StatusRow:
    grpc_code: str  # name of a grpc.StatusCode member
    http_status: int
    title: str


STATUS_TABLE: dict[str, StatusRow] = {
    "invalid_argument": StatusRow("INVALID_ARGUMENT", 400, "Invalid argument"),
    "not_found": StatusRow("NOT_FOUND", 404, "Not found"),
    "unauthenticated": StatusRow("UNAUTHENTICATED", 401, "Unauthenticated"),
    "permission_denied": StatusRow("PERMISSION_DENIED", 403, "Permission denied"),
    "already_exists": StatusRow("ALREADY_EXISTS", 409, "Already exists"),
    "failed_precondition": StatusRow("FAILED_PRECONDITION", 409, "Failed precondition"),
    "aborted": StatusRow("ABORTED", 409, "Stale lease"),
    "resource_exhausted": StatusRow("RESOURCE_EXHAUSTED", 429, "Overloaded"),
    "limit_reached": StatusRow("RESOURCE_EXHAUSTED", 429, "Limit reached"),
    "insufficient_storage": StatusRow("RESOURCE_EXHAUSTED", 507, "Insufficient storage"),
    "too_large": StatusRow("RESOURCE_EXHAUSTED", 413, "Too large"),
    "unavailable": StatusRow("UNAVAILABLE", 503, "Unavailable"),
    "internal": StatusRow("INTERNAL", 500, "Internal error"),
}


def status_of(err: DoqError) -> StatusRow:
    """The status row for an error (INTERNAL for unknown kinds)."""
    return STATUS_TABLE.get(err.kind, STATUS_TABLE["internal"])
