"""What a producer or consumer needs of the client it runs on, as interfaces
(`SyncClient`, `AsyncClient`), so that `producer`, `consumer` and the workers never import the client
classes (`client.DoqClient`, `aio.AsyncDoqClient` import them: their `producer()` and
`consumer()`). A producer or consumer given a bare channel asks `client_on` for a client
of its kind on it: the client modules register their class here when they are imported
(`doq_client/__init__` imports both, so any import of the package has them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from doq_client import _ops
from doq_client._routing import Router
from doq_client.errors import DoqClientError
from doq_client.retry import FailoverPolicy

T = TypeVar("T")


class SyncClient(Protocol):
    """The members of `DoqClient` a synchronous producer or consumer uses."""

    router: Router[grpc.Channel]
    failover: FailoverPolicy

    def _call(self, op: _ops.Op[T], extra_timeout_s: float = 0.0) -> T: ...

    def _redirect(self, err: DoqClientError, failed: str) -> bool: ...


class AsyncClient(Protocol):
    """The members of `AsyncDoqClient` an asyncio producer or consumer uses."""

    router: Router[grpc.aio.Channel]
    failover: FailoverPolicy

    def _call(self, op: _ops.Op[T], extra_timeout_s: float = 0.0) -> Awaitable[T]: ...

    def _redirect(self, err: DoqClientError, failed: str) -> Awaitable[bool]: ...


_CLASSES: dict[str, type] = {}


def provide(kind: str, cls: type) -> None:
    """Register the client class of `kind` ("sync" or "async"); its constructor takes
    `channel=`."""
    _CLASSES[kind] = cls


def client_on(client_or_channel: Any, kind: str) -> Any:
    """`client_or_channel` if it is a client of `kind`, else a new one on that channel."""
    cls = _CLASSES.get(kind)
    if cls is None:  # only if doq_client's package init did not run (it imports both)
        raise RuntimeError(f"no {kind} doq client class registered: import doq_client first")
    make: Callable[..., Any] = cls
    return client_or_channel if isinstance(client_or_channel, cls) else make(channel=client_or_channel)
