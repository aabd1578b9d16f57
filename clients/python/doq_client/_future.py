"""`LazyFuture`: a `concurrent.futures.Future` that costs little until someone waits on it.

A producer makes one future per message, and most are resolved before anyone looks at
them. A plain `Future` allocates a `Condition` (with its lock and lists) at creation:
several objects per message for the garbage collector to walk while thousands are in
flight. This one creates them on first need (`result()` before the result, callbacks,
`concurrent.futures.wait`, ...); `set_result` / `set_exception` of a future nobody waits
on just store the outcome. One module lock orders the two cases, so a waiter either
sees the outcome or is woken by it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures._base import (  # type: ignore[attr-defined]
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
)
from typing import Any

_LAZY = threading.Lock()  # creating a future's condition vs resolving it without one
_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_CANCELLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED))


class LazyFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """`concurrent.futures.Future` with its condition and lists created on first need."""

    def __init__(self) -> None:  # noqa: D107 - no super().__init__: see the module doc
        self._state = PENDING
        self._result = None
        self._exception = None

    def __getattr__(self, name: str) -> Any:
        """Called only for attributes not set yet: the condition and its lists."""
        if name in ("_condition", "_waiters", "_done_callbacks"):
            with _LAZY:
                d = self.__dict__
                if "_condition" not in d:
                    d["_waiters"] = []
                    d["_done_callbacks"] = []
                    d["_condition"] = threading.Condition()
            return d[name]
        raise AttributeError(name)

    def _quiet(self) -> bool:
        """Whether nobody can be waiting (no condition yet); the caller holds `_LAZY`."""
        return "_condition" not in self.__dict__

    def set_result(self, result: Any) -> None:
        with _LAZY:
            if self._quiet():
                if self._state != PENDING:
                    raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
                self._result = result
                self._state = FINISHED
                return
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        with _LAZY:
            if self._quiet():
                if self._state != PENDING:
                    raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
                self._exception = exception
                self._state = FINISHED
                return
        super().set_exception(exception)

    def done(self) -> bool:
        return self._state in _DONE  # one attribute read: atomic, no condition needed

    def cancelled(self) -> bool:
        return self._state in _CANCELLED

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:  # FINISHED is final: no lock needed to read it
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)
