"""`QueueMachine`: the deterministic replicated queue state machine (pure, no I/O).

Contract:
- `apply(index, batch)` applies one `CommandBatch` at log index `index` and returns one
  result per command. Replicated time is `max(last_now_ms, batch.now_ms)`; before the
  commands run, due delayed messages become ready, due leases expire (redelivery or
  dead-lettering; not a lease the batch releases with `Nack(release=True)`, so that
  release undoes the delivery) and due dedup entries are forgotten.
- A failed command returns its `DoqError` instance (never raised) and changes nothing;
  `Enqueue` returns a list with one `EnqueueResult | DoqError` per item, `Ack` one
  `None | DoqError` per id, `Dequeue` a `list[MessageView]` (with content).
- Every durable change goes through the injected `Store` (records keyed by
  `doq.queues.keys`); message payloads are never kept in memory. `load(records)` rebuilds
  the in-memory indexes from the records alone, so a rebuilt replica behaves identically.
- Queue names, settings and command arguments beyond the bounds of `doq.queues.limits`
  are refused with InvalidArgument (the service checks the same bounds before proposing).

Semantics (documented rules):
- Delivery time: `deliver_at = max(not_before, priority_deliver_at(priority))` where
  `not_before = now + delay_ms` (enqueue / nack delay) and a priority >= 1e9 is read as a
  Unix timestamp in seconds (`priority*1000` ms). A message is delayed while
  `deliver_at > now`.
- A message is delivered at most `max_attempts` times (0 = unlimited): when it would go
  back to the queue after its `max_attempts`-th delivery (lease expiry or nack), it is
  dead-lettered instead: moved as a new message (new id, attempts 0, same content,
  metadata, group, priority; no dedup id) to `dead_letter_queue` if that queue exists,
  else dropped. Either way the source queue's `dead` count grows by one.
- `Nack(release=True)` undoes a delivery: the attempt is taken back, the message is
  placed as it was before (no delay, same priority) and never dead-lettered.
- Message ids come from a replicated counter (`next_id`), starting at 1 and unique
  across the node. Lease ids derive from the `Dequeue`'s random seed and the replicated
  lease counter (`next_lease`, `doq.queues.leaseids`): unguessable, the same on every
  replica; sequential (the counter) for entries without a seed.
- `CreateQueue` of an existing queue with the same type and settings succeeds (retries are
  harmless); with different ones it fails with AlreadyExists. A new queue is refused
  (LimitReached) while the command's `max_queues` (> 0) queues exist. `CreateQueue` and
  `UpdateQueue` return the queue's `QueueInfo` as it is right after the command.
- `take_changed()` names the queues whose `QueueInfo` (settings, counts) may have changed
  since the last call, deleted ones included, so a reader's copy can be refreshed per batch.
- A duplicate enqueue (dedup_id seen within the window) returns the original id with
  duplicate=True, the request's group/priority, and enqueues nothing. At most
  `MAX_DEDUP_ENTRIES` dedup ids are remembered (the earliest-expiring is evicted first).
  Canonical dedup ids (`doq.queues.dedupruns`: what producers stamp) are stored as runs,
  one record per run of consecutive ids; that changes records, not these rules.
- `Dequeue(ack=True)` removes the delivered messages; their views have state in_flight,
  lease_id 0 and lease_expires_at_ms 0.
- Fair queues: weighted round-robin with per-group rate limits (`doq.queues.fair`,
  `doq.queues.group_policy`), decided from replicated time only. `SetGroupPolicy`
  overrides a group's weight or rate; the overrides and token buckets are records of
  their own (`doq.queues.keys.GROUP`), the rotation's cursor and credit part of the
  queue record, so a rebuilt replica rotates and throttles the same way.
"""

from __future__ import annotations

import functools
import itertools
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, islice, pairwise, repeat
from operator import eq, itemgetter, le, lt, mul, ne, not_
from typing import Any, cast

from sortedcontainers import SortedList

from doq.errors import (
    AlreadyExists,
    DoqError,
    FailedPrecondition,
    InvalidArgument,
    LimitReached,
    MessageNotFound,
    QueueNotFound,
    StaleLease,
)
from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues import limits as L
from doq.queues import pairlist
from doq.queues import records as R
from doq.queues.apikeys import KeyRecord, KeyTable
from doq.queues.dedupruns import CANONICAL_LEN, PRODUCER_LEN, Run, Runs, one_run, parse, run_id
from doq.queues.delayed import MASK64, PriorityIndex, ready_key
from doq.queues.fair import FairIndex
from doq.queues.group_policy import INHERIT_RATE, GroupPolicies
from doq.queues.idset import IdSet
from doq.queues.join_tokens import JoinTokens
from doq.queues.leaseids import lease_ids
from doq.queues.model import (
    EnqueueColumnsResult,
    EnqueueResult,
    GroupStats,
    MessageState,
    MessageView,
    QueueCounters,
    QueueInfo,
    QueueSettings,
    QueueStats,
    QueueType,
)
from doq.queues.pairlist import PairList, PairRanges, pair_ranges, range_shift
from doq.queues.redrive import CancelRedrive, Redrives, StartRedrive
from doq.queues.sortedext import extend_sorted, remove_many
from doq.queues.store import Store

MASK32 = (1 << 32) - 1
INT64_MIN, INT64_MAX = L.PRIORITY_MIN, L.PRIORITY_MAX
MAX_DELAY_MS = L.MAX_DELAY_MS
MAX_DEDUP_ENTRIES = 1_000_000
_U64 = struct.Struct(">Q")
_I64 = struct.Struct("<q")  # a record header's priority (its first field)
_HDR = R.MSG_HDR
_HDR_SIZE = R.HDR_SIZE
_HDR_HEAD = struct.Struct("<qQ28xB")  # priority, not_before, flags of a MSG_HDR
assert _HDR_HEAD.size == R.LEASE_END and _HDR_HEAD.unpack(_HDR.pack(-5, 6, 0, 0, 0, 0, 7, 0, 0, 0)[:_HDR_HEAD.size]) == (-5, 6, 7)
_ts = R.priority_deliver_at


def _deliver_at(ps: list[int], bounds: tuple[int, int] | None = None) -> list[int]:
    """`[_ts(p) for p in ps]`: with C calls only when every priority is a timestamp.
    `bounds`: (min(ps), max(ps)) if the caller knows them."""
    lo, hi = bounds if bounds is not None else (min(ps), max(ps))
    if lo >= R.TS_PRIORITY_MIN and hi <= R.MAX_MS // 1000:
        return list(map(mul, ps, repeat(1000)))
    return [_ts(p) if p >= R.TS_PRIORITY_MIN else 0 for p in ps]


class Entry:
    """In-memory entry of one in-flight message (its record lives in the store): its key
    in the lease index (`expires_at << 96 | id << 32 | qnum`), group and lease id.

    A message not in flight has no object: its id is in the queue's `members` and its
    (priority, id) in the ready index or its (deliver_at, id) in the queue's `delayed`
    list. Which one follows from its record: delayed exactly while
    `max(not_before, priority_deliver_at(priority)) > now_ms` (time only grows, and
    `_advance` makes every due message ready before the commands run).
    """

    __slots__ = ("key", "group", "lease_id")

    def __init__(self, key: int, group: str, lease_id: int) -> None:
        self.key = key
        self.group = group
        self.lease_id = lease_id


class Queue:
    __slots__ = ("name", "qtype", "settings", "qnum", "prefix", "members", "inflight", "delayed",
                 "due_key", "index", "dead", "dedup", "runs", "enqueued", "delivered", "acked", "saved_rr")

    def __init__(self, name: str, qtype: QueueType, settings: QueueSettings, qnum: int,
                 dead: int = 0, cursor: str = "", credit: int = 0) -> None:
        self.name = name
        self.qtype = qtype
        self.settings = settings
        self.qnum = qnum
        self.prefix = K.name_prefix(K.MESSAGE, name)
        self.members = IdSet()  # the ids of every message of the queue (any state)
        self.inflight: dict[int, Entry] = {}
        self.delayed = PairList()  # (deliver_at, id) of the delayed messages
        self.due_key: int | None = None  # its entry in the machine's `due` (first deliver_at)
        self.index: PriorityIndex | FairIndex = (
            FairIndex(settings.max_unacked_per_group, cursor, credit, GroupPolicies(
                settings.default_group_weight, settings.default_group_max_per_second))
            if qtype is QueueType.FAIR else PriorityIndex()
        )
        self.saved_rr = (cursor, credit)  # the fair rotation as the queue record holds it
        self.dead = dead
        self.dedup: dict[str, tuple[int, int]] = {}  # dedup_id -> (id, expires_at_ms), not canonical
        self.runs: dict[str, Runs] = {}  # producer -> its runs of canonical dedup ids
        # QueueCounters: in memory only, never part of the replicated state or its digest
        self.enqueued = self.delivered = self.acked = 0

    @property
    def n_delayed(self) -> int:
        return len(self.delayed)

    @property
    def n_inflight(self) -> int:
        return len(self.inflight)

    @property
    def cursor(self) -> str:
        return self.index.cursor if isinstance(self.index, FairIndex) else ""

    @property
    def credit(self) -> int:
        return self.index.credit if isinstance(self.index, FairIndex) else 0

    def record(self) -> bytes:
        self.saved_rr = (self.cursor, self.credit)
        return R.encode_queue(self.qtype, self.settings, self.dead, self.cursor, self.credit)

    def info(self) -> QueueInfo:
        return QueueInfo(self.name, self.qtype, self.settings,
                         QueueStats(self.index.n_ready, self.n_delayed, self.n_inflight, self.dead),
                         QueueCounters(self.enqueued, self.delivered, self.acked))


