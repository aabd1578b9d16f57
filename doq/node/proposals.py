"""How a node turns pending proposals into log entries: the bounds of the queue of
proposals and of one entry, the wall clock that stamps each entry's `now_ms`, what the
driver remembers of an entry it proposed (`Proposal`), and how its futures end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from doq.queues.commands import Command, CommandBatch

MAX_PENDING_COMMANDS = 200_000  # proposals waiting for an entry; more: Overloaded (retryable)
MAX_COMMANDS_PER_ENTRY = 4096
MAX_BATCH_BYTES = 8 * 1024 * 1024  # message content per entry (one command may exceed it alone)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def take_count(pending: Sequence[tuple[Command, object]]) -> int:
    """How many pending commands go into the next entry (bounded by count and bytes)."""
    size = 0
    for n, (cmd, _) in enumerate(pending[:MAX_COMMANDS_PER_ENTRY]):
        items = getattr(cmd, "items", None)
        contents: list[bytes] = getattr(cmd, "contents", None) or []
        if items or contents:
            size += sum(len(it.content) for it in items) if items else sum(map(len, contents))
            if size > MAX_BATCH_BYTES and n > 0:
                return n
    return min(len(pending), MAX_COMMANDS_PER_ENTRY)


@dataclass(slots=True)
class Proposal:
    """An entry this node proposed as leader, waiting for its fate: applied with `term`
    (its futures get the results), or replaced or unknown (they fail). `conf`: a conf
    change (resolved with None); else `batch` is what the entry's data encodes (applied
    without decoding), one future per command."""

    term: int
    futs: list[asyncio.Future[object]]
    conf: bool = False
    batch: CommandBatch | None = None


def resolve_future(fut: asyncio.Future[object], value: object) -> None:
    """Resolve `fut` with `value` unless it is done (cancelled, failed) already."""
    if not fut.done():
        fut.set_result(value)


def fail_future(fut: asyncio.Future[object], err: BaseException) -> None:
    """Fail `fut`; its waiter (if any) sees `err`; a proposal nobody awaits any more (its
    stream ended) logs nothing (the exception counts as retrieved)."""
    if not fut.done():
        fut.set_exception(err)
        fut.exception()


def ignore_result(fut: asyncio.Future[Any]) -> None:
    """A done callback for a future nobody awaits: its exception counts as retrieved."""
    if not fut.cancelled():
        fut.exception()
