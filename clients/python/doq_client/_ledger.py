"""Bookkeeping shared by the sync and async producers: which response belongs to whom.

A *chunk* is what one `enqueue`/`enqueue_many` call submitted; it is never split across
frames. Responses arrive in order (one per EnqueueStream request, one per
EnqueueBatchStream frame), so results are handed to chunks strictly FIFO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from doq_client.errors import DoqClientError, from_pb_error
from doq_client.types import EnqueueResult

Outcome = EnqueueResult | DoqClientError


class Chunk:
    """Requests of one submit call and the future that receives their outcomes.

    `single`: the future gets one `EnqueueResult` (or the item's error as an exception);
    otherwise it gets the list of outcomes, one per request.
    """

    __slots__ = ("requests", "future", "single", "outcomes")

    def __init__(self, requests: Sequence[Any], future: Any, single: bool) -> None:
        self.requests = requests
        self.future = future
        self.single = single
        self.outcomes: list[Outcome] = []


def outcome_of(r: Any) -> Outcome:
    if not r.success:
        return from_pb_error(r.error)
    return EnqueueResult(r.id, r.duplicate, r.group, r.priority, r.deliver_at_ms)


class Ledger:
    """Sent frames waiting for their responses, and the chunks they carry."""

    def __init__(self, resolve: Callable[[Chunk], None]) -> None:
        self._resolve = resolve
        self._chunks: deque[Chunk] = deque()  # sent (or being sent), unresolved, in order
        self._frame_sizes: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._chunks)

    def sent(self, chunks: Sequence[Chunk], frame_size: int | None) -> None:
        """Record chunks written as one batch frame (`frame_size` items) or as single frames."""
        self._chunks.extend(chunks)
        if frame_size is not None:
            self._frame_sizes.append(frame_size)

    def on_single(self, resp: Any) -> None:
        """One EnqueueStream response."""
        self._feed([outcome_of(resp)])

    def on_batch(self, resp: Any) -> None:
        """One EnqueueBatchStream response; a frame-level failure has one result for all."""
        size = self._frame_sizes.popleft()
        results = resp.results
        if len(results) != size and len(results) == 1 and not results[0].success:
            err = from_pb_error(results[0].error)
            self._feed([err] * size)
        else:
            self._feed([outcome_of(r) for r in results])

    def _feed(self, outcomes: list[Outcome]) -> None:
        chunks = self._chunks
        for o in outcomes:
            head = chunks[0]
            head.outcomes.append(o)
            if len(head.outcomes) == len(head.requests):
                chunks.popleft()
                self._resolve(head)

    def fail_all(self) -> list[Chunk]:
        """Remove and return every unresolved chunk (the stream ended or failed)."""
        out = list(self._chunks)
        self._chunks.clear()
        self._frame_sizes.clear()
        return out
