"""Bookkeeping shared by the sync and async producers: what is sent, and whose response is whose.

A *chunk* is what one `enqueue`/`enqueue_many` call submitted; it is never split across
batch frames. Its requests are kept serialized (`wire`), each carrying a dedup id (the
caller's, or one the producer stamped), so after a failover the very same bytes are sent
again. Responses arrive in order (one per EnqueueStream request, one per
EnqueueBatchStream frame), so results are handed to chunks strictly FIFO.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from doq_client.errors import DoqClientError, from_pb_error
from doq_client.retry import is_failover
from doq_client.types import EnqueueResult
from doq_proto.v1 import doq_pb2 as pb

Outcome = EnqueueResult | DoqClientError

_DEDUP_TAG = b"\x32"  # EnqueueRequest.dedup_id: field 6, length-delimited
_MESSAGES_TAG = b"\x0a"  # EnqueueBatchRequest.messages: field 1, length-delimited


class Chunk:
    """Requests of one submit call (serialized) and the future that receives their outcomes.

    `single`: the future gets one `EnqueueResult` (or the item's error as an exception);
    otherwise it gets the list of outcomes, one per request. `safe`: every request carries
    a dedup id, so it may be sent again when its first sending's outcome is unknown.
    Outcomes arrive in request order; `unanswered()` are the requests still waiting.
    """

    __slots__ = ("wire", "future", "single", "safe", "outcomes")

    def __init__(self, wire: list[bytes], future: Any, single: bool, safe: bool) -> None:
        self.wire = wire
        self.future = future
        self.single = single
        self.safe = safe
        self.outcomes: list[Outcome] = []

    def unanswered(self) -> list[bytes]:
        return self.wire[len(self.outcomes) :] if self.outcomes else self.wire


class Stamper:
    """Serializes requests, adding a dedup id of the producer's own to those without one:
    a random per-producer prefix and a sequence number (``<16 hex>-<12 hex>``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        prefix = secrets.token_hex(8).encode() + b"-"
        self._head = _DEDUP_TAG + bytes((len(prefix) + 12,)) + prefix
        self._seq = itertools.count(1)

    def encode(self, requests: Sequence[pb.EnqueueRequest]) -> tuple[list[bytes], bool]:
        """The requests' wire form and whether all carry a dedup id. Appending a field to a
        serialized message sets it (protobuf merge), so no request object is copied or changed."""
        out: list[bytes] = []
        safe = True
        for r in requests:
            w = r.SerializeToString()
            if not r.dedup_id:
                if self.enabled:
                    w += self._head + b"%012x" % next(self._seq)
                else:
                    safe = False
            out.append(w)
        return out, safe


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch_frame(chunks: Sequence[Chunk]) -> bytes:
    """The serialized `EnqueueBatchRequest` carrying the chunks' unanswered requests."""
    return b"".join(
        _MESSAGES_TAG + _varint(len(w)) + w for c in chunks for w in c.unanswered()
    )


def take_frame(outbox: deque[Chunk], batch: int) -> tuple[list[Chunk], int]:
    """Take whole chunks from the outbox for one batch frame (at least one chunk)."""
    chunks = [outbox.popleft()]
    size = len(chunks[0].unanswered())
    while outbox and size + len(outbox[0].unanswered()) <= batch:
        c = outbox.popleft()
        chunks.append(c)
        size += len(c.unanswered())
    return chunks, size


class Refused(Exception):
    """A response refused items with a failover error (e.g. NOT_LEADER): the stream must
    be reopened on the leader; nothing of that response was handed to a chunk."""

    def __init__(self, err: DoqClientError) -> None:
        super().__init__(str(err))
        self.err = err


def _item_error(e: pb.Error) -> DoqClientError:
    err = from_pb_error(e)
    if is_failover(err):
        raise Refused(err)
    return err


def outcome_of(r: Any) -> Outcome:
    """One response item's outcome; raises `Refused` for a failover error."""
    if not r.success:
        return _item_error(r.error)
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
        """One EnqueueStream response. Raises `Refused` for a failover error."""
        self._feed([outcome_of(resp)])

    def on_batch(self, resp: Any) -> None:
        """One EnqueueBatchStream response; a frame-level failure has one result for all.
        Raises `Refused` (feeding nothing) if an item failed with a failover error."""
        size = self._frame_sizes[0]
        results = resp.results
        if len(results) != size and len(results) == 1 and not results[0].success:
            outcomes: list[Outcome] = [_item_error(results[0].error)] * size
        else:
            outcomes = [outcome_of(r) for r in results]
        self._frame_sizes.popleft()
        self._feed(outcomes)

    def _feed(self, outcomes: list[Outcome]) -> None:
        chunks = self._chunks
        for o in outcomes:
            head = chunks[0]
            head.outcomes.append(o)
            if len(head.outcomes) == len(head.wire):
                chunks.popleft()
                self._resolve(head)

    def take_all(self) -> list[Chunk]:
        """Remove and return every unresolved chunk, in order (the stream ended or failed)."""
        out = list(self._chunks)
        self._chunks.clear()
        self._frame_sizes.clear()
        return out
