"""Client-side errors: one `DoqClientError` hierarchy built from gRPC statuses.

The server puts a stable `reason`, a `retryable` flag and a `leader_hint` in the trailing
metadata of a failed call (`doq-reason`, `doq-retryable`, `doq-leader`, plus
`doq-leader-grpc`: the leader's gRPC address when the node knows it), and in the `Error`
message of a failed item inside a stream or batch (no address there). Both are mapped here to the same classes.
Only `grpc` is imported (no server modules).
"""

from __future__ import annotations

from typing import Any

import grpc

from doq_proto.v1 import doq_pb2 as pb


class DoqClientError(Exception):
    """Base of every error the client raises for a failed doq call.

    `code` is the gRPC status code, `reason` a stable UPPER_SNAKE identifier chosen by the
    server (e.g. ``QUEUE_NOT_FOUND``; ``""`` when the failure came from the transport),
    `retryable` says whether the same request may succeed later, `leader_hint` names the
    leader (its node id) when the contacted node is not it, and `leader_addr` is that
    leader's gRPC address (HOST:PORT) when the server sent it ("" otherwise).
    """

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        retryable: bool = False,
        leader_hint: str = "",
        leader_addr: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.retryable = retryable
        self.leader_hint = leader_hint
        self.leader_addr = leader_addr

    def __str__(self) -> str:
        reason = f" {self.reason}" if self.reason else ""
        return f"[{self.code.name}{reason}] {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, "
            f"retryable={self.retryable}, message={self.message!r})"
        )


class InvalidArgument(DoqClientError):
    """The request was refused as malformed; nothing was changed."""


class NotFound(DoqClientError):
    """The queue or message does not exist."""


class QueueNotFound(NotFound):
    """reason ``QUEUE_NOT_FOUND``."""


class MessageNotFound(NotFound):
    """reason ``MESSAGE_NOT_FOUND``."""


class AlreadyExists(DoqClientError):
    """The queue already exists."""


class FailedPrecondition(DoqClientError):
    """The request is valid but the current state forbids it (e.g. ack of a ready message)."""


class StaleLease(DoqClientError):
    """The lease named by the request expired or was superseded by a newer delivery."""


class ResourceExhausted(DoqClientError):
    """Overload or a size limit (see the subclasses)."""


class Overloaded(ResourceExhausted):
    """The server is overloaded; retry later (retryable)."""


class TooLarge(ResourceExhausted):
    """A message or batch exceeds a size limit (not retryable)."""


class StorageFull(ResourceExhausted):
    """A storage alarm (reason ``DATA_SIZE_LIMIT``, ``DISK_FREE_LIMIT`` or ``NOSPACE``; HTTP
    507): a node is short of space and refuses writes that grow the state until space is
    freed (retryable); dequeues, acks and deletes still work."""


class Unavailable(DoqClientError):
    """No leader, not the leader (see `leader_hint`), shutting down, or no connection."""


class NotLeader(Unavailable):
    """reason ``NOT_LEADER``: send the request to `leader_hint`; it was not applied."""


class OutcomeUnknown(Unavailable):
    """reason ``OUTCOME_UNKNOWN``: the leader lost its leadership (or stopped) with the
    command in its log; a later leader may still apply it. Repeat it only if a repeat
    cannot apply twice (a dedup id, a lease id)."""


class Unauthenticated(DoqClientError):
    """No valid key: give one (`key=` or `$DOQ_KEY`), or it was revoked."""


class PermissionDenied(DoqClientError):
    """The key lacks the scope (or queue prefix) the call needs."""


class DeadlineExceeded(DoqClientError):
    """The call's deadline passed, or the server could not commit in time.

    The command may or may not have been applied.
    """


class Cancelled(DoqClientError):
    """The call was cancelled (usually by closing the client)."""


class Internal(DoqClientError):
    """A server bug or an unexpected failure."""


_BY_CODE: dict[grpc.StatusCode, type[DoqClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: StaleLease,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
}

_BY_REASON: dict[str, type[DoqClientError]] = {
    "QUEUE_NOT_FOUND": QueueNotFound,
    "MESSAGE_NOT_FOUND": MessageNotFound,
    "OVERLOADED": Overloaded,
    "NOT_LEADER": NotLeader,
    "OUTCOME_UNKNOWN": OutcomeUnknown,
    "DATA_SIZE_LIMIT": StorageFull,
    "DISK_FREE_LIMIT": StorageFull,
    "NOSPACE": StorageFull,
}

_CODE_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def error_class(code: grpc.StatusCode, reason: str) -> type[DoqClientError]:
    """The most specific class for a status code and reason."""
    base = _BY_CODE.get(code, DoqClientError)
    cls = _BY_REASON.get(reason)
    if cls is not None and issubclass(cls, base):
        return cls
    if base is ResourceExhausted and reason.endswith("TOO_LARGE"):
        return TooLarge
    return base


def make_error(
    code: grpc.StatusCode,
    message: str,
    reason: str = "",
    retryable: bool = False,
    leader_hint: str = "",
    leader_addr: str = "",
) -> DoqClientError:
    """Build the error instance for a status."""
    cls = error_class(code, reason)
    return cls(
        message,
        code=code,
        reason=reason,
        retryable=retryable,
        leader_hint=leader_hint,
        leader_addr=leader_addr,
    )


def invalid_argument(message: str, reason: str = "INVALID_ARGUMENT") -> InvalidArgument:
    """Bad input refused by the client itself, before anything is sent (as the server would)."""
    return InvalidArgument(message, code=grpc.StatusCode.INVALID_ARGUMENT, reason=reason)


def from_rpc_error(e: grpc.RpcError | grpc.aio.AioRpcError) -> DoqClientError:
    """Map a failed call (sync or aio) to a `DoqClientError`, reading the doq trailers.

    Without doq trailers (a transport failure) UNAVAILABLE is retryable and nothing else
    is; INTERNAL without them is taken as UNAVAILABLE: it is how `grpc.aio` reports a
    connection lost while a stream writes ("Internal error from Core"), and a doq server
    always sends its reason.
    """
    code: grpc.StatusCode = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[union-attr]
    details: str = (e.details() if hasattr(e, "details") else None) or str(e)  # type: ignore[union-attr]
    trailers: Any = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None  # type: ignore[union-attr]
    md: dict[str, str] = {}
    for item in trailers or ():
        key, value = item[0], item[1]
        md[key] = value.decode() if isinstance(value, bytes) else str(value)
    reason = md.get("doq-reason", "")
    if not reason and code == grpc.StatusCode.INTERNAL:
        code = grpc.StatusCode.UNAVAILABLE
    if "doq-retryable" in md:
        retryable = md["doq-retryable"] == "true"
    else:
        retryable = code == grpc.StatusCode.UNAVAILABLE
    return make_error(
        code, details, reason, retryable, md.get("doq-leader", ""), md.get("doq-leader-grpc", "")
    )


def from_pb_error(err: pb.Error) -> DoqClientError:
    """Map the per-item `Error` of a stream or batch response."""
    code = _CODE_BY_VALUE.get(err.code, grpc.StatusCode.UNKNOWN)
    return make_error(code, err.message, err.reason, err.retryable, err.leader_hint)


__all__ = [
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "DoqClientError",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MessageNotFound",
    "NotFound",
    "NotLeader",
    "Overloaded",
    "QueueNotFound",
    "ResourceExhausted",
    "StaleLease",
    "TooLarge",
    "Unavailable",
    "error_class",
    "from_pb_error",
    "from_rpc_error",
    "invalid_argument",
    "make_error",
]