def _int(v: object, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise InvalidArgument(f"{what} must be an integer within {lo}..{hi}", reason="INVALID_ARGUMENT")
    return v


def _name(v: object, what: str = "queue name") -> str:
    if type(v) is not str or not L.is_queue_name(v):
        raise InvalidArgument(f"invalid {what}: {L.QUEUE_NAME_RULE}", reason="INVALID_QUEUE_NAME")
    return v


def _settings(s: object) -> QueueSettings:
    if not isinstance(s, QueueSettings):
        raise InvalidArgument("invalid settings", reason="INVALID_SETTINGS")
    _int(s.visibility_timeout_ms, 0, L.MAX_VISIBILITY_TIMEOUT_MS, "visibility_timeout_ms")
    _int(s.max_attempts, 0, L.MAX_ATTEMPTS, "max_attempts")
    _int(s.max_unacked_per_group, 0, L.MAX_UNACKED_PER_GROUP, "max_unacked_per_group")
    _int(s.dedup_window_ms, 0, L.MAX_DEDUP_WINDOW_MS, "dedup_window_ms")
    _int(s.default_group_weight, 0, L.MAX_GROUP_WEIGHT, "default_group_weight")
    _int(s.default_group_max_per_second, 0, L.MAX_GROUP_RATE, "default_group_max_per_second")
    if type(s.dead_letter_queue) is not str:
        raise InvalidArgument("invalid dead_letter_queue", reason="INVALID_SETTINGS")
    if s.dead_letter_queue:
        _name(s.dead_letter_queue, "dead_letter_queue")
    return s


def _utf8(v: object, what: str) -> bytes:
    if type(v) is not str:
        raise InvalidArgument(f"{what} must be a string", reason="INVALID_ARGUMENT")
    try:
        b = v.encode()
    except UnicodeError:
        raise InvalidArgument(f"{what} is not valid unicode", reason="INVALID_ARGUMENT") from None
    if len(b) > 0xFFFF:
        raise InvalidArgument(f"{what} too long", reason="INVALID_ARGUMENT")
    return b


def _fresh_dedup_tails(q: Queue, dids: object, contents: list[bytes]) -> list[bytes] | None:
    """Record tails (dedup id bytes + content) when every dedup id is a str, non-empty,
    not canonical, unknown to `q`, distinct and of one encoded length (the column path);
    else None."""
    if type(dids) is not list or set(map(type, dids)) != {str}:
        return None
    fresh = set(dids)
    if len(fresh) != len(dids) or "" in fresh or not q.dedup.keys().isdisjoint(fresh):
        return None
    try:
        dbs = [d.encode() for d in dids]
    except UnicodeError:
        return None
    if len(set(map(len, dbs))) != 1 or len(dbs[0]) > 0xFFFF:
        return None
    if len(dbs[0]) == CANONICAL_LEN and any(parse(d) for d in dids):
        return None
    return [d + b for d, b in zip(dbs, contents, strict=True)]


def _columns_result(results: list[EnqueueResult | DoqError]) -> EnqueueColumnsResult:
    """The per-message results of the general path, as columns."""
    ids: list[int] = []
    dups: list[int] = []
    errors: dict[int, DoqError] = {}
    deliver: list[int] = []
    for i, r in enumerate(results):
        if isinstance(r, DoqError):
            errors[i] = r
            ids.append(0)
            deliver.append(0)
            continue
        ids.append(r.id)
        deliver.append(r.deliver_at_ms)
        if r.duplicate:
            dups.append(i)
    return EnqueueColumnsResult(ids, dups, deliver if any(deliver) else [], errors)


def _metadata(md: object) -> bytes:
    if type(md) is not dict:
        raise InvalidArgument("metadata must be a map of strings", reason="INVALID_METADATA")
    if not md:
        return b""
    for k, v in md.items():
        if type(k) is not str or type(v) is not str:
            raise InvalidArgument("metadata must be a map of strings", reason="INVALID_METADATA")
    try:
        return R.encode_metadata(md)
    except UnicodeError:
        raise InvalidArgument("metadata is not valid unicode", reason="INVALID_METADATA") from None


_CHUNK = 1024  # records `_Loader.feed_all` takes at a time
# a rebuild's delayed records joined to a timestamp queue's late pairs by `add_many` up to
# this many; more: one bulk build of both (`PairList.merged_unsorted`)
MERGE_BY_ADD_MAX = 4096
# a load split in two processes: a part of a delayed queue's ready pairs with at least this
# many is distributed into pair ranges (`PairRanges`) where it was loaded, not by the start's
# bulk build; fewer: sent and joined as columns
RANGES_MIN = 1 << 14
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_FLAGS_AT = struct.calcsize("<qQ28x")  # the flags byte in a `_HDR_HEAD`
_IN_FLIGHT_BIT = bytes(1 if b & R.FLAG_IN_FLIGHT else 0 for b in range(256))  # a translate table
_NOT_BEFORE = struct.Struct("<8xQ")  # the not-before field of a `_HDR_HEAD`
_GLEN_AT = struct.calcsize("<qQQQQIB")  # the group length (u16 LE) in a MSG_HDR
_HOST_LITTLE = array("H", [1]).tobytes()[0] == 1


def _column(buf: bytes, at: int, stride: int, typecode: str, *, little: bool) -> array[int]:
    """The 8-byte integers at `at`, `at + stride`, ... of `buf` (little- or big-endian)
    as an array of `typecode`: eight strided byte copies, no per-item Python."""
    n = len(buf) // stride
    out = bytearray(8 * n)
    for j in range(8):
        out[j::8] = buf[at + j :: stride]
    col = array(typecode)
    col.frombytes(out)
    if little != _HOST_LITTLE:
        col.byteswap()
    return col


_SIGN = 1 << 63
_TOP_BIT = bytes(128) + b"\x01" * 128  # a translate table: 1 for a byte >= 128, else 0


@functools.lru_cache(maxsize=8)
def _repeated(word: int, n: int) -> int:
    """The int of `n` 64-bit words each `word` (0 <= word < 2**64): a bytes repetition,
    not a multiplication of big ints (cached: one rebuild asks for the same few)."""
    return int.from_bytes(word.to_bytes(8, "little") * n, "little")


def _late_bytes(ps: Sequence[int], threshold: int, bounds: tuple[int, int] | None = None) -> bytes:
    """A byte per item of `ps`: 1 where it is > `threshold`, else 0. `bounds`: (min, max)
    of `ps` when known.

    For a `'q'` array on a little-endian host, word arithmetic on one int: with every p
    and `threshold` >= 0, p + 2**63 - (threshold + 1) lies in [0, 2**64) (no carry out of
    its word) and has its top bit set iff p > threshold; else, for a span below 2**63, the
    same on p - min (in offset binary: no borrow across words). The top bits are read off
    each word's last byte. Otherwise one C call per item."""
    n = len(ps)
    if not n:
        return b""
    lo, top = bounds if bounds is not None else (min(ps), max(ps))
    if top <= threshold:
        return bytes(n)
    if lo > threshold:
        return b"\x01" * n
    if type(ps) is not array or ps.typecode != "q" or not _HOST_LITTLE or top - lo >= _SIGN:
        return bytes(map(threshold.__lt__, ps))
    # here lo <= threshold < top
    if lo >= 0:
        words = int.from_bytes(ps, "little") + _repeated(_SIGN - threshold - 1, n)
    else:  # p - lo per word, then as above with threshold - lo
        rel = (int.from_bytes(ps, "little") ^ _repeated(_SIGN, n)) - _repeated(lo + _SIGN, n)
        words = rel + _repeated(_SIGN - (threshold - lo) - 1, n)
    return words.to_bytes(8 * n, "little")[7::8].translate(_TOP_BIT)


_NONZERO = bytes([0] + [1] * 255)  # a translate table: 1 for a byte that is not 0
_NOT_BIT = bytes([1, 0]) + bytes(254)  # a translate table: 0 <-> 1


def _runs(names: bytes, size: int, n: int) -> list[tuple[bytes, int]]:
    """(name, count) of each run of equal names in `names`: `n` names of `size` bytes each,
    back to back. Where a run starts is found by C calls over the chunk (the names XORed
    with the names one before, as ints; the bytes of each name's difference ORed together
    by strided slices), then one step per run."""
    if size == 0 or names == names[:size] * n:
        return [(names[:size], n)]
    diff = (int.from_bytes(names[size:], "little") ^ int.from_bytes(names[:-size], "little")).to_bytes(
        (n - 1) * size, "little")
    acc = 0
    for k in range(size):
        acc |= int.from_bytes(diff[k::size], "little")
    starts = acc.to_bytes(n - 1, "little").translate(_NONZERO)  # byte j: name j + 1 starts a run
    out = []
    prev = 0
    j = starts.find(1)
    while j >= 0:
        out.append((names[prev * size : (prev + 1) * size], j + 1 - prev))
        prev = j + 1
        j = starts.find(1, prev)
    out.append((names[prev * size : (prev + 1) * size], n - prev))
    return out


class _QueueLoad:
    """What `_Loader` gathers for one queue (arrays: no int object per message)."""

    __slots__ = ("q", "ids", "ascending", "ready_p", "ready_i", "p_lo", "p_hi", "late_above", "ready_keys", "infl",
                 "dl_at", "dl_id", "names", "ranges")

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.ids = array("Q")
        # `ids` is known to ascend (chunks of ascending ids, each after the one before);
        # False: not known (`finish` checks)
        self.ascending = True
        # every priority in `ready_p` lies in [p_lo, p_hi] (kept by the columns' path;
        # p_lo > p_hi: not known)
        self.p_lo, self.p_hi = 0, -1
        self.ready_p = array("q")  # a delayed queue's ready (priority, id), in id order
        self.ready_i = array("Q")
        # None, or: the pairs of `ready_p`/`ready_i` whose priority is above it are not
        # ready but delayed until priority * 1000 ms (chunks of timestamp priorities kept
        # whole; `finish` tells them apart in one pass: `_defer_late`)
        self.late_above: int | None = None
        # a fair queue's ready (priorities, ids) by group
        self.ready_keys: dict[str, tuple[array[int], array[int]]] = {}
        self.infl: dict[str, int] = {}
        self.dl_at = array("q")
        self.dl_id = array("Q")
        self.names: dict[str, str] = {}  # interned group names
        # a delayed queue's ready pairs distributed apart (a split load's parts:
        # `_Loader.prepare_ranges`, the worker's segments), besides those in `ready_p`; the
        # bounds `p_lo`, `p_hi` do not count them
        self.ranges: list[PairRanges] = []


class UpperLoadError(Exception):
    """`QueueMachine.load`'s `upper` part failed (raised it, or gave segments that do not
    fit): the machine is half-loaded."""


# a part of a load made elsewhere (`_Loader.segments`, `_Loader.absorb`): a chunk's records
# ("r", [(key, value)]), or a run of one queue's columns ("c", queue name, ids ascend, the
# ready priorities' bounds (lo > hi: not known), `late_above`, ids, ready priorities,
# ready ids, delayed times, delayed ids (arrays' machine bytes), [(group, priorities, ids)],
# [(id, record)] of the run's records in flight, in key order: their ids among the ids,
# the ready pairs distributed into ranges (`PairRanges.to_wire`; None: all in the columns))
RowSegment = tuple[str, list[tuple[bytes, bytes]]]
ColumnSegment = tuple[str, str, bool, int, int, "int | None", bytes, bytes, bytes, bytes, bytes,
                      list[tuple[str, bytes, bytes]], list[tuple[int, bytes]], "tuple[Any, ...] | None"]
Segment = RowSegment | ColumnSegment


def _column_segment(name: str, ld: _QueueLoad, in_flight: list[tuple[int, bytes]],
                    ranges_n: int | None = None) -> ColumnSegment:
    """The run `ld` as a segment; `ranges_n`: its ready pairs distributed into ranges
    (`_ranges_of`, for a queue of about that many pairs) when there are enough of them."""
    ranges = None
    if ranges_n is not None and len(ld.ready_p) >= RANGES_MIN and ld.q.qtype is not QueueType.FAIR:
        bounds = (ld.p_lo, ld.p_hi) if ld.p_lo <= ld.p_hi else None
        got = _ranges_of(ld.ready_p, ld.ready_i, bounds, max(ranges_n, len(ld.ready_p)))
        if got is not None:
            ranges = got.to_wire()
            ld.ready_p, ld.ready_i = array("q"), array("Q")
    return ("c", name, ld.ascending, ld.p_lo, ld.p_hi, ld.late_above, ld.ids.tobytes(), ld.ready_p.tobytes(),
            ld.ready_i.tobytes(), ld.dl_at.tobytes(), ld.dl_id.tobytes(),
            [(g, ps.tobytes(), ids.tobytes()) for g, (ps, ids) in ld.ready_keys.items()], in_flight, ranges)


def _ranges_of(ps: array[int], ids: array[int], bounds: tuple[int, int] | None, n_est: int) -> PairRanges | None:
    """A split load's part of a queue's ready pairs (priority, id) distributed into
    `PairRanges` on the grid a bulk build of about `n_est` pairs over their span would use
    (both parts on the same grid, as a rule: their ranges joined hold what one bulk build's
    would; half as wide ranges cost ~25 % more here, appends to twice as many arrays), or
    None: the pairs ascend already (a bulk build takes them as they are), do not fit a
    grid, or are bunched on too few priorities for one (its ranges would pass the unsorted
    chunks' cap on average and be sorted whole at the join, after both parts paid for the
    distribution: a bulk build of the columns costs less)."""
    if all(map(le, ps, islice(ps, 1, None))):
        return None
    lo, hi = bounds if bounds is not None else (min(ps), max(ps))
    shift = range_shift(hi - lo, n_est, pairlist.BUCKET_LOADS * pairlist.LOAD)
    if n_est > (((hi - lo) >> shift) + 1) * pairlist.UNSORTED_LOADS * pairlist.LOAD:
        return None
    return pair_ranges(ps, ids, shift, (lo, hi))


def _absorb(dst: _QueueLoad, src: _QueueLoad) -> None:
    """Join `src` (the columns of records after all of `dst`'s, of no record in flight) to
    `dst` as `_Loader._feed_columns` joins a chunk: ids (and whether they still ascend), the
    ready priorities' bounds (kept only while known, set if none are ready yet), the late
    threshold, the ready and delayed pairs, a fair queue's groups in the order they came."""
    if src.ids:
        if dst.ascending and (not src.ascending or (dst.ids and src.ids[0] <= dst.ids[-1])):
            dst.ascending = False
        dst.ids.extend(src.ids)
    if src.p_lo <= src.p_hi:
        if dst.p_lo <= dst.p_hi:
            dst.p_lo, dst.p_hi = min(src.p_lo, dst.p_lo), max(src.p_hi, dst.p_hi)
        elif not dst.ready_p:
            dst.p_lo, dst.p_hi = src.p_lo, src.p_hi
    dst.ranges.extend(src.ranges)
    if src.late_above is not None:
        dst.late_above = src.late_above
    dst.ready_p.extend(src.ready_p)
    dst.ready_i.extend(src.ready_i)
    dst.dl_at.extend(src.dl_at)
    dst.dl_id.extend(src.dl_id)
    intern, ready = dst.names.setdefault, dst.ready_keys
    for g, (ps, ids) in src.ready_keys.items():
        g = intern(g, g)
        pair = ready.get(g)
        if pair is None:
            pair = ready[g] = (array("q"), array("Q"))
        pair[0].extend(ps)
        pair[1].extend(ids)


class _Loader:
    """Rebuilds the message indexes from message records (a queue's records in key
    order is fastest): no per-message object but in-flight entries."""

    def __init__(self, m: QueueMachine) -> None:
        self.m = m
        self.per_q: dict[str, _QueueLoad] = {}
        self.leases: list[int] = []
        self.meta_seen = False  # the meta record (now_ms) was loaded
        self.pending: list[tuple[bytes, bytes]] = []  # fed before their queue or the meta
        # `segments`: the records in flight `_place` meets, (id, record), instead of indexing them
        self.in_flight_out: list[tuple[int, bytes]] | None = None

    def _queue_of(self, key: bytes, last: bool) -> _QueueLoad | None:
        _, name, _ = K.split_name(key)
        cur = self.per_q.get(name)
        if cur is None:
            if not last and (not self.meta_seen or name not in self.m.queues):
                return None
            cur = self.per_q[name] = _QueueLoad(self.m.queues[name])
        return cur

    def feed(self, key: bytes, rec: bytes) -> None:
        self._feed_rows(((key, rec),))

    def feed_all(self, items: Iterable[tuple[bytes, bytes]], offset: int = 0,
                 overrides: Mapping[bytes, bytes | None] | None = None, *, last: bool = False,
                 ordered: bool = False, stop: bytes | None = None) -> None:
        """Index message records (key, value): the record is `value[offset:]`; a key in
        `overrides` has that value instead (None: skip it). A record whose queue record
        or the meta record is still to come is kept for `finish` (unless `last`).
        `ordered`: the items come in ascending key order (an LMDB cursor's; not checked).
        `stop` (with `ordered`): the items from this key on are left out (and the
        iteration stops within a chunk of it).

        Taken in chunks of `_CHUNK`: a chunk of one delayed queue's records none of which
        is in flight or held by a not-before time is indexed as columns (`_feed_columns`,
        C-level byte slicing, no per-record Python; timestamp priorities told due or not
        as columns too), and so is a chunk of one fair queue's records that are all ready,
        by runs of one group (`_fair_columns`); any other chunk record by record
        (`_feed_rows`). All index the same."""
        it = iter(items)
        okeys = sorted(overrides) if overrides and not last else []
        while chunk := list(islice(it, _CHUNK)):
            end = stop is not None and chunk[-1][0] >= stop
            if end:  # the items from `stop` on are not this load's (`QueueMachine.load`'s `upper`)
                chunk = chunk[: bisect_left(chunk, stop, key=_FIRST)]
                if not chunk:
                    return
            if last or not self._feed_columns(chunk, offset, overrides, okeys, ordered):
                self._feed_rows(chunk, offset, overrides, last=last)
            if end:
                return

    def segments(self, items: Iterable[tuple[bytes, bytes]], offset: int = 0,
                 overrides: Mapping[bytes, bytes | None] | None = None,
                 progress: Callable[[], None] | None = None, split_records: int | None = None) -> list[Segment]:
        """What `feed_all(items, offset, overrides, ordered=True)` would add, as segments
        for `absorb` (the load of a key range in another process: `doq.storage.load_worker`):
        the chunks taken as columns (`_feed_columns`), as runs of one queue's columns with
        their records in flight (`ColumnSegment`); any other chunk as its records (key,
        value) with the overrides applied (`RowSegment`), for the absorbing loader to take
        record by record. `items` ascend by key (a cursor's); this loader's own state
        (`per_q`, `pending`) is left as it was. `progress` is called once per chunk.
        `split_records` (about how many records the queue of the first item holds, on both
        sides of the split): a run's many ready pairs of a delayed queue are sent
        distributed into pair ranges (`_ranges_of`: the grid for that many pairs for the
        first queue, for the run's own for the others), the bulk build's distribution done
        here; None: as columns."""
        it = iter(items)
        first: str | None = None  # the first item's queue (the one split between the processes)

        def close(name: str, ld: _QueueLoad, in_flight: list[tuple[int, bytes]]) -> ColumnSegment:
            n = None if split_records is None else split_records if name == first else len(ld.ready_p)
            return _column_segment(name, ld, in_flight, n)

        okeys = sorted(overrides) if overrides else []
        out: list[Segment] = []
        run: _QueueLoad | None = None
        run_name = ""
        run_in_flight: list[tuple[int, bytes]] = []
        for chunk in iter(lambda: list(islice(it, _CHUNK)), []):
            if progress is not None:
                progress()
            try:
                name = K.split_name(chunk[0][0])[1]
            except ValueError:
                name = None
            if first is None:
                first = name or ""
            held = self.per_q.get(name) if name is not None else None
            scratch: _QueueLoad | None = None
            in_flight: list[tuple[int, bytes]] = []
            if name is not None and self.meta_seen and name in self.m.queues:
                scratch = self.per_q[name] = _QueueLoad(self.m.queues[name])
            self.in_flight_out = in_flight
            try:
                took = scratch is not None and self._feed_columns(chunk, offset, overrides, okeys, True)
            finally:
                self.in_flight_out = None
                if scratch is not None:
                    if held is None:
                        del self.per_q[name]  # type: ignore[arg-type]
                    else:
                        self.per_q[name] = held  # type: ignore[index]
            if took:
                assert scratch is not None and name is not None
                if run is None or run_name != name:
                    if run is not None:
                        out.append(close(run_name, run, run_in_flight))
                    run, run_name, run_in_flight = _QueueLoad(scratch.q), name, []
                _absorb(run, scratch)
                run_in_flight.extend(in_flight)
                continue
            if run is not None:
                out.append(close(run_name, run, run_in_flight))
                run, run_in_flight = None, []
            rows: list[tuple[bytes, bytes]] = []
            for k, v in chunk:
                if overrides is not None and k in overrides:
                    o = overrides[k]
                    if o is None:
                        continue
                    v = o
                rows.append((bytes(k), bytes(v)))
            out.append(("r", rows))
        if run is not None:
            out.append(close(run_name, run, run_in_flight))
        return out

    def prepare_ranges(self, split_name: str | None, split_records: int | None) -> None:
        """Before a split load's other part is joined (`absorb`): distribute each delayed
        queue's many ready pairs fed so far into pair ranges (`_ranges_of`; `split_records`:
        about how many records queue `split_name`, the one split between the processes,
        holds in all; another queue's grid is for its own pairs), so that `finish` joins
        ranges rather than distributing every pair itself. Nothing if records wait for their
        queue (`pending`)."""
        if self.pending:
            return
        for name, ld in self.per_q.items():
            if ld.q.qtype is QueueType.FAIR or len(ld.ready_p) < RANGES_MIN:
                continue
            n = split_records if name == split_name and split_records is not None else len(ld.ready_p)
            bounds = (ld.p_lo, ld.p_hi) if ld.p_lo <= ld.p_hi else None
            got = _ranges_of(ld.ready_p, ld.ready_i, bounds, max(n, len(ld.ready_p)))
            if got is not None:
                ld.ranges.append(got)
                ld.ready_p, ld.ready_i = array("q"), array("Q")

    def absorb(self, segments: Iterable[Segment], offset: int = 0) -> None:
        """Add what `segments` (of `segments`, over keys after every key fed so far) hold,
        as feeding their records here would (`feed_all(..., ordered=True)`): columns
        joined to their queue's, rows fed record by record. Raises ValueError for a
        segment that does not fit (an unknown queue, columns of unequal lengths, groups of
        a queue that is not fair); what was absorbed before it stays (the caller loads
        again)."""
        for seg in segments:
            if seg[0] == "r":
                self._feed_rows(cast(RowSegment, seg)[1], offset)
                continue
            tag, name, ascending, p_lo, p_hi, late_above, ids_b, rp_b, ri_b, at_b, di_b, groups, in_flight, ranges = cast(
                ColumnSegment, seg)
            q = self.m.queues.get(name) if self.meta_seen and tag == "c" else None
            if q is None:
                raise ValueError(f"columns of no queue {name!r}")
            src = _QueueLoad(q)
            if ranges is not None:
                if q.qtype is QueueType.FAIR:
                    raise ValueError(f"pair ranges of fair queue {name!r}")
                src.ranges.append(PairRanges.from_wire(ranges))
            src.ascending, src.p_lo, src.p_hi, src.late_above = ascending, p_lo, p_hi, late_above
            for col, raw in ((src.ids, ids_b), (src.ready_p, rp_b), (src.ready_i, ri_b), (src.dl_at, at_b),
                             (src.dl_id, di_b)):
                col.frombytes(raw)
            fair = q.qtype is QueueType.FAIR
            if len(src.ready_p) != len(src.ready_i) or len(src.dl_at) != len(src.dl_id) or (groups and not fair):
                raise ValueError(f"malformed columns of queue {name!r}")
            for g, ps_b, gi_b in groups:
                pair = src.ready_keys[g] = (array("q"), array("Q"))
                pair[0].frombytes(ps_b)
                pair[1].frombytes(gi_b)
                if len(pair[0]) != len(pair[1]):
                    raise ValueError(f"malformed columns of queue {name!r}")
            if not all(len(rec) >= _HDR_SIZE and _HDR_HEAD.unpack_from(rec)[2] & R.FLAG_IN_FLIGHT
                       for _, rec in in_flight):
                raise ValueError(f"a record in flight of queue {name!r} that is not one")
            cur = self.per_q.get(name)
            if cur is None:
                cur = self.per_q[name] = _QueueLoad(q)
            _absorb(cur, src)
            for id_, rec in in_flight:  # their ids are among the columns' ids
                self._other(cur, id_, rec, 0)

    def _feed_columns(self, chunk: list[tuple[bytes, bytes]], offset: int,
                      overrides: Mapping[bytes, bytes | None] | None,
                      okeys: Sequence[bytes] | None = None, ordered: bool = False) -> bool:
        """Index the chunk as columns if it qualifies (see `feed_all`); False (nothing
        done) if not. `okeys`: the keys of `overrides`, sorted (sorted here if None);
        `ordered`: the chunk's keys are ascending (not checked)."""
        try:
            cur = self._queue_of(chunk[0][0], False)
        except ValueError:
            return False
        if cur is None:
            return False
        keys = list(map(_FIRST, chunk))
        vals = list(map(_SECOND, chunk))
        fair = cur.q.qtype is QueueType.FAIR
        # positions (ascending) of the chunk's records left out (gone) when they are cut out
        # of the columns rather than the chunk (a delayed queue's: `_drop`)
        drop: list[int] = []
        if overrides:
            if not ordered and not all(map(lt, keys, islice(keys, 1, None))):
                return False  # keys not in order: record by record
            # the overridden keys within the chunk's range, found by bisecting the sorted
            # keys of the map (no lookup per record)
            if okeys is None:
                okeys = sorted(overrides)
            lo = bisect_left(okeys, keys[0])
            hi = bisect_right(okeys, keys[-1], lo)
            inner = okeys[lo:hi]
            pos = list(map(bisect_left, repeat(keys), inner))  # each < len(keys): h <= keys[-1]
            at = list(compress(pos, map(eq, map(keys.__getitem__, pos), inner)))
            if at and not fair and len(at) < len(keys) and not any(map(overrides.__getitem__, map(keys.__getitem__, at))):
                drop = at  # records left out only (gone, the common case): cut from the columns
            elif at and not any(map(overrides.__getitem__, map(keys.__getitem__, at))):
                # records left out only: a mask over the chunk
                keep = bytearray(b"\x01") * len(keys)
                deque(map(keep.__setitem__, at, repeat(0)), 0)
                keys = list(compress(keys, keep))
                if not keys:
                    return True
                vals = list(compress(vals, keep))
            elif at:  # the chunk with the overridden records replaced (or left out: None)
                kept: list[tuple[bytes, bytes]] = []
                prev = 0
                for p in at:
                    kept.extend(chunk[prev:p])
                    o = overrides[keys[p]]
                    if o is not None:
                        kept.append((keys[p], o))
                    prev = p + 1
                kept.extend(chunk[prev:])
                if not kept:
                    return True
                chunk = kept
                keys = list(map(_FIRST, chunk))
                vals = list(map(_SECOND, chunk))
        n = len(keys)
        prefix = cur.q.prefix
        plen = len(prefix)
        klen = plen + 8
        kb = b"".join(keys)
        if len(kb) != n * klen or any(kb[i::klen] != prefix[i : i + 1] * n for i in range(plen)):
            return False  # keys of other queues (or malformed): record by record
        hs = _HDR_HEAD.size
        # the headers' bytes: record j's at `h0 + j * hs` of `heads`. Records of one length
        # (the common case: one payload size) are joined whole, one copy of the chunk's
        # bytes, rather than a new bytes object per record
        width = len(vals[0])
        joined: tuple[bytes, int] | None = None
        if width >= offset + hs and list(map(len, vals)).count(width) == n:
            heads, h0, hs = b"".join(vals), offset, width
            joined = heads, width
        else:
            heads, h0 = b"".join(map(itemgetter(slice(offset, offset + hs)), vals)), 0
            if len(heads) != n * hs:
                return False
        ps = _column(heads, h0, hs, "q", little=True)
        ids = _column(kb, plen, klen, "Q", little=False)
        # the records that are not plainly ready: in flight, with a not-before time, or a
        # timestamp priority (found in C but for the last two, rare in most queues)
        special: set[int] = set()
        flags = heads[h0 + _FLAGS_AT :: hs].translate(_IN_FLIGHT_BIT)
        j = flags.find(1)
        while j >= 0:
            special.add(j)
            j = flags.find(1, j + 1)
        if any(heads[h0 + 8 + b :: hs].count(0) != n for b in range(8)):
            nb = _NOT_BEFORE.unpack_from
            special.update(j for j in range(n) if nb(heads, h0 + j * hs)[0])
        if drop:
            special = self._drop(drop, ps, ids, special)
            if not ps:
                return True
        if fair:
            if special or max(ps) >= R.TS_PRIORITY_MIN:
                return False  # record by record
            return self._fair_columns(cur, vals, ps, ids, offset, joined, ordered)
        self._add_ids(cur, ids, ordered)
        # the ready pairs' priorities are some of `ps` (here or by `_place`): their bounds
        lo, top = min(ps), max(ps)
        if cur.p_lo <= cur.p_hi:
            cur.p_lo, cur.p_hi = min(lo, cur.p_lo), max(top, cur.p_hi)
        elif not cur.ready_p:
            cur.p_lo, cur.p_hi = lo, top
        if top >= R.TS_PRIORITY_MIN:
            if not special:  # timestamp priorities only: due or not, told apart at `finish`
                if not self._defer_late(cur, top):  # or here, as columns
                    self._split_due(cur, ps, ids, (lo, top))
                    return True
                cur.ready_p.extend(ps)
                cur.ready_i.extend(ids)
                return True
            ts_min = R.TS_PRIORITY_MIN
            special.update(j for j, p in enumerate(ps) if p >= ts_min)
        if not special:
            cur.ready_p.extend(ps)
            cur.ready_i.extend(ids)
            return True
        if drop:  # the records by position as in the cut columns
            keep = bytearray(b"\x01") * len(vals)
            deque(map(keep.__setitem__, drop, repeat(0)), 0)
            vals = list(compress(vals, keep))
        prev = 0
        for j in sorted(special):
            cur.ready_p.extend(ps[prev:j])
            cur.ready_i.extend(ids[prev:j])
            self._place(cur, ids[j], vals[j], offset)
            prev = j + 1
        cur.ready_p.extend(ps[prev:])
        cur.ready_i.extend(ids[prev:])
        return True

    @staticmethod
    def _drop(drop: list[int], ps: array[int], ids: array[int], special: set[int]) -> set[int]:
        """Cut the records at the positions `drop` (ascending) out of the chunk's columns
        `ps` and `ids` (in place: a memmove per record cut); `special` (positions) without
        them, renumbered as in the cut columns, is returned."""
        for j in reversed(drop):
            del ps[j], ids[j]
        return {j - bisect_left(drop, j) for j in special.difference(drop)} if special else special

    @staticmethod
    def _add_ids(cur: _QueueLoad, ids: array[int], ordered: bool) -> None:
        """Count a chunk's ids (`ordered`: they ascend) and keep `cur.ascending`."""
        if cur.ascending and (not ordered or (cur.ids and ids[0] <= cur.ids[-1])):
            cur.ascending = False
        cur.ids.extend(ids)

    def _fair_columns(self, cur: _QueueLoad, vals: Sequence[bytes], ps: array[int], ids: array[int],
                      offset: int, joined: tuple[bytes, int] | None = None, ordered: bool = False) -> bool:
        """Index a chunk of a fair queue's ready records (none in flight, delayed or with a
        timestamp priority) by runs of one group (a group's messages enqueued together
        are adjacent): one slice of the columns per run, not a record at a time. False
        (nothing done) if the records are malformed. `joined`: the records joined whole,
        each of the same width, and that width (the group names are then cut by strides)."""
        n = len(vals)
        gl = array("H")
        if joined is not None:
            buf, width = joined
            glb = bytearray(2 * n)
            glb[0::2] = buf[offset + _GLEN_AT :: width]
            glb[1::2] = buf[offset + _GLEN_AT + 1 :: width]
            gl.frombytes(glb)
        else:
            gl.frombytes(b"".join(map(itemgetter(slice(offset + _GLEN_AT, offset + _GLEN_AT + 2)), vals)))
        if len(gl) != n:
            return False
        if not _HOST_LITTLE:
            gl.byteswap()
        at = offset + _HDR_SIZE
        lo, hi = min(gl), max(gl)
        try:
            if lo == hi:
                if joined is not None:
                    if at + lo > width:
                        return False
                    gbs = bytearray(n * lo)
                    for k in range(lo):
                        gbs[k::lo] = buf[at + k :: width]
                    gb = bytes(gbs)
                else:
                    gb = b"".join(map(itemgetter(slice(at, at + lo)), vals))
                    if len(gb) != n * lo:
                        return False
                runs = [(b.decode(), k) for b, k in _runs(gb, lo, n)]
            else:
                names = [bytes(v[at : at + g]) for v, g in zip(vals, gl, strict=True)]
                if any(len(b) != g for b, g in zip(names, gl, strict=True)):
                    return False
                runs = [(b.decode(), len(list(grp))) for b, grp in itertools.groupby(names)]
        except UnicodeDecodeError:
            return False
        self._add_ids(cur, ids, ordered)
        intern, ready = cur.names.setdefault, cur.ready_keys
        start = 0
        for g, k in runs:
            g = intern(g, g)
            pair = ready.get(g)
            if pair is None:
                pair = ready[g] = (array("q"), array("Q"))
            pair[0].extend(ps[start : start + k])
            pair[1].extend(ids[start : start + k])
            start += k
        return True

    def _defer_late(self, cur: _QueueLoad, top: int) -> bool:
        """Whether a chunk of a delayed queue's records, neither in flight nor held by a
        not-before time, whose largest priority is `top`, may go to the ready pairs whole,
        the late ones among them told apart by `finish` (`cur.late_above` set if some may
        be late): True when now is within [0, MAX_MS) and no late record's time is cut to
        MAX_MS. Then a record is late iff its priority is above one threshold (a timestamp
        p with p * 1000 > now), and every ready pair of the queue (here, by `_place` or by
        `_feed_rows`) is at or below it; the delayed list's (p * 1000, id) order is the
        (p, id) order. Measured at 4.75M timestamp records: 1.7-1.9 s of `_split_due`'s
        passes (four `compress` a chunk) against one split of the pairs at `finish`."""
        now = self.m.now_ms
        if not (0 <= now < R.MAX_MS) or top * 1000 > R.MAX_MS:
            return False
        threshold = max(R.TS_PRIORITY_MIN - 1, now // 1000)
        if top > threshold:
            cur.late_above = threshold
        return True

    def _split_due(self, cur: _QueueLoad, ps: Sequence[int], ids: Sequence[int],
                   bounds: tuple[int, int] | None = None) -> None:
        """Index records of a delayed queue that are neither in flight nor held by a
        not-before time: ready, or delayed until their timestamp priority's time (what
        `_place` does one by one). `bounds`: (min, max) of `ps`, when known."""
        ts_min, max_ms, now = R.TS_PRIORITY_MIN, R.MAX_MS, self.m.now_ms
        if 0 <= now < max_ms:
            # told apart in C: a record's time min(p * 1000, MAX_MS) (0 for a priority
            # that is no timestamp) is after now iff p >= ts_min and p * 1000 > now
            # a byte (0 or 1) per record: searched and inverted by C calls
            late = _late_bytes(ps, max(ts_min - 1, now // 1000), bounds)
            if late.find(1) < 0:
                cur.ready_p.extend(ps)
                cur.ready_i.extend(ids)
                return
            some = late.find(0) >= 0
            late_ps = array("q", itertools.compress(ps, late)) if some else ps
            top = max(late_ps) if bounds is None else bounds[1]  # the largest p is late
            if top * 1000 <= max_ms and _HOST_LITTLE and type(late_ps) is array:
                # p * 1000 of each (all > 0, none past MAX_MS) as one int's 64-bit words
                cur.dl_at.frombytes((int.from_bytes(late_ps, "little") * 1000).to_bytes(8 * len(late_ps), "little"))
            else:
                ats: Iterable[int] = map((1000).__mul__, late_ps)
                if top * 1000 >= max_ms:
                    ats = map(min, ats, itertools.repeat(max_ms))
                cur.dl_at.extend(ats)
            if not some:
                cur.dl_id.extend(ids)
                return
            cur.dl_id.extend(itertools.compress(ids, late))
            due = late.translate(_NOT_BIT)
            cur.ready_p.extend(itertools.compress(ps, due))
            cur.ready_i.extend(itertools.compress(ids, due))
            return
        ats = [(p * 1000 if p * 1000 < max_ms else max_ms) if p >= ts_min else 0 for p in ps]
        if min(ats) > now:  # all delayed (e.g. the future part of a timestamp backlog)
            cur.dl_at.extend(ats)
            cur.dl_id.extend(ids)
            return
        late_l = [at > now for at in ats]
        if any(late_l):
            due_l = [not x for x in late_l]
            cur.dl_at.extend(itertools.compress(ats, late_l))
            cur.dl_id.extend(itertools.compress(ids, late_l))
            cur.ready_p.extend(itertools.compress(ps, due_l))
            cur.ready_i.extend(itertools.compress(ids, due_l))
            return
        cur.ready_p.extend(ps)
        cur.ready_i.extend(ids)

    def _place(self, cur: _QueueLoad, id_: int, rec: bytes, offset: int) -> None:
        """Index one record of a delayed queue (its id already counted)."""
        prio, not_before, flags = _HDR_HEAD.unpack_from(rec, offset)
        if flags & R.FLAG_IN_FLIGHT:
            if self.in_flight_out is not None:
                self.in_flight_out.append((id_, bytes(rec[offset:])))
                return
            self._other(cur, id_, rec, offset)
            return
        at = max(not_before, _ts(prio))
        if at > self.m.now_ms:
            cur.dl_at.append(at)
            cur.dl_id.append(id_)
            return
        cur.ready_p.append(prio)
        cur.ready_i.append(id_)

    def _feed_rows(self, items: Iterable[tuple[bytes, bytes]], offset: int = 0,
                   overrides: Mapping[bytes, bytes | None] | None = None, *, last: bool = False) -> None:
        """`feed_all`, one record at a time."""
        unpack = _HDR_HEAD.unpack_from
        unpack_id = _U64.unpack_from
        now = self.m.now_ms
        inflight_flag = R.FLAG_IN_FLIGHT
        ts_min = R.TS_PRIORITY_MIN
        max_ms = R.MAX_MS
        cur: _QueueLoad | None = None
        prefix = b"\xff"
        plen = klen = 0
        fair = False
        ids_ap = rp_ap = ri_ap = dl_at_ap = dl_id_ap = None
        for key, rec in items:
            if overrides is not None and key in overrides:
                o = overrides[key]
                if o is None:
                    continue
                rec = o
            if len(key) != klen or not key.startswith(prefix):
                cur = self._queue_of(key, last)
                if cur is None:
                    self.pending.append((bytes(key), bytes(rec[offset:])))
                    prefix = b"\xff"
                    klen = 0
                    continue
                prefix = cur.q.prefix
                plen = len(prefix)
                klen = plen + 8
                fair = cur.q.qtype is QueueType.FAIR
                cur.ascending = False  # ids and priorities by record: `finish` checks the order
                cur.p_lo, cur.p_hi = 0, -1
                ids_ap, rp_ap, ri_ap = cur.ids.append, cur.ready_p.append, cur.ready_i.append
                dl_at_ap, dl_id_ap = cur.dl_at.append, cur.dl_id.append
            assert cur is not None and ids_ap is not None and rp_ap is not None and ri_ap is not None
            id_ = unpack_id(key, plen)[0]
            prio, not_before, flags = unpack(rec, offset)
            ids_ap(id_)
            if flags & inflight_flag or fair:
                self._other(cur, id_, rec, offset)
                continue
            if not_before or prio >= ts_min:  # max(not_before, priority_deliver_at(prio)), inline
                at = (prio * 1000 if prio * 1000 < max_ms else max_ms) if prio >= ts_min else 0
                if not_before > at:
                    at = not_before
                if at > now:
                    dl_at_ap(at)  # type: ignore[misc]
                    dl_id_ap(id_)  # type: ignore[misc]
                    continue
            rp_ap(prio)
            ri_ap(id_)

    def _other(self, cur: _QueueLoad, id_: int, rec: bytes, offset: int) -> None:
        """A record in flight, or of a fair queue."""
        prio, not_before, _, lease_exp, lease_id, _, flags, glen, _, _ = _HDR.unpack_from(rec, offset)
        q = cur.q
        g = ""
        if q.qtype is QueueType.FAIR:
            g = bytes(rec[offset + _HDR_SIZE : offset + _HDR_SIZE + glen]).decode()
            g = cur.names.setdefault(g, g)
        if flags & R.FLAG_IN_FLIGHT:
            k = (lease_exp << 96) | (id_ << 32) | q.qnum
            self.leases.append(k)
            cur.infl[g] = cur.infl.get(g, 0) + 1
            q.inflight[id_] = Entry(k, g, lease_id)
            return
        at = max(not_before, _ts(prio))
        if at > self.m.now_ms:
            cur.dl_at.append(at)
            cur.dl_id.append(id_)
            return
        pair = cur.ready_keys.get(g)
        if pair is None:
            pair = cur.ready_keys[g] = (array("q"), array("Q"))
        pair[0].append(prio)
        pair[1].append(id_)

    def finish(self) -> None:
        m = self.m
        pending, self.pending = self.pending, []
        self.feed_all(pending, last=True)
        for ld in self.per_q.values():
            q = ld.q
            ids = ld.ids
            # records came in key order: known by chunks, or checked here
            ascending = ld.ascending or all(map(lt, ids, islice(ids, 1, None)))
            q.members.load_sorted(ids if ascending else sorted(ids))
            # the ids' bounds (those of any of them) when they ascend: no pass to find them
            id_bounds = (ids[0], ids[-1]) if ascending and ids else None
            if isinstance(q.index, FairIndex):
                q.index.load_groups(ld.ready_keys, ld.infl)
            else:
                parts = self._join_ranges(ld) if ld.ranges else None  # (may put them back: bounds unknown)
                p_bounds = (ld.p_lo, ld.p_hi) if ld.p_lo <= ld.p_hi else None
                late = PairList()
                if parts is not None:  # the ranges of a split load's parts, joined
                    late = q.index.load_ranges(parts, ld.late_above)
                    if ld.ready_p:  # a few pairs besides: added
                        self._add_rest(q.index.ready, late, ld)
                elif ld.late_above is None:
                    q.index.load_pairs(ld.ready_p, ld.ready_i, p_bounds, id_bounds)
                else:
                    late = q.index.load_pairs_split(ld.ready_p, ld.ready_i, ld.late_above, p_bounds, id_bounds)
                if ld.late_above is not None:  # the late timestamp pairs (p, id), as (p * 1000, id): the same order
                    late.scale_a(1000)
                    if late and ld.dl_at:
                        if len(ld.dl_at) <= MERGE_BY_ADD_MAX:
                            late.add_many(ld.dl_at, ld.dl_id)
                        else:  # many: bunched times would pile into a few chunks, sorted pair by pair
                            late = late.merged_unsorted(ld.dl_at, ld.dl_id)
                    if late:
                        q.delayed = late
            if ld.dl_at and not q.delayed:
                q.delayed = PairList.from_unsorted(ld.dl_at, ld.dl_id, b_bounds=id_bounds)
            if q.delayed:
                m._sync_due(q)
        m.leases = SortedList(self.leases)

    @staticmethod
    def _join_ranges(ld: _QueueLoad) -> list[PairRanges] | None:
        """The pair ranges of `ld` for `PriorityIndex.load_ranges`, with its ready pairs
        besides them distributed on their grid when there are many (few stay in `ready_p`
        for `_add_rest`); None, every pair back in `ready_p` (its bounds unknown), if those
        do not fit the grid."""
        parts, ld.ranges = ld.ranges, []
        if len(ld.ready_p) >= RANGES_MIN:
            more = pair_ranges(ld.ready_p, ld.ready_i, max(p.shift for p in parts))
            if more is None:
                for p in parts:
                    ps, ids = p.columns()
                    ld.ready_p.extend(ps)
                    ld.ready_i.extend(ids)
                ld.p_lo, ld.p_hi = 0, -1
                return None
            parts.append(more)
            ld.ready_p, ld.ready_i = array("q"), array("Q")
        return parts

    @staticmethod
    def _add_rest(ready: PairList, late: PairList, ld: _QueueLoad) -> None:
        """Add the few ready pairs of `ld` besides its ranges: those above `late_above` to
        `late`, the others to `ready`."""
        ps, ids = ld.ready_p, ld.ready_i
        if ld.late_above is not None:
            above = bytes(map(ld.late_above.__lt__, ps))
            late.add_many(list(compress(ps, above)), list(compress(ids, above)))
            below = above.translate(_NOT_BIT)
            ps, ids = array("q", compress(ps, below)), array("Q", compress(ids, below))
        ready.add_many(ps, ids)


class QueueMachine:
    """The replicated queue state. Only `apply`/`load` mutate it (single writer)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.queues: dict[str, Queue] = {}
        self.join_tokens = JoinTokens()  # kept by the state store beside the keys (below)
        self._by_num: dict[int, Queue] = {}
        self._qnums = 0  # in-memory handles; never influence ordering (ids are unique)
        # first_deliver_at << 32 | qnum of every queue with delayed messages
        self.due: SortedList = SortedList()
        self.leases: SortedList = SortedList()  # expires_at << 96 | id << 32 | qnum
        # (expires_at, queue, dedup_id): one entry per dedup record (a run: its first id)
        self.dedup_exp: SortedList = SortedList()
        self.dedup_n = 0  # dedup ids remembered (a run counts its ids)
        self.next_id = 1
        self.next_lease = 1
        self.now_ms = 0
        self._meta_written: tuple[int, int, int] = (1, 0, 1)
        self._changed: set[str] = set()  # queue names whose info may differ (take_changed)
        # records read because their delay ended (`_make_ready`), since `take_due_reads`
        self._due_reads = 0
        # client keys: replicated, but kept by the state store apart from the records
        # (`doq.queues.apikeys`); `load` leaves them to the store
        self.keys = KeyTable()
        self.redrive = Redrives()  # redrive tasks (doq.queues.redrive)
        self._handlers: dict[type, Callable[[Any], object]] = {
            c.Enqueue: self._enqueue, c.EnqueueColumns: self._enqueue_columns,
            c.Dequeue: self._dequeue, c.Ack: self._ack,
            c.Nack: self._nack, c.Touch: self._touch, c.UpdatePriority: self._update_priority,
            c.DeleteMessage: self._delete_message, c.Tick: lambda cmd: None,
            c.CreateQueue: self._create_queue, c.UpdateQueue: self._update_queue,
            c.DeleteQueue: self._delete_queue, c.PurgeQueue: self._purge_queue,
            c.CreateKey: self._create_key, c.RevokeKey: self._revoke_key,
            c.CreateJoinToken: lambda cmd: self.join_tokens.create(cmd, self.now_ms),
            c.UseJoinToken: lambda cmd: self.join_tokens.use(cmd, self.now_ms),
            StartRedrive: lambda cmd: self.redrive.start(self, cmd),
            CancelRedrive: lambda cmd: self.redrive.cancel(self, cmd),
            c.SetGroupPolicy: self._set_group_policy,
        }
        # fair queues a command or the clock touched in this batch (their rotation and group
        # records are written at the end of the batch), and those with group timers
        self._touched_fair: dict[str, Queue] = {}
        self._timed: dict[str, Queue] = {}

    def _create_key(self, cmd: c.CreateKey) -> KeyRecord:
        return self.keys.create(cmd.id, cmd.secret_hash, cmd.scopes, self.now_ms)

    def _revoke_key(self, cmd: c.RevokeKey) -> KeyRecord:
        return self.keys.revoke(cmd.id)

    # -- public API ----------------------------------------------------------------------
    def apply(self, index: int, batch: c.CommandBatch) -> list[object]:
        """Apply one batch; one result per command (errors returned, not raised)."""
        now = batch.now_ms if type(batch.now_ms) is int else 0
        now = min(max(self.now_ms, now), R.MAX_MS >> 1)
        self.now_ms = now
        self._advance(now, _released(batch.commands))
        results: list[object] = []
        handlers = self._handlers
        for cmd in batch.commands:
            h = handlers.get(type(cmd))
            if h is None:
                results.append(InvalidArgument(f"unknown command {type(cmd).__name__}"))
                continue
            try:
                results.append(h(cmd))
            except DoqError as e:
                results.append(e)
        if self.redrive.running:
            self.redrive.step(self)
        if self._touched_fair:
            self._flush_fair()
        meta = (self.next_id, self.now_ms, self.next_lease)
        if meta != self._meta_written:
            self.store.put(K.META_KEY, R.META_REC.pack(*meta))
            self._meta_written = meta
        return results

    def take_due_reads(self) -> int:
        """The message records read because their delay ended (each one's priority or
        group), since the last call; the count restarts at 0."""
        n, self._due_reads = self._due_reads, 0
        return n

    def next_due_ms(self) -> int | None:
        """Earliest replicated time at which a delay ends or a lease expires (None: never)."""
        due: int | None = None
        if self.due:
            due = self.due[0] >> 32
        if self.leases:
            t = self.leases[0] >> 96
            due = t if due is None else min(due, t)
        for q in self._timed.values():
            t2 = q.index.policy.wakes[0][0] if isinstance(q.index, FairIndex) and q.index.policy.wakes else None
            if t2 is not None:
                due = t2 if due is None else min(due, t2)
        if self.redrive.running:
            r = self.redrive.next_due_ms(self.now_ms)
            if r is not None:
                due = r if due is None else min(due, r)
        return due

    def has_deliverable(self, queue: str) -> bool:
        q = self.queues.get(queue)
        return q is not None and q.index.has_ready()

    def queue_info(self, name: str) -> QueueInfo:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFound(f"queue {name!r} not found")
        return q.info()

    def take_changed(self) -> set[str]:
        """Names of the queues created, changed or deleted since the last call (then reset)."""
        changed, self._changed = self._changed, set()
        return changed

    def deliverable(self, queue: str) -> int:
        """How many messages a dequeue of `queue` could take now (0 if none or no such
        queue; for a fair queue with a per-group limit, an upper bound)."""
        q = self.queues.get(queue)
        return q.index.n_ready if q is not None and q.index.has_ready() else 0

    def throttled_groups(self, queue: str) -> int:
        """How many of a fair queue's groups wait for their rate now (0 for a delayed or
        unknown queue). Any thread (the length of one dict)."""
        q = self.queues.get(queue)
        return len(q.index.policy.throttled) if q is not None and isinstance(q.index, FairIndex) else 0

    def oldest_id(self, queue: str) -> int | None:
        """The id of `queue`'s oldest message in any state (ids only grow, so the lowest);
        None without messages or queue. Any thread (`IdSet.first`)."""
        q = self.queues.get(queue)
        return None if q is None else q.members.first()

    def sort_known(self, queue: str, ids: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Positions of `ids` as this state knows them: (present: in `queue` in any state;
        gone: assigned — below `next_id` — and no longer in `queue`, so an ack, nack or
        touch of it can only fail with MessageNotFound, now and at any later index, as
        ids are never reused; unborn: not assigned yet at this state). For a queue this
        state does not hold, every position is present (the command answers for it)."""
        q = self.queues.get(queue)
        if q is None or all(map(q.inflight.__contains__, ids)):  # the common case, at C speed
            return list(range(len(ids))), [], []
        msgs, next_id = q.members, self.next_id
        present: list[int] = []
        gone: list[int] = []
        unborn: list[int] = []
        for pos, id_ in enumerate(ids):
            if id_ in msgs:
                present.append(pos)
            elif id_ < next_id:
                gone.append(pos)
            else:
                unborn.append(pos)
        return present, gone, unborn

    def queue_infos(self) -> list[QueueInfo]:
        qs = list(self.queues.values())
        return [q.info() for q in sorted(qs, key=lambda q: q.name)]

    def peek_ids(self, queue: str, state: MessageState, offset: int, limit: int) -> list[int]:
        """Ids of `queue`'s messages in `state`, in the order they leave it, without changing
        anything: ready ones in delivery order (what the next dequeues would take: priority
        then id; for a fair queue the weighted round-robin from the cursor, with the per-group
        limit and what the groups' rates allow now),
        delayed ones by due time, in-flight ones by lease expiry. Positions `offset` to
        `offset + limit`; the cost grows with `offset + limit` (callers bound it), and for
        delayed and in-flight messages with the other queues' entries before them."""
        q = self.queues.get(queue)
        if q is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        end = offset + limit
        if state is MessageState.READY:
            if isinstance(q.index, FairIndex):
                return [k & MASK64 for k in q.index.preview(end, self.now_ms)[offset:]]
            return q.index.peek_ids(offset, end)
        if state is MessageState.DELAYED:
            return [i for _, i in q.delayed.islice(offset, end)]
        ordered = self.leases
        out: list[int] = []
        if q.n_inflight <= offset:
            return out
        qn = q.qnum
        seen = 0
        for k in ordered:
            if k & MASK32 == qn:
                if seen >= offset:
                    out.append((k >> 32) & MASK64)
                    if len(out) == limit:
                        break
                seen += 1
        return out

    def group_stats(self, queue: str) -> list[GroupStats]:
        """Every group of a fair queue with a message ready or in flight or a policy of its
        own or a bucket, by name ([] for a delayed queue)."""
        q = self.queues.get(queue)
        if q is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        if not isinstance(q.index, FairIndex):
            return []
        return [self._group_stat(q.index, n) for n in sorted(set(q.index.groups) | q.index.policy.names())]

    @staticmethod
    def _group_stat(index: FairIndex, name: str) -> GroupStats:
        g = index.groups.get(name)
        p = index.policy
        return GroupStats(name, len(g.ready) if g is not None else 0, g.inflight if g is not None else 0,
                          p.weight(name), p.rate(name), p.is_throttled(name), name in p.overrides)

    def get_message(self, queue: str, id_: int) -> MessageView:
        """Read a message through the store (the caller's current view)."""
        q = self.queues.get(queue)
        if q is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        rec = self.store.get(q.prefix + _U64.pack(id_)) if type(id_) is int and 0 < id_ <= MASK64 else None
        if rec is None:
            raise MessageNotFound(f"message {id_} not found in queue {queue!r}")
        return R.message_view(queue, id_, rec, self.now_ms)

    # -- rebuild -------------------------------------------------------------------------
    def load(self, records: Iterable[tuple[bytes, bytes]],
             messages: Iterable[tuple[bytes, bytes]] = (), offset: int = 0,
             overrides: Mapping[bytes, bytes | None] | None = None, *, ordered: bool = False,
             stop: bytes | None = None, upper: Callable[[], Iterable[Segment]] | None = None,
             split_records: int | None = None) -> None:
        """Rebuild all in-memory state from the records (any order of kinds is fine,
        but keys of one kind in key order is fastest). Replaces the current state.
        `messages`, read after `records`: more message records (key, value), the record
        being `value[offset:]`, or `overrides[key]` for a key there (None: no record);
        the fast path of a store's rebuild; `ordered`: they come in ascending key order
        (an LMDB cursor's: not checked). `stop` (with `ordered`): the messages from this
        key on are not read here: `upper()` gives them, as `_Loader.segments` of them
        (loaded elsewhere, the overrides applied), joined after the others (the same
        state as reading them here). If `upper` or its segments raise, `UpperLoadError`
        (from the error) is raised and the state is half-loaded: the caller loads again.
        `split_records` (with `upper`): about how many records the queue holding `stop`
        has in all; before `upper` is called, the ready pairs read here are distributed
        into pair ranges for it (`_Loader.prepare_ranges`), as `upper`'s maker does with
        the same number (`segments_of`)."""
        keys, join_tokens = self.keys, self.join_tokens
        self.__init__(self.store)  # type: ignore[misc]
        self.keys, self.join_tokens = keys, join_tokens
        dedups: list[tuple[bytes, bytes]] = []
        groups: list[tuple[bytes, bytes]] = []
        loader = _Loader(self)
        for key, rec in records:
            kind = key[0]
            if kind == K.MESSAGE:
                loader.feed(key, rec)
            elif key == K.META_KEY:
                self.next_id, self.now_ms, self.next_lease = R.META_REC.unpack(rec)
                self._meta_written = (self.next_id, self.now_ms, self.next_lease)
                loader.meta_seen = True
            elif kind == K.QUEUE:
                _, name, _ = K.split_name(key)
                qtype, settings, dead, cursor, credit = R.decode_queue_full(rec)
                self._add_queue(name, qtype, settings, dead, cursor, credit)
            elif kind == K.DEDUP:
                dedups.append((key, rec))
            elif kind == K.REDRIVE:
                self.redrive.load(K.split_name(key)[1], rec)
            elif kind == K.GROUP:
                groups.append((key, rec))
            elif kind == K.JOIN_TOKEN:
                pass  # a join token record of an older version (or its backup): inert (doq.queues.keys)
            else:
                raise ValueError(f"unknown record key {key!r}")
        self._load_groups(groups)  # before the messages: a throttled group is not active
        loader.feed_all(messages, offset, overrides, ordered=ordered, stop=stop)
        if upper is not None:
            if split_records is not None and stop is not None:
                try:
                    split_name: str | None = K.split_name(stop)[1]
                except ValueError:
                    split_name = None
                loader.prepare_ranges(split_name, split_records)
            try:
                loader.absorb(upper(), offset)
            except Exception as e:
                raise UpperLoadError(str(e)) from e
        loader.finish()
        self._load_dedups(dedups)
        self._touched_fair.clear()

    def segments_of(self, records: Iterable[tuple[bytes, bytes]], messages: Iterable[tuple[bytes, bytes]],
                    offset: int = 0, overrides: Mapping[bytes, bytes | None] | None = None,
                    progress: Callable[[], None] | None = None, split_records: int | None = None) -> list[Segment]:
        """`load(records)` (the queues and the meta record; no messages), then the
        `_Loader.segments` of `messages` (ascending keys, the record `value[offset:]` or
        the override; `split_records`: see there) for another machine's `load(...,
        upper=...)`."""
        records = list(records)
        self.load(records)
        loader = _Loader(self)
        loader.meta_seen = any(k == K.META_KEY for k, _ in records)
        return loader.segments(messages, offset, overrides, progress, split_records)

    def _load_groups(self, groups: list[tuple[bytes, bytes]]) -> None:
        """Group records (overrides, buckets) of fair queues; raises ValueError for a
        malformed one or one of a queue that is not a fair queue."""
        for key, rec in groups:
            _, name, rest = K.split_name(key)
            q = self.queues.get(name)
            if q is None or not isinstance(q.index, FairIndex):
                raise ValueError(f"group record {key!r} of no fair queue")
            q.index.policy.load(rest.decode(), rec)
        for name in sorted(self.queues):
            q = self.queues[name]
            if not isinstance(q.index, FairIndex):
                continue
            # timers derived from a bucket may lie behind the replicated time: a live replica
            # passed them at its last batch (the group woke), so pass them here too
            q.index.policy.wake(self.now_ms)
            q.index.policy.take_dirty()
            if q.index.policy.next_timer_ms() is not None:
                self._timed[name] = q

    def _load_dedups(self, dedups: list[tuple[bytes, bytes]]) -> None:
        """Dedup records: one id each, or (canonical ids) a run of ids; raises ValueError
        for a malformed record or runs of one producer that overlap."""
        exp = []
        n = 0
        for key, rec in dedups:
            _, name, rest = K.split_name(key)
            did = rest.decode()
            q = self.queues[name]
            id_, expires, count = R.decode_dedup(rec)
            pr = parse(did)
            if pr is None:
                if count != 1:
                    raise ValueError(f"dedup record {key!r}: a run of ids under a non-canonical id")
                q.dedup[did] = (id_, expires)
            else:
                runs = q.runs.get(pr[0])
                if runs is None:
                    runs = q.runs[pr[0]] = Runs()
                if runs.overlaps(pr[1], count) or count > (1 << 48) - pr[1]:
                    raise ValueError(f"dedup record {key!r}: a run that overlaps another or ends past the form")
                runs.add(Run(pr[1], count, id_, expires))
            n += count
            exp.append((expires, name, did))
        self.dedup_exp = SortedList(exp)
        self.dedup_n = n

    # -- time ----------------------------------------------------------------------------
    def _sync_due(self, q: Queue) -> None:
        """Keep `due` holding q's first deliver_at (after a change of `q.delayed`)."""
        new = (q.delayed.first_a() << 32) | q.qnum if q.delayed else None
        if new != q.due_key:
            if q.due_key is not None:
                self.due.remove(q.due_key)
            if new is not None:
                self.due.add(new)
            q.due_key = new

    def _sync_due_added(self, q: Queue, lowest: int) -> None:
        """`_sync_due` after pairs were added to `q.delayed` (and none removed), the
        smallest added a being `lowest`: the first deliver_at is the lower of it and the
        one `due` held, so an unsorted first chunk is not scanned for it."""
        if q.due_key is None or lowest < q.due_key >> 32:
            if q.due_key is not None:
                self.due.remove(q.due_key)
            q.due_key = (lowest << 32) | q.qnum
            self.due.add(q.due_key)

    def _advance(self, now: int, spared: frozenset[tuple[str, int, int]] = frozenset()) -> None:
        """Replicated time reaches `now`: due delays end, due leases expire, due dedup
        records are forgotten. A due lease the batch releases (`spared`: (queue, id,
        lease id) of its `Nack(release=True)` commands) does not expire: the release
        undoes its delivery, no attempt counted (a dequeue that committed after its
        lease's end, e.g. through a quorum loss, is released by the service that never
        handed it out; its release must not lose to the expiry)."""
        if self._timed:
            self._wake_groups(now)
        due = self.due
        if due and due[0] >> 32 <= now:
            by_num = self._by_num
            while due and due[0] >> 32 <= now:
                q = by_num[due[0] & MASK32]
                _, ids = q.delayed.pop_through(now)
                self._sync_due(q)
                self._changed.add(q.name)
                self._make_ready(q, ids)
        leases = self.leases
        if leases and leases[0] >> 96 <= now:
            kept: list[int] = []
            while leases and leases[0] >> 96 <= now:
                k = leases.pop(0)
                q = self._by_num[k & MASK32]
                id_ = (k >> 32) & MASK64
                e = q.inflight[id_]
                if spared and (q.name, id_, e.lease_id) in spared:
                    kept.append(k)
                    continue
                del q.inflight[id_]
                self._changed.add(q.name)
                q.index.unleased(e.group)
                self._return(q, id_, e, 0, None)
            if kept:
                leases.update(kept)
        dexp = self.dedup_exp
        if dexp and dexp[0][0] <= now:
            i = dexp.bisect_left((now + 1,))  # every record expired by now, at once
            items = list(dexp.islice(0, i))
            del dexp[:i]
            self._forget_dedups(items)

    def _wake_groups(self, now: int) -> None:
        """Groups whose rate lets them deliver again by `now` rejoin the rotation; buckets
        full by `now` are forgotten."""
        for name in sorted(self._timed):
            q = self._timed[name]
            assert isinstance(q.index, FairIndex)
            t = q.index.policy.next_timer_ms()
            if t is None or t > now:
                continue
            woken = q.index.policy.wake(now)
            q.index.refresh_groups(woken)
            self._touched_fair[name] = q
            if woken:
                self._changed.add(name)

    def _flush_fair(self) -> None:
        """Write what this batch changed of the touched fair queues: the rotation (cursor,
        credit) into the queue record, the group records; track which have timers."""
        touched, self._touched_fair = self._touched_fair, {}
        for name in sorted(touched):
            q = touched[name]
            if self.queues.get(name) is not q:
                continue  # deleted in this batch
            assert isinstance(q.index, FairIndex)
            if (q.cursor, q.credit) != q.saved_rr:
                self.store.put(K.queue_key(name), q.record())
            policy = q.index.policy
            for group in policy.take_dirty():
                rec = policy.record(group)
                key = K.group_key(name, group)
                if rec is None:
                    self.store.delete(key)
                else:
                    self.store.put(key, rec)
            if policy.next_timer_ms() is None:
                self._timed.pop(name, None)
            else:
                self._timed[name] = q

    def _forget_dedups(self, items: list[tuple[int, str, str]]) -> None:
        """Forget the dedup records of `items` (already out of `dedup_exp`), one store call."""
        keys = []
        prefixes: dict[str, bytes] = {}
        for _, name, did in items:
            q = self.queues[name]
            if q.dedup.pop(did, None) is not None:
                self.dedup_n -= 1
            else:
                producer = did[:PRODUCER_LEN]
                runs = q.runs[producer]
                self.dedup_n -= runs.remove(int(did[PRODUCER_LEN:], 16)).count
                if not runs:
                    del q.runs[producer]
            prefix = prefixes.get(name)
            if prefix is None:
                prefix = prefixes[name] = K.name_prefix(K.DEDUP, name)
            keys.append(prefix + did.encode())
        self.store.delete_many(keys)

    def _evict_dedups(self) -> None:
        """While more than MAX_DEDUP_ENTRIES ids are remembered, forget the earliest-expiring
        (of a run: its first ids, as one id at a time would)."""
        dexp = self.dedup_exp
        while self.dedup_n > MAX_DEDUP_ENTRIES:
            over = self.dedup_n - MAX_DEDUP_ENTRIES
            exp, name, did = dexp[0]
            q = self.queues[name]
            run = None if did in q.dedup else q.runs[did[:PRODUCER_LEN]].find(int(did[PRODUCER_LEN:], 16))
            if run is not None and run.count > over and len(dexp) > 1 and dexp[1][:2] == (exp, name):
                # an id of the same expiry that sorts between the run's ids goes before its later ones
                later = dexp[1][2]
                if later < run_id(did[:PRODUCER_LEN], run.first + over - 1):
                    over = bisect_left(range(run.first, run.first + over), later,
                                       key=lambda s: run_id(did[:PRODUCER_LEN], s))
            self._forget_dedups([dexp.pop(0)])
            if run is not None and run.count > over:  # its later ids are remembered again
                self._add_run(q, did[:PRODUCER_LEN], Run(run.first + over, run.count - over, run.id0 + over, exp))

    # -- placement -----------------------------------------------------------------------
    def _place(self, q: Queue, id_: int, prio: int, group: str, deliver_at: int) -> None:
        """Put a message that is not in flight into the ready index or `q.delayed`
        (`group`: the index's name object, `q.index.group_name`)."""
        if deliver_at > self.now_ms:
            q.delayed.add(deliver_at, id_)
            self._sync_due_added(q, deliver_at)
        elif type(q.index) is PriorityIndex:
            q.index.add_pair(prio, id_)
        else:
            q.index.add(ready_key(prio, id_), group)

    def _unplace_waiting(self, q: Queue, id_: int, rec: bytes) -> None:
        """Take a message that is not in flight (record `rec`) out of whichever index
        holds it (the entry's rule: delayed while its delivery time is ahead)."""
        h = _HDR.unpack_from(rec)
        at = max(h[1], _ts(h[0]))
        if at > self.now_ms:
            q.delayed.remove(at, id_)
            self._sync_due(q)
        else:
            q.index.remove(ready_key(h[0], id_), self._group_of(q, rec, h[7]))

    def _group_of(self, q: Queue, rec: bytes, glen: int) -> str:
        """The group of a message record of `q` as its index names it ("" unless fair)."""
        if q.qtype is not QueueType.FAIR or not glen:
            return q.index.group_name("") if q.qtype is QueueType.FAIR else ""
        return q.index.group_name(rec[_HDR_SIZE : _HDR_SIZE + glen].decode())

    def _make_ready(self, q: Queue, ids: list[int]) -> None:
        """Messages `ids` of `q` (taken out of `q.delayed`) are due: into the ready index."""
        get = self.store.get
        prefix = q.prefix
        pack = _U64.pack
        unpack = _HDR.unpack_from
        self._due_reads += len(ids)
        if type(q.index) is PriorityIndex:
            # in due order: a timestamp falling due mostly follows the ready ones (an
            # append); read in key order and added by `add_pairs`, the first tick after
            # 2 h stopped (~100k due) measured no faster, sorted reads with adds one by
            # one slower (1.15-1.18 s against 0.83-0.96 s)
            add = q.index.add_pair
            for id_ in ids:
                rec = get(prefix + pack(id_))
                assert rec is not None
                add(unpack(rec)[0], id_)
            return
        for id_ in ids:
            rec = get(prefix + pack(id_))
            assert rec is not None
            h = unpack(rec)
            q.index.add(ready_key(h[0], id_), self._group_of(q, rec, h[7]))

    def _return(self, q: Queue, id_: int, e: Entry, delay_ms: int, prio: int | None) -> None:
        """A message left flight without ack (expiry or nack): requeue or dead-letter.
        The caller already removed it from the lease index, `q.inflight` and counters."""
        mkey = q.prefix + _U64.pack(id_)
        rec = self.store.get(mkey)
        assert rec is not None
        h = _HDR.unpack_from(rec)
        attempts = h[5]
        maxa = q.settings.max_attempts
        if maxa and attempts >= maxa:
            self._dead_letter(q, id_, mkey, rec)
            return
        p = h[0] if prio is None else prio
        not_before = self.now_ms + delay_ms if delay_ms else h[1]
        self.store.put(mkey, R.with_header(rec, p, not_before, 0, 0, attempts, 0))
        self._place(q, id_, p, e.group, max(not_before, _ts(p)))

    def _dead_letter(self, q: Queue, id_: int, mkey: bytes, rec: bytes) -> None:
        self.store.delete(mkey)
        q.members.discard(id_)
        q.dead += 1
        self.store.put(K.queue_key(q.name), q.record())
        dlq = self.queues.get(q.settings.dead_letter_queue) if q.settings.dead_letter_queue else None
        if dlq is None:
            return
        self._changed.add(dlq.name)
        h = _HDR.unpack_from(rec)
        p = _HDR_SIZE
        group = rec[p : p + h[7]]
        p += h[7] + h[8]
        md = rec[p : p + h[9]]
        content = rec[p + h[9] :]
        self._insert(dlq, h[0], 0, group.decode(), R.encode_message(
            h[0], 0, self.now_ms, group, b"", md, content))

    def _insert(self, q: Queue, prio: int, not_before: int, group: str, rec_without_id: bytes) -> int:
        id_ = self.next_id
        self.next_id = id_ + 1
        self.store.insert(q.prefix + _U64.pack(id_), rec_without_id)
        g = q.index.group_name(group) if q.qtype is QueueType.FAIR else ""
        q.members.add(id_)
        self._place(q, id_, prio, g, max(not_before, _ts(prio)))
        return id_

    # -- redrive (doq.queues.redrive) ------------------------------------------------------
    def redrive_candidates(self, q: Queue, upto_id: int, n: int) -> list[int]:
        """Up to `n` ids of `q`'s messages below `upto_id` that are not in flight, lowest
        first (`q.members` iterates its ids in ascending order)."""
        out: list[int] = []
        inflight = q.inflight
        for id_ in q.members:
            if id_ >= upto_id or len(out) >= n:
                break
            if id_ not in inflight:
                out.append(id_)
        return out

    def move_messages(self, src: Queue, ids: list[int], dst: Queue) -> None:
        """Move messages `ids` of `src` (none in flight) to `dst`, in order, as new
        messages (new ids): same content, group, metadata, dedup id, priority and
        `not_before`; attempts 0, enqueued now. The dedup id is not entered in `dst`'s
        dedup window."""
        now = self.now_ms
        recs = self.store.pop_many([src.prefix + _U64.pack(i) for i in ids])
        for id_, rec in zip(ids, recs, strict=True):
            assert rec is not None
            self._unplace_waiting(src, id_, rec)
            src.members.discard(id_)
            h = _HDR.unpack_from(rec)
            group = rec[_HDR_SIZE : _HDR_SIZE + h[7]].decode()
            self._insert(dst, h[0], h[1], group,
                         _HDR.pack(h[0], h[1], now, 0, 0, 0, 0, h[7], h[8], h[9]) + rec[_HDR_SIZE:])
        dst.enqueued += len(ids)
        self._changed.add(src.name)
        self._changed.add(dst.name)

    # -- queues --------------------------------------------------------------------------
    def _queue(self, name: object) -> Queue:
        """The queue a command acts on (marked changed: the command may alter its info)."""
        q = self.queues.get(name) if type(name) is str else None
        if q is None:
            raise QueueNotFound(f"queue {name!r} not found")
        self._changed.add(q.name)
        if q.qtype is QueueType.FAIR:
            self._touched_fair[q.name] = q
        return q

    def _add_queue(self, name: str, qtype: QueueType, settings: QueueSettings, dead: int = 0,
                   cursor: str = "", credit: int = 0) -> Queue:
        self._qnums += 1
        q = Queue(name, qtype, settings, self._qnums, dead, cursor, credit)
        self.queues[name] = q
        self._by_num[q.qnum] = q
        self._changed.add(name)
        return q

    def _create_queue(self, cmd: c.CreateQueue) -> QueueInfo:
        name = _name(cmd.name)
        if cmd.type not in ("delayed", "fair"):
            raise InvalidArgument(f"invalid queue type {cmd.type!r}", reason="INVALID_QUEUE_TYPE")
        qtype = QueueType(cmd.type)
        settings = _settings(cmd.settings)
        old = self.queues.get(name)
        if old is not None:
            if old.qtype is qtype and old.settings == settings:
                return old.info()
            raise AlreadyExists(f"queue {name!r} already exists", reason="QUEUE_EXISTS")
        if cmd.max_queues and len(self.queues) >= cmd.max_queues:
            raise LimitReached(f"{len(self.queues)} queues exist, the limit (--max-queues "
                               f"{cmd.max_queues}); delete one first", reason="QUEUE_LIMIT_REACHED")
        q = self._add_queue(name, qtype, settings)
        self.store.put(K.queue_key(name), q.record())
        return q.info()

    def _update_queue(self, cmd: c.UpdateQueue) -> QueueInfo:
        q = self._queue(cmd.name)
        settings = _settings(cmd.settings)
        q.settings = settings
        if isinstance(q.index, FairIndex):
            q.index.refresh_groups(q.index.policy.set_defaults(
                settings.default_group_weight, settings.default_group_max_per_second, self.now_ms))
            q.index.set_limit(settings.max_unacked_per_group)
        self.store.put(K.queue_key(q.name), q.record())
        return q.info()

    def _set_group_policy(self, cmd: c.SetGroupPolicy) -> GroupStats:
        q = self._queue(cmd.queue)
        if not isinstance(q.index, FairIndex):
            raise FailedPrecondition(f"queue {q.name!r} is a delayed queue: only fair queues have groups",
                                     reason="NOT_FAIR_QUEUE")
        _utf8(cmd.group, "group")
        if cmd.weight is not None:
            _int(cmd.weight, 0, L.MAX_GROUP_WEIGHT, "weight")
        if cmd.max_per_second is not None:
            _int(cmd.max_per_second, INHERIT_RATE, L.MAX_GROUP_RATE, "max_per_second")
        q.index.policy.set_override(cmd.group, cmd.weight, cmd.max_per_second, self.now_ms)
        q.index.refresh_groups([cmd.group])
        return self._group_stat(q.index, cmd.group)

    def _purge(self, q: Queue) -> int:
        n = len(q.members)
        delete = self.store.delete
        prefix = q.prefix
        pack = _U64.pack
        for e in q.inflight.values():
            self.leases.remove(e.key)
        for id_ in q.members:
            delete(prefix + pack(id_))
        q.members.clear()
        q.inflight = {}
        q.delayed.clear()
        self._sync_due(q)
        q.index.clear()
        return n

    def _purge_queue(self, cmd: c.PurgeQueue) -> int:
        return self._purge(self._queue(cmd.name))

    def _delete_queue(self, cmd: c.DeleteQueue) -> None:
        q = self._queue(cmd.name)
        self._purge(q)
        items = [(exp, q.name, did) for did, (_, exp) in q.dedup.items()]
        items += [(r.exp, q.name, run_id(p, r.first)) for p, runs in q.runs.items() for r in runs.by_first.values()]
        items.sort()
        for it in items:
            self.dedup_exp.remove(it)
        self._forget_dedups(items)
        self.store.delete(K.queue_key(q.name))
        if isinstance(q.index, FairIndex):
            for group in sorted(q.index.policy.names() | q.index.policy.dirty):
                if q.index.policy.record(group) is not None or group in q.index.policy.dirty:
                    self.store.delete(K.group_key(q.name, group))
            self._timed.pop(q.name, None)
            self._touched_fair.pop(q.name, None)
        del self.queues[q.name]
        del self._by_num[q.qnum]
        self.redrive.forget(self, q.name)
        return None

    # -- messages ------------------------------------------------------------------------
    def _enqueue(self, cmd: c.Enqueue) -> list[EnqueueResult | DoqError]:
        q = self._queue(cmd.queue)
        if type(cmd.items) is not list:
            raise InvalidArgument("items must be a list")
        return self._enqueue_items(q, cmd.items)

    def _enqueue_columns(self, cmd: c.EnqueueColumns) -> EnqueueColumnsResult:
        """Plain messages (contents, and dedup ids all new and distinct) take the column
        path: one insert call per record kind, one index update and no object per message
        but its `Entry`; anything else takes the per-message path of `Enqueue`. Both store
        the same records and give the same results."""
        q = self._queue(cmd.queue)
        contents = cmd.contents
        if type(contents) is not list:
            raise InvalidArgument("contents must be a list")
        n = len(contents)
        optional = (cmd.groups, cmd.priorities, cmd.metadata, cmd.dedup_ids, cmd.delays_ms)
        for col in optional:
            if type(col) is not list or (col and len(col) != n):
                raise InvalidArgument("every column must be empty or as long as contents",
                                      reason="INVALID_COLUMNS")
        if not n:
            return EnqueueColumnsResult([])
        dids = cmd.dedup_ids
        plain = not (cmd.groups or cmd.priorities or cmd.metadata or cmd.delays_ms)
        tails = None
        run = None
        if not (cmd.metadata or cmd.delays_ms) and set(map(type, contents)) == {bytes}:
            if not dids:
                tails = contents
            elif (run := self._fresh_run(q, dids)) is not None:
                tails = [d.encode() + b for d, b in zip(dids, contents, strict=True)]
            else:
                tails = _fresh_dedup_tails(q, dids, contents)
            if tails is not None and not plain:
                keyed = self._enqueue_keyed(q, cmd, tails, run)
                if keyed is not None:
                    return keyed
                tails = None
        if tails is None:
            return _columns_result(self._enqueue_items(q, cmd.to_items()))
        first = self.next_id
        ids = range(first, first + n)
        self.next_id = first + n
        pack = _U64.pack
        prefix = q.prefix
        now = self.now_ms
        dlen = len(tails[0]) - len(contents[0]) if dids else 0
        self.store.insert_many([prefix + pack(i) for i in ids],
                               _HDR.pack(0, 0, now, 0, 0, 0, 0, 0, dlen, 0), tails)
        if run is not None:
            self._remember_run(q, run[0], run[1], n, first)
        elif dids:
            self._remember_dedups(q, dids, ids)
        q.members.add_range(first, n)
        if type(q.index) is PriorityIndex:
            q.index.add_ids(0, ids)
        else:
            base = (1 << 63) << 64  # ready_key(0, id) == base | id
            q.index.add_many([base | i for i in ids], q.index.group_name(""))
        q.enqueued += n
        return EnqueueColumnsResult(ids)

    def _enqueue_keyed(self, q: Queue, cmd: c.EnqueueColumns, tails: list[bytes],
                       run: tuple[str, int] | None) -> EnqueueColumnsResult | None:
        """The column path of messages with priorities and/or groups (no metadata, no
        delay; dedup ids, if any, fresh: `tails` are their bytes + the contents, `run` the
        canonical run they form): one insert call, the indexes updated in bulk. None,
        changing nothing, if a priority or group would fail (the per-message path then
        reports it). Same records, indexes and results as `_enqueue_items`."""
        n = len(tails)
        prios = cmd.priorities
        bounds = (0, 0)  # (min, max) of the priorities
        if prios:
            if set(map(type, prios)) != {int}:
                return None
            bounds = min(prios), max(prios)
            if bounds[0] < INT64_MIN or bounds[1] > INT64_MAX:
                return None
        groups = cmd.groups
        dlen = len(tails[0]) - len(cmd.contents[0]) if cmd.dedup_ids else 0
        now = self.now_ms
        pack = _HDR.pack
        # a record is the header, the group's bytes and the tail; the header after its
        # priority depends on the group's length only: built once per distinct group (a
        # batch has few), with the priority 0 when there are no priorities, and the records
        # joined by C calls over the columns
        cut = 8 if prios else 0  # the priority's bytes, packed per message
        if groups:
            if set(map(type, groups)) != {str}:
                return None
            try:
                encoded = {g: g.encode() for g in set(groups)}
            except UnicodeError:
                return None
            if max(map(len, encoded.values())) > 0xFFFF:
                return None
            rest = {g: pack(0, 0, now, 0, 0, 0, 0, len(gb), dlen, 0)[cut:] + gb for g, gb in encoded.items()}
            rests: Iterable[bytes] = map(rest.__getitem__, groups)
        else:
            rests = repeat(pack(0, 0, now, 0, 0, 0, 0, 0, dlen, 0)[cut:], n)
        first = self.next_id
        ids = range(first, first + n)
        self.next_id = first + n
        ps = prios or [0] * n
        heads = map(bytes.__add__, map(_I64.pack, prios), rests) if prios else rests
        recs = list(map(bytes.__add__, heads, tails))
        self.store.insert_many(list(map(q.prefix.__add__, map(_U64.pack, ids))), b"", recs)
        if run is not None:
            self._remember_run(q, run[0], run[1], n, first)
        elif cmd.dedup_ids:
            self._remember_dedups(q, cmd.dedup_ids, ids)
        q.members.add_range(first, n)
        # not before deliver[j] (a timestamp priority: `_ts`); none if no priority is one
        deliver = _deliver_at(ps, bounds) if bounds[1] >= R.TS_PRIORITY_MIN else []
        late = list(map(lt, repeat(now), deliver))
        rp: Sequence[int] = ps
        ri: Sequence[int] = ids
        if True in late:  # the index gets those due now; the others wait in q.delayed
            waiting = list(compress(deliver, late))
            q.delayed.add_many(waiting, list(compress(ids, late)))
            self._sync_due_added(q, min(waiting))
            due = list(map(not_, late))
            rp, ri = list(compress(ps, due)), list(compress(ids, due))
        if isinstance(q.index, PriorityIndex):
            q.index.add_pairs(rp, ri)
        else:
            self._add_fair(q, rp, ri, list(compress(groups, due)) if groups and True in late else groups)
        q.enqueued += n
        return EnqueueColumnsResult(ids, deliver_at_ms=deliver if any(deliver) else [])

    def _add_fair(self, q: Queue, ps: Sequence[int], ids: Sequence[int], groups: list[str]) -> None:
        """Add ready messages to a fair queue's index: (priority, id) pairs in any order,
        their groups (empty: all ""), one call per group."""
        index = q.index
        assert isinstance(index, FairIndex)
        if not groups:
            index.add_pairs(ps, ids, "")
            return
        # runs of one group (a group filled as a block is one run), then one list per group
        starts = [0, *compress(range(1, len(groups)), map(ne, groups[1:], groups)), len(groups)]
        by_group: dict[str, tuple[list[int], list[int]]] = {}
        for s, e in pairwise(starts):
            g = groups[s]
            got = by_group.get(g)
            if got is None:
                got = by_group[g] = ([], [])
            got[0].extend(ps[s:e])
            got[1].extend(ids[s:e])
        for g in sorted(by_group):
            index.add_pairs(*by_group[g], index.group_name(g))

    def _enqueue_items(self, q: Queue, items: list[c.EnqueueItem]) -> list[EnqueueResult | DoqError]:
        out: list[EnqueueResult | DoqError] = []
        ap = out.append
        now = self.now_ms
        fair = q.qtype is QueueType.FAIR
        insert = self.store.insert
        prefix = q.prefix
        for it in items:
            try:
                if type(it) is not c.EnqueueItem:
                    raise InvalidArgument("not an EnqueueItem")
                content = it.content
                if type(content) is not bytes:
                    raise InvalidArgument("content must be bytes", reason="INVALID_CONTENT")
                prio = it.priority
                if type(prio) is not int or not INT64_MIN <= prio <= INT64_MAX:
                    raise InvalidArgument("priority must be a signed 64-bit integer",
                                          reason="INVALID_PRIORITY")
                delay = it.delay_ms
                if type(delay) is not int or not 0 <= delay <= MAX_DELAY_MS:
                    raise InvalidArgument("invalid delay_ms", reason="INVALID_DELAY")
                gb = _utf8(it.group, "group")
                did = it.dedup_id
                db = _utf8(did, "dedup_id") if did else b""
                md = _metadata(it.metadata) if it.metadata else b""
            except DoqError as err:
                ap(err)
                continue
            not_before = now + delay if delay else 0
            deliver_at = max(not_before, _ts(prio))
            pr = None
            if did:
                pr = parse(did)
                if pr is None:
                    seen = q.dedup.get(did)
                    if seen is not None and seen[1] > now:
                        ap(self._duplicate(q, seen[0], it.group, prio, deliver_at))
                        continue
                else:
                    runs = q.runs.get(pr[0])
                    r = runs.find(pr[1]) if runs is not None else None
                    if r is not None:  # (after _advance, every run is within its window)
                        ap(self._duplicate(q, r.id0 + pr[1] - r.first, it.group, prio, deliver_at))
                        continue
            id_ = self.next_id
            self.next_id = id_ + 1
            insert(prefix + _U64.pack(id_), b"".join((
                _HDR.pack(prio, not_before, now, 0, 0, 0, 0, len(gb), len(db), len(md)),
                gb, db, md, content)))
            g = q.index.group_name(it.group) if fair else ""
            q.members.add(id_)
            self._place(q, id_, prio, g, deliver_at)
            if pr is not None:
                self._remember_run(q, pr[0], pr[1], 1, id_)
            elif did:
                self._remember_dedup(q, did, id_)
            q.enqueued += 1
            ap(EnqueueResult(id_, False, it.group, prio, deliver_at))
        return out

    def _duplicate(self, q: Queue, id_: int, group: str, prio: int, deliver_at: int) -> EnqueueResult:
        """The answer to a duplicate of message `id_`: the stored message's group, priority
        and delivery time while it is stored (a later priority update shows); the
        request's (`group`, `prio`, `deliver_at`) once it was consumed."""
        rec = self.store.get(q.prefix + _U64.pack(id_))
        if rec is not None:
            v = R.message_view(q.name, id_, rec, self.now_ms, with_content=False)
            return EnqueueResult(id_, True, v.group, v.priority, v.deliver_at_ms)
        return EnqueueResult(id_, True, group, prio, deliver_at)

    def _remember_dedups(self, q: Queue, dids: list[str], ids: range) -> None:
        """`_remember_dedup` of new dedup ids (none known to `q`), in bulk."""
        exp = self.now_ms + q.settings.effective_dedup_window_ms
        q.dedup.update(zip(dids, [(i, exp) for i in ids], strict=True))
        name = q.name
        extend_sorted(self.dedup_exp, sorted([(exp, name, d) for d in dids]))
        prefix = K.name_prefix(K.DEDUP, name)
        pack = R.DEDUP_REC.pack
        self.store.insert_many([prefix + d.encode() for d in dids], b"", [pack(i, exp) for i in ids])
        self.dedup_n += len(dids)
        self._evict_dedups()

    def _remember_dedup(self, q: Queue, did: str, id_: int) -> None:
        old = q.dedup.get(did)
        if old is not None:  # expired but not yet forgotten (window shrank)
            self.dedup_exp.remove((old[1], q.name, did))
            self.dedup_n -= 1
        exp = self.now_ms + q.settings.effective_dedup_window_ms
        q.dedup[did] = (id_, exp)
        self.dedup_exp.add((exp, q.name, did))
        self.store.put(K.dedup_key(q.name, did), R.DEDUP_REC.pack(id_, exp))
        self.dedup_n += 1
        self._evict_dedups()

    def _fresh_run(self, q: Queue, dids: object) -> tuple[str, int] | None:
        """(producer, first sequence) when `dids` are one run of canonical ids of which
        `q` remembers none (the column path); else None."""
        if type(dids) is not list:
            return None
        run = one_run(dids)
        if run is None:
            return None
        runs = q.runs.get(run[0])
        return None if runs is not None and runs.overlaps(run[1], len(dids)) else run

    def _remember_run(self, q: Queue, producer: str, first: int, n: int, id0: int) -> None:
        """Remember the canonical ids `first .. first+n-1` of `producer` (none known to `q`)
        for the messages `id0 .. id0+n-1`: they extend the producer's run that ends right
        before them if its messages end right before `id0` and it expires at the same
        time, else they start a run."""
        exp = self.now_ms + q.settings.effective_dedup_window_ms
        runs = q.runs.get(producer)
        r = runs.floor(first - 1) if runs is not None else None
        if r is not None and r.first + r.count == first and r.id0 + r.count == id0 and r.exp == exp:
            r.count += n
            self.store.put(K.dedup_key(q.name, run_id(producer, r.first)), R.encode_dedup(r.id0, exp, r.count))
            self.dedup_n += n
        else:
            self._add_run(q, producer, Run(first, n, id0, exp))
        self._evict_dedups()

    def _add_run(self, q: Queue, producer: str, run: Run) -> None:
        """A new run (overlapping none): its record, its expiry entry and the count."""
        runs = q.runs.get(producer)
        if runs is None:
            runs = q.runs[producer] = Runs()
        runs.add(run)
        did = run_id(producer, run.first)
        self.dedup_exp.add((run.exp, q.name, did))
        self.store.insert(K.dedup_key(q.name, did), R.encode_dedup(run.id0, run.exp, run.count))
        self.dedup_n += run.count

    def _dequeue(self, cmd: c.Dequeue) -> list[MessageView]:
        """Take up to `max_messages` in the index's order, all at once: one store call to
        lease (rewrite) or remove them, one bulk insert into the lease index."""
        q = self._queue(cmd.queue)
        mx = _int(cmd.max_messages, 1, L.MAX_BATCH_MESSAGES, "max_messages")
        vis = _int(cmd.visibility_timeout_ms, 0, L.MAX_VISIBILITY_TIMEOUT_MS, "visibility_timeout_ms")
        if type(cmd.ack) is not bool:
            raise InvalidArgument("ack must be a bool")
        vis = vis or q.settings.effective_visibility_timeout_ms
        ack = cmd.ack
        seed = 0 if ack else _int(cmd.seed, 0, MASK64, "seed")
        cursor = q.cursor
        if isinstance(q.index, FairIndex):
            ids = [k & MASK64 for k in q.index.pop_many(mx, not ack, self.now_ms)]
        else:
            ids = q.index.pop_ids(mx)
        if q.cursor != cursor:
            self.store.put(K.queue_key(q.name), q.record())
        if not ids:
            return []
        q.delivered += len(ids)
        prefix = q.prefix
        pack = _U64.pack
        mkeys = [prefix + pack(i) for i in ids]
        if ack:
            q.acked += len(ids)
            recs = self.store.pop_many(mkeys)
            q.members.discard_many(ids)
            return self._views(q, ids, recs, 0, None)  # type: ignore[arg-type]
        exp = self.now_ms + vis
        lid0 = self.next_lease
        self.next_lease = lid0 + len(ids)
        lids = lease_ids(seed, lid0, len(ids))
        views: list[MessageView] = []

        def lease(recs: list[bytes]) -> list[bytes]:
            news: list[bytes] = []
            views.extend(self._views(q, ids, recs, exp, lids, news))
            return news

        self.store.rewrite_many(mkeys, lease, lease_only=True)
        hi = exp << 96
        qn = q.qnum
        lease_keys = [hi | (id_ << 32) | qn for id_ in ids]
        if q.qtype is QueueType.FAIR:
            gname = q.index.group_name
            groups = [gname(v.group) for v in views]
        else:
            groups = [""] * len(ids)
        q.inflight.update(zip(ids, map(Entry, lease_keys, groups, lids), strict=True))
        lease_keys.sort()
        extend_sorted(self.leases, lease_keys)
        return views

    def _views(self, q: Queue, ids: list[int], recs: list[bytes], exp: int, lids: Sequence[int] | None,
               leased: list[bytes] | None = None) -> list[MessageView]:
        """The views of messages `ids` (records `recs` before this delivery) delivered now,
        leased until `exp` with lease ids `lids` (0, None: removed); appends their
        leased records to `leased` if given."""
        out: list[MessageView] = []
        ap = out.append
        unpack = _HDR.unpack_from
        pack = _HDR.pack
        name = q.name
        in_flight = MessageState.IN_FLIGHT
        flag = R.FLAG_IN_FLIGHT
        ts_min, ts_cap = R.TS_PRIORITY_MIN, R.MAX_MS // 1000  # `_ts(p)` inline: p * 1000 up to MAX_MS
        max_ms = R.MAX_MS
        for id_, rec, lid in zip(ids, recs, lids if lids is not None else itertools.repeat(0, len(ids)), strict=True):
            prio, not_before, enq, _, _, attempts, _, glen, dlen, mlen = unpack(rec)
            attempts += 1
            if mlen:
                group, dedup, md, content = R.message_parts(rec)
            else:  # `R.message_parts` inline (a fair queue's messages: a group, no metadata)
                md = {}
                p = _HDR_SIZE + glen
                group = rec[_HDR_SIZE:p].decode() if glen else ""
                dedup = rec[p : p + dlen].decode() if dlen else ""
                content = rec[p + dlen :]
            at = not_before
            if prio >= ts_min:  # a timestamp priority: not before prio * 1000 ms (`_ts`, inline)
                ts_ms = prio * 1000 if prio <= ts_cap else max_ms
                if ts_ms > at:
                    at = ts_ms
            ap(MessageView(id_, name, group, prio, attempts, at,
                           exp, enq, in_flight, lid, dedup, md, content))
            if leased is not None:
                leased.append(pack(prio, not_before, enq, exp, lid, attempts, flag, glen, dlen, mlen)
                              + rec[_HDR_SIZE:])
        return out

    def _in_flight(self, q: Queue, id_: object, lease_id: object) -> Entry:
        """The in-flight entry named by (id, lease) or the error the rules prescribe."""
        _int(lease_id, 0, MASK64, "lease_id")
        e = q.inflight.get(_int(id_, 1, MASK64, "id"))
        if e is None and id_ not in q.members:
            raise MessageNotFound(f"message {id_} not found in queue {q.name!r}")
        if lease_id and (e is None or lease_id != e.lease_id):
            raise StaleLease(f"lease {lease_id} of message {id_} is no longer current")
        if e is None:
            raise FailedPrecondition(f"message {id_} is not in flight", reason="NOT_IN_FLIGHT")
        return e

    def _ack(self, cmd: c.Ack) -> list[DoqError | None]:
        q = self._queue(cmd.queue)
        ids, lids = cmd.ids, cmd.lease_ids
        if type(ids) is not list or type(lids) is not list or (lids and len(lids) != len(ids)):
            raise InvalidArgument("lease_ids must be empty or as long as ids",
                                  reason="INVALID_LEASE_IDS")
        out: list[DoqError | None] = []
        inflight = q.inflight
        fair = q.index if isinstance(q.index, FairIndex) else None
        left: list[str] = []  # the groups of the acked messages of a fair queue, for its index
        acked: list[int] = []
        lease_keys: list[int] = []
        flushed = 0  # acked[:flushed] are out of q.members
        for i, id_ in enumerate(ids):
            lid = lids[i] if lids else 0
            if not (type(id_) is int and type(lid) is int and lid >= 0 and (e := inflight.get(id_)) is not None
                    and (not lid or lid == e.lease_id)):
                q.members.discard_many(acked[flushed:])  # an id acked earlier in this call is gone
                flushed = len(acked)
                try:
                    e = self._in_flight(q, id_, lid)  # the error the rules prescribe
                except DoqError as err:
                    out.append(err)
                    continue
            lease_keys.append(e.key)
            if fair is not None:
                left.append(e.group)
            del inflight[id_]
            acked.append(id_)
            out.append(None)
        if acked:  # the lease index, the fair index and the records, in bulk
            if fair is not None:
                fair.unleased_many(left)
            q.acked += len(acked)
            q.members.discard_many(acked[flushed:])
            lease_keys.sort()
            remove_many(self.leases, lease_keys)
            prefix = q.prefix
            pack = _U64.pack
            self.store.delete_many([prefix + pack(i) for i in acked])
        return out

    def _nack(self, cmd: c.Nack) -> None:
        q = self._queue(cmd.queue)
        delay = _int(cmd.delay_ms, 0, MAX_DELAY_MS, "delay_ms")
        if cmd.priority is not None:
            _int(cmd.priority, INT64_MIN, INT64_MAX, "priority")
        if type(cmd.release) is not bool:
            raise InvalidArgument("release must be a bool")
        if cmd.release and (delay or cmd.priority is not None):
            raise InvalidArgument("a release takes no delay_ms and no priority", reason="INVALID_RELEASE")
        e = self._in_flight(q, cmd.id, cmd.lease_id)
        self._unlease(q, cmd.id, e)
        if cmd.release:
            self._release(q, cmd.id, e)
        else:
            self._return(q, cmd.id, e, delay, cmd.priority)
        return None

    def _unlease(self, q: Queue, id_: int, e: Entry) -> None:
        """Take in-flight message `id_` (entry `e`) out of flight: lease index, entry, count."""
        self.leases.remove(e.key)
        del q.inflight[id_]
        q.index.unleased(e.group)

    def _release(self, q: Queue, id_: int, e: Entry) -> None:
        """Undo a delivery (the caller took the entry out of flight): the attempt it
        counted is taken back and the message is placed as before it was delivered."""
        mkey = q.prefix + _U64.pack(id_)
        rec = self.store.get(mkey)
        assert rec is not None
        h = _HDR.unpack_from(rec)
        prio, not_before, attempts = h[0], h[1], h[5]
        self.store.put(mkey, R.with_header(rec, prio, not_before, 0, 0, max(attempts - 1, 0), 0))
        self._place(q, id_, prio, e.group, max(not_before, _ts(prio)))

    def _touch(self, cmd: c.Touch) -> int:
        q = self._queue(cmd.queue)
        vis = _int(cmd.visibility_timeout_ms, 0, L.MAX_VISIBILITY_TIMEOUT_MS, "visibility_timeout_ms")
        e = self._in_flight(q, cmd.id, cmd.lease_id)
        exp = self.now_ms + (vis or q.settings.effective_visibility_timeout_ms)
        self.leases.remove(e.key)
        e.key = (exp << 96) | (cmd.id << 32) | q.qnum
        self.leases.add(e.key)
        mkey = q.prefix + _U64.pack(cmd.id)
        rec = self.store.get(mkey)
        assert rec is not None
        h = _HDR.unpack_from(rec)
        self.store.put(mkey, R.with_header(rec, h[0], h[1], exp, h[4], h[5], h[6]))
        return exp

    def _entry(self, q: Queue, id_: object) -> Entry | None:
        """The in-flight entry of message `id_` of `q` (None: waiting, ready or delayed);
        MessageNotFound if `q` holds no such message."""
        e = q.inflight.get(_int(id_, 1, MASK64, "id"))
        if e is None and id_ not in q.members:
            raise MessageNotFound(f"message {id_} not found in queue {q.name!r}")
        return e

    def _update_priority(self, cmd: c.UpdatePriority) -> MessageView:
        q = self._queue(cmd.queue)
        prio = _int(cmd.priority, INT64_MIN, INT64_MAX, "priority")
        e = self._entry(q, cmd.id)
        mkey = q.prefix + _U64.pack(cmd.id)
        old = self.store.get(mkey)
        assert old is not None
        h = _HDR.unpack_from(old)
        rec = R.with_header(old, prio, h[1], h[3], h[4], h[5], h[6])
        self.store.put(mkey, rec)
        if e is None:
            self._unplace_waiting(q, cmd.id, old)
            self._place(q, cmd.id, prio, self._group_of(q, old, h[7]), max(h[1], _ts(prio)))
        return R.message_view(q.name, cmd.id, rec, self.now_ms, with_content=False)

    def _delete_message(self, cmd: c.DeleteMessage) -> None:
        q = self._queue(cmd.queue)
        if type(cmd.holder_only) is not bool:
            raise InvalidArgument("holder_only must be a bool")
        if cmd.lease_id:
            e: Entry | None = self._in_flight(q, cmd.id, cmd.lease_id)
        else:
            e = self._entry(q, cmd.id)
            if cmd.holder_only and e is not None:
                raise FailedPrecondition(
                    f"message {cmd.id} is in flight: deleting it needs its lease_id (from the delivery) "
                    "or an admin key", reason="MESSAGE_IN_FLIGHT")
        mkey = q.prefix + _U64.pack(cmd.id)
        if e is not None:
            self._unlease(q, cmd.id, e)
        else:
            rec = self.store.get(mkey)
            assert rec is not None
            self._unplace_waiting(q, cmd.id, rec)
        q.members.discard(cmd.id)
        self.store.delete(mkey)
        return None


def _released(commands: Sequence[c.Command]) -> frozenset[tuple[str, int, int]]:
    """(queue, id, lease id) of the well-formed `Nack(release=True)` among `commands`."""
    out = [(cmd.queue, cmd.id, cmd.lease_id) for cmd in commands
           if type(cmd) is c.Nack and cmd.release is True and type(cmd.queue) is str
           and type(cmd.id) is int and type(cmd.lease_id) is int and cmd.lease_id]
    return frozenset(out) if out else frozenset()
