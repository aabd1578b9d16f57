"""How a node turns pending proposals into log entries: the bounds of the queue of
proposals and of one entry, and the wall clock that stamps each entry's `now_ms`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from doq.queues.commands import Command

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
