"""Bookkeeping shared by the sync and async producers: what is sent, and whose response is whose.

A *chunk* is what one `enqueue`/`send`/`enqueue_many` call submitted; it is never split
across frames. Every message carries a dedup id (the caller's, or one the producer
stamped), so after a failover the very same messages are sent again. A chunk is kept in
one of two forms:

- columns (`queue` set): the messages of one queue as plain values, one sequence per
  field (contents, dedup ids; groups, priorities, metadata and delays only when some
  message sets them). Consecutive chunks of one queue go out together as one columnar
  `EnqueueBatchRequest` frame, gathered column by column: per message the producer keeps
  a few sequence entries (tuples of str and int, which the cyclic GC stops tracking), not
  a protobuf object or a per-message record.
- wire (`queue` None): serialized `EnqueueRequest`s (one-message-per-frame streams, and
  `enqueue_many` over several queues), sent as they are.

Responses arrive in order (one per EnqueueStream request, one per EnqueueBatchStream
frame), so results are handed to chunks strictly FIFO.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, NamedTuple

from doq_client.errors import DoqClientError, Internal, from_pb_error
from doq_client.retry import is_failover
from doq_client.types import EnqueueResult
from doq_proto.v1 import doq_pb2 as pb

Outcome = EnqueueResult | DoqClientError

_DEDUP_TAG = b"\x32"  # EnqueueRequest.dedup_id: field 6, length-delimited
_MESSAGES_TAG = b"\x0a"  # EnqueueBatchRequest.messages: field 1, length-delimited


class Chunk:
    """The messages of one submit call and the future that receives their outcomes.

    `single`: the future gets one `EnqueueResult` (or the item's error as an exception);
    otherwise it gets the list of outcomes, one per message. `safe`: every message carries
    a dedup id, so it may be sent again when its first sending's outcome is unknown.
    Outcomes arrive in message order; `answered` of them have arrived.
    Columns form: `queue`, `contents`, `dedup_ids`, and `groups`, `priorities`, `metadata`,
    `delays_ms` (each None when every message has that field's default: "", 0, {}, 0);
    wire form: `wire`.
    """

    __slots__ = ("queue", "contents", "dedup_ids", "groups", "priorities", "metadata", "delays_ms",
                 "wire", "future", "single", "safe", "outcomes", "nbytes", "n")

    def __init__(self, wire: list[bytes] | None, future: Any, single: bool, safe: bool, *,
                 queue: str | None = None, contents: Sequence[bytes] = (),
                 dedup_ids: Sequence[str] = (), groups: Sequence[str] | None = None,
                 priorities: Sequence[int] | None = None,
                 metadata: Sequence[Mapping[str, str]] | None = None,
                 delays_ms: Sequence[int] | None = None) -> None:
        self.wire = wire
        self.queue = queue
        self.contents = contents
        self.dedup_ids = dedup_ids
        self.groups = groups
        self.priorities = priorities
        self.metadata = metadata
        self.delays_ms = delays_ms
        self.future = future
        self.single = single
        self.safe = safe
        self.outcomes: list[Outcome] = []
        self.nbytes = sum(map(len, self.contents)) if queue is not None else sum(map(len, wire or ()))
        self.n = len(self.contents) if queue is not None else len(wire or ())  # messages

    @classmethod
    def one(cls, queue: str, content: bytes, dedup_id: str, group: str = "", priority: int = 0) -> Chunk:
        """A single message in columns form (the per-message path: no keyword parsing, no
        protobuf object, no container the cyclic GC keeps tracking)."""
        c = cls.__new__(cls)
        c.wire = None
        c.queue = queue
        c.contents = (content,)
        c.dedup_ids = (dedup_id,)
        c.groups = (group,) if group else None
        c.priorities = (priority,) if priority else None
        c.metadata = None
        c.delays_ms = None
        c.future = None
        c.single = True
        c.safe = bool(dedup_id)
        c.outcomes = []
        c.nbytes = len(content)
        c.n = 1
        return c

    def __len__(self) -> int:
        return self.n

    def unanswered(self) -> list[bytes]:
        """The wire form of the messages still waiting (wire chunks only)."""
        assert self.wire is not None
        return self.wire[len(self.outcomes) :] if self.outcomes else self.wire

    def left(self) -> int:
        return self.n - len(self.outcomes)


class Stamper:
    """Dedup ids of the producer's own for messages without one: a random per-producer
    prefix and a sequence number (``<16 hex>-<12 hex>``, lowercase). The server stores a
    run of consecutive ids of this form as one record (doq/queues/dedupruns.py), so keep
    the form and count up."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._prefix = secrets.token_hex(8) + "-"
        prefix = self._prefix.encode()
        self._head = _DEDUP_TAG + bytes((len(prefix) + 12,)) + prefix
        self._seq = itertools.count(1)

    def next_id(self) -> str:
        """A fresh dedup id ("" when stamping is off)."""
        return f"{self._prefix}{next(self._seq):012x}" if self.enabled else ""

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

    def columns(self, requests: Sequence[pb.EnqueueRequest], future: Any, single: bool) -> Chunk | None:
        """Prebuilt requests of one queue as a columns chunk (None if they name several queues)."""
        queue = requests[0].queue_name
        if any(r.queue_name != queue for r in requests):
            return None
        dids = [r.dedup_id or self.next_id() for r in requests]
        groups = [r.group for r in requests]
        priorities = [r.priority for r in requests]
        delays = [r.delay_ms for r in requests]
        metadata = [dict(r.metadata) for r in requests] if any(r.metadata for r in requests) else None
        return Chunk(None, future, single, all(dids), queue=queue,
                     contents=[r.content for r in requests], dedup_ids=dids,
                     groups=groups if any(groups) else None,
                     priorities=priorities if any(priorities) else None,
                     metadata=metadata, delays_ms=delays if any(delays) else None)


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
    """The serialized `EnqueueBatchRequest` carrying the wire chunks' unanswered requests."""
    return b"".join(
        _MESSAGES_TAG + _varint(len(w)) + w for c in chunks for w in c.unanswered()
    )


class Frame(NamedTuple):
    """What the ledger remembers of a sent batch frame until its response."""

    size: int
    columns: bool
    groups: Sequence[str] | None = None  # columns frames: the messages' groups (None: all "")
    priorities: Sequence[int] | None = None  # ... and priorities (None: all 0)


_COLUMNS = {name: attrgetter(name) for name in ("contents", "dedup_ids", "groups", "priorities",
                                                "metadata", "delays_ms")}
_DEFAULTS: dict[str, Any] = {"groups": "", "priorities": 0, "metadata": {}, "delays_ms": 0}


def _gather(chunks: Sequence[Chunk], name: str, answered: bool) -> list[Any] | None:
    """The chunks' unanswered values of column `name`, in order (None when no chunk has
    an optional column). Without answered messages (every frame but a resend after a
    failover) the columns are chained by C calls, no bytecode per chunk."""
    cols = list(map(_COLUMNS[name], chunks))
    missing = cols.count(None)
    if missing == len(cols):
        return None
    if not answered and not missing:
        return list(chain.from_iterable(cols))
    default = _DEFAULTS.get(name)
    out: list[Any] = []
    for c, col in zip(chunks, cols, strict=True):
        k = len(c.outcomes)
        out += col[k:] if col is not None else repeat(default, c.n - k)
    return out


def columns_frame(chunks: Sequence[Chunk]) -> tuple[bytes, Frame]:
    """One columnar `EnqueueBatchRequest` carrying the chunks' unanswered messages (one queue)."""
    answered = any(map(_OUTCOMES, chunks))
    contents: Sequence[bytes]
    dids: Sequence[str]
    if len(chunks) == 1 and not answered:
        c = chunks[0]
        contents, dids = c.contents, c.dedup_ids
        groups, prios, mds, delays = c.groups, c.priorities, c.metadata, c.delays_ms
    else:
        contents = _gather(chunks, "contents", answered) or []  # never None: every chunk has them
        dids = _gather(chunks, "dedup_ids", answered) or []
        groups, prios = _gather(chunks, "groups", answered), _gather(chunks, "priorities", answered)
        mds, delays = _gather(chunks, "metadata", answered), _gather(chunks, "delays_ms", answered)
    cols = pb.EnqueueColumns(queue_name=chunks[0].queue, contents=contents)
    if any(dids):
        cols.dedup_ids.extend(dids)
    if groups is not None and any(groups):
        cols.groups.extend(groups)
    else:
        groups = None
    if prios is not None and any(prios):
        cols.priorities.extend(prios)
    else:
        prios = None
    if mds is not None and any(mds):
        cols.metadata.extend(pb.Metadata(entries=md) for md in mds)
    if delays is not None and any(delays):
        cols.delays_ms.extend(delays)
    frame = pb.EnqueueBatchRequest(columns=cols).SerializeToString()
    return frame, Frame(len(contents), True, groups, prios)


_OUTCOMES = attrgetter("outcomes")


def take_frame(outbox: deque[Chunk], batch: int, max_bytes: int) -> tuple[list[Chunk], int]:
    """Take whole chunks from the outbox for one batch frame (at least one chunk): chunks
    of one queue (columns), up to `batch` messages and `max_bytes`; a wire chunk (requests
    for several queues: all or nothing) goes alone."""
    first = outbox.popleft()
    chunks = [first]
    size = first.n - len(first.outcomes)
    nbytes = first.nbytes
    queue = first.queue
    while outbox and queue is not None:
        c = outbox[0]
        k = c.n - len(c.outcomes)
        if c.queue != queue or size + k > batch or nbytes + c.nbytes > max_bytes:
            break
        outbox.popleft()
        chunks.append(c)
        size += k
        nbytes += c.nbytes
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


_new = object.__new__
_SET_ID, _SET_DUP, _SET_GROUP, _SET_PRIO, _SET_DELIVER = (
    EnqueueResult.__dict__[f].__set__ for f in ("id", "duplicate", "group", "priority", "deliver_at_ms")
)


def plain_result(id_: int) -> EnqueueResult:
    """`EnqueueResult(id_)`, built through its slots (half the cost of the frozen dataclass's
    `__init__`, once per produced message)."""
    r = _new(EnqueueResult)
    _SET_ID(r, id_)
    _SET_DUP(r, False)
    _SET_GROUP(r, "")
    _SET_PRIO(r, 0)
    _SET_DELIVER(r, 0)
    return r


def _result(id_: int, duplicate: bool, group: str, priority: int, deliver_at_ms: int) -> EnqueueResult:
    """`EnqueueResult(...)` built through its slots, as `plain_result`."""
    r = _new(EnqueueResult)
    _SET_ID(r, id_)
    _SET_DUP(r, duplicate)
    _SET_GROUP(r, group)
    _SET_PRIO(r, priority)
    _SET_DELIVER(r, deliver_at_ms)
    return r


def _column_outcomes(resp: pb.EnqueueBatchResponse, frame: Frame) -> list[Outcome]:
    ids = resp.ids
    if len(ids) != frame.size:
        raise Refused(Internal(f"the server answered {len(ids)} ids for {frame.size} messages"))
    dups, deliver, positions = resp.duplicates, resp.deliver_at_ms, resp.error_positions
    groups, prios = frame.groups, frame.priorities
    if not dups and not deliver and not positions and groups is None and prios is None:
        return [plain_result(i) for i in ids]
    dup = set(dups)
    if not positions:  # every message stored: one call per message, no branch
        n = len(ids)
        return list(map(_result, ids, map(dup.__contains__, range(n)) if dup else repeat(False, n),
                        groups if groups is not None else repeat(""),
                        prios if prios is not None else repeat(0),
                        deliver if deliver else repeat(0)))
    errors = {p: _item_error(e) for p, e in zip(positions, resp.errors, strict=True)}
    out: list[Outcome] = []
    for pos, id_ in enumerate(ids):
        err = errors.get(pos)
        if err is not None:
            out.append(err)
            continue
        out.append(EnqueueResult(id_, pos in dup, groups[pos] if groups is not None else "",
                                 prios[pos] if prios is not None else 0, deliver[pos] if deliver else 0))
    return out


class Ledger:
    """Sent frames waiting for their responses, and the chunks they carry."""

    def __init__(self, resolve: Callable[[Chunk], None]) -> None:
        self._resolve = resolve
        self._chunks: deque[Chunk] = deque()  # sent (or being sent), unresolved, in order
        self._frames: deque[Frame] = deque()
        self.messages = 0  # messages of the batch frames sent and not answered yet

    def __len__(self) -> int:
        return len(self._chunks)

    @property
    def frames(self) -> int:
        """Batch frames sent and not answered yet."""
        return len(self._frames)

    def sent(self, chunks: Sequence[Chunk], frame: Frame | None) -> None:
        """Record chunks written as one batch frame, or as single frames (`frame` None)."""
        self._chunks.extend(chunks)
        if frame is not None:
            self._frames.append(frame)
            self.messages += frame.size

    def on_single(self, resp: Any) -> None:
        """One EnqueueStream response. Raises `Refused` for a failover error."""
        self._feed([outcome_of(resp)])

    def on_batch(self, resp: Any) -> None:
        """One EnqueueBatchStream response; a frame-level failure has one result for all.
        Raises `Refused` (feeding nothing) if an item failed with a failover error."""
        frame = self._frames[0]
        if frame.columns:
            if resp.HasField("error"):
                outcomes: list[Outcome] = [_item_error(resp.error)] * frame.size
            else:
                outcomes = _column_outcomes(resp, frame)
        else:
            results = resp.results
            if len(results) != frame.size and len(results) == 1 and not results[0].success:
                outcomes = [_item_error(results[0].error)] * frame.size
            else:
                outcomes = [outcome_of(r) for r in results]
        self._frames.popleft()
        self.messages -= frame.size
        self._feed(outcomes)

    def _feed(self, outcomes: list[Outcome]) -> None:
        chunks = self._chunks
        popleft = chunks.popleft
        resolve = self._resolve
        i = 0
        n = len(outcomes)
        while i < n:
            head = chunks[0]
            got = head.outcomes
            want = head.n - len(got)
            if want == 1:
                got.append(outcomes[i])
            else:
                got.extend(outcomes[i : i + want])
            i += want
            if len(got) >= head.n:
                popleft()
                resolve(head)

    def take_all(self) -> list[Chunk]:
        """Remove and return every unresolved chunk, in order (the stream ended or failed)."""
        out = list(self._chunks)
        self._chunks.clear()
        self._frames.clear()
        self.messages = 0
        return out
