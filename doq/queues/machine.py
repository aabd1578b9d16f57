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
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
from doq.queues import records as R
from doq.queues.apikeys import KeyRecord, KeyTable
from doq.queues.dedupruns import CANONICAL_LEN, PRODUCER_LEN, Run, Runs, one_run, parse, run_id
from doq.queues.delayed import MASK64, PriorityIndex, ready_key
from doq.queues.fair import FairIndex
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
from doq.queues.sortedext import extend_sorted, remove_many
from doq.queues.store import Store

READY, DELAYED, IN_FLIGHT = 0, 1, 2
MASK32 = (1 << 32) - 1
INT64_MIN, INT64_MAX = L.PRIORITY_MIN, L.PRIORITY_MAX
MAX_DELAY_MS = L.MAX_DELAY_MS
MAX_DEDUP_ENTRIES = 1_000_000
_U64 = struct.Struct(">Q")
_HDR = R.MSG_HDR
_HDR_SIZE = R.HDR_SIZE
_ts = R.priority_deliver_at


class Entry:
    """In-memory index entry of one message (its record lives in the store).

    key: READY -> ready_key(prio, id); DELAYED -> global delay key; IN_FLIGHT -> lease key
    (global keys are `time << 96 | id << 32 | qnum`).
    """

    __slots__ = ("state", "key", "prio", "group", "lease_id")

    def __init__(self, state: int, key: int, prio: int, group: str, lease_id: int = 0) -> None:
        self.state = state
        self.key = key
        self.prio = prio
        self.group = group
        self.lease_id = lease_id


class Queue:
    __slots__ = ("name", "qtype", "settings", "qnum", "prefix", "msgs", "index", "n_delayed",
                 "n_inflight", "dead", "dedup", "runs", "enqueued", "delivered", "acked")

    def __init__(self, name: str, qtype: QueueType, settings: QueueSettings, qnum: int,
                 dead: int = 0, cursor: str = "") -> None:
        self.name = name
        self.qtype = qtype
        self.settings = settings
        self.qnum = qnum
        self.prefix = K.name_prefix(K.MESSAGE, name)
        self.msgs: dict[int, Entry] = {}
        self.index: PriorityIndex | FairIndex = (
            FairIndex(settings.max_unacked_per_group, cursor) if qtype is QueueType.FAIR
            else PriorityIndex()
        )
        self.n_delayed = 0
        self.n_inflight = 0
        self.dead = dead
        self.dedup: dict[str, tuple[int, int]] = {}  # dedup_id -> (id, expires_at_ms), not canonical
        self.runs: dict[str, Runs] = {}  # producer -> its runs of canonical dedup ids
        # QueueCounters: in memory only, never part of the replicated state or its digest
        self.enqueued = self.delivered = self.acked = 0

    @property
    def cursor(self) -> str:
        return self.index.cursor if isinstance(self.index, FairIndex) else ""

    def record(self) -> bytes:
        return R.encode_queue(self.qtype, self.settings, self.dead, self.cursor)

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


def _round_robin(index: FairIndex, n: int) -> list[int]:
    """The ids the next `n` deliveries of a fair queue would take (as `FairIndex.pop` with
    leases, which the per-group limit counts), computed without changing the index."""
    limit = index.limit
    turns: list[tuple[str, int]] = []  # (group, deliveries it may still make), in rotation order
    names = list(index.active)
    start = index.active.bisect_right(index.cursor) if names else 0
    for name in names[start:] + names[:start]:
        g = index.groups[name]
        room = len(g.ready) if limit == 0 else min(len(g.ready), limit - g.inflight)
        turns.append((name, room))
    taken: dict[str, int] = {}
    out: list[int] = []
    while turns and len(out) < n:
        still: list[tuple[str, int]] = []
        for name, room in turns:
            i = taken.get(name, 0)
            out.append(index.groups[name].ready[i] & MASK64)
            taken[name] = i + 1
            if i + 1 < room:
                still.append((name, room))
            if len(out) == n:
                break
        turns = still
    return out


class QueueMachine:
    """The replicated queue state. Only `apply`/`load` mutate it (single writer)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.queues: dict[str, Queue] = {}
        self.join_tokens = JoinTokens()  # kept by the state store beside the keys (below)
        self._by_num: dict[int, Queue] = {}
        self._qnums = 0  # in-memory handles; never influence ordering (ids are unique)
        self.delayed: SortedList = SortedList()  # deliver_at << 96 | id << 32 | qnum
        self.leases: SortedList = SortedList()  # expires_at << 96 | id << 32 | qnum
        # (expires_at, queue, dedup_id): one entry per dedup record (a run: its first id)
        self.dedup_exp: SortedList = SortedList()
        self.dedup_n = 0  # dedup ids remembered (a run counts its ids)
        self.next_id = 1
        self.next_lease = 1
        self.now_ms = 0
        self._meta_written: tuple[int, int, int] = (1, 0, 1)
        self._changed: set[str] = set()  # queue names whose info may differ (take_changed)
        # client keys: replicated, but kept by the state store apart from the records
        # (`doq.queues.apikeys`); `load` leaves them to the store
        self.keys = KeyTable()
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
        }

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
        meta = (self.next_id, self.now_ms, self.next_lease)
        if meta != self._meta_written:
            self.store.put(K.META_KEY, R.META_REC.pack(*meta))
            self._meta_written = meta
        return results

    def next_due_ms(self) -> int | None:
        """Earliest replicated time at which a delay ends or a lease expires (None: never)."""
        due: int | None = None
        if self.delayed:
            due = self.delayed[0] >> 96
        if self.leases:
            t = self.leases[0] >> 96
            due = t if due is None else min(due, t)
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

    def sort_known(self, queue: str, ids: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Positions of `ids` as this state knows them: (present: in `queue` in any state;
        gone: assigned — below `next_id` — and no longer in `queue`, so an ack, nack or
        touch of it can only fail with MessageNotFound, now and at any later index, as
        ids are never reused; unborn: not assigned yet at this state). For a queue this
        state does not hold, every position is present (the command answers for it)."""
        q = self.queues.get(queue)
        if q is None or all(map(q.msgs.__contains__, ids)):  # the common case, at C speed
            return list(range(len(ids))), [], []
        msgs, next_id = q.msgs, self.next_id
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
        then id; for a fair queue the round-robin from the cursor, with the per-group limit),
        delayed ones by due time, in-flight ones by lease expiry. Positions `offset` to
        `offset + limit`; the cost grows with `offset + limit` (callers bound it), and for
        delayed and in-flight messages with the other queues' entries before them."""
        q = self.queues.get(queue)
        if q is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        end = offset + limit
        if state is MessageState.READY:
            if isinstance(q.index, FairIndex):
                return _round_robin(q.index, end)[offset:]
            return [k & MASK64 for k in q.index.ready.islice(offset, end)]
        ordered = self.delayed if state is MessageState.DELAYED else self.leases
        out: list[int] = []
        if (q.n_delayed if state is MessageState.DELAYED else q.n_inflight) <= offset:
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
        """Every group of a fair queue with a message ready or in flight, by name ([] for a
        delayed queue)."""
        q = self.queues.get(queue)
        if q is None:
            raise QueueNotFound(f"queue {queue!r} not found")
        if not isinstance(q.index, FairIndex):
            return []
        groups = q.index.groups
        return [GroupStats(n, len(groups[n].ready), groups[n].inflight) for n in sorted(groups)]

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
    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """Rebuild all in-memory state from the records (any order of kinds is fine,
        but keys of one kind in key order is fastest). Replaces the current state."""
        keys, join_tokens = self.keys, self.join_tokens
        self.__init__(self.store)  # type: ignore[misc]
        self.keys, self.join_tokens = keys, join_tokens
        msgs: list[tuple[bytes, bytes]] = []
        dedups: list[tuple[bytes, bytes]] = []
        for key, rec in records:
            kind = key[0]
            if key == K.META_KEY:
                self.next_id, self.now_ms, self.next_lease = R.META_REC.unpack(rec)
                self._meta_written = (self.next_id, self.now_ms, self.next_lease)
            elif kind == K.QUEUE:
                _, name, _ = K.split_name(key)
                qtype, settings, dead, cursor = R.decode_queue(rec)
                self._add_queue(name, qtype, settings, dead, cursor)
            elif kind == K.MESSAGE:
                msgs.append((key, rec))
            elif kind == K.DEDUP:
                dedups.append((key, rec))
            elif kind == K.JOIN_TOKEN:
                pass  # a join token record of an older version (or its backup): inert (doq.queues.keys)
            else:
                raise ValueError(f"unknown record key {key!r}")
        self._load_messages(msgs)
        self._load_dedups(dedups)

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

    def _load_messages(self, msgs: list[tuple[bytes, bytes]]) -> None:
        now = self.now_ms
        delayed: list[int] = []
        leases: list[int] = []
        per_q: dict[str, tuple[dict[str, list[int]], dict[str, int]]] = {}
        prefix = b""
        q: Queue | None = None
        ready: dict[str, list[int]] = {}
        infl: dict[str, int] = {}
        names: dict[str, str] = {}  # interned group names (shared by entries and index)
        unpack = _HDR.unpack_from
        for key, rec in msgs:
            if q is None or not key.startswith(prefix) or len(key) != len(prefix) + 8:
                _, name, _ = K.split_name(key)
                q = self.queues[name]
                prefix = q.prefix
                ready, infl = per_q.setdefault(name, ({}, {}))
                names = {}
            id_ = _U64.unpack_from(key, len(prefix))[0]
            prio, not_before, _, lease_exp, lease_id, _, flags, glen, _, _ = unpack(rec)
            g = rec[_HDR_SIZE : _HDR_SIZE + glen].decode() if q.qtype is QueueType.FAIR else ""
            qn = q.qnum
            g = names.setdefault(g, g)
            if flags & R.FLAG_IN_FLIGHT:
                k = (lease_exp << 96) | (id_ << 32) | qn
                leases.append(k)
                infl[g] = infl.get(g, 0) + 1
                q.msgs[id_] = Entry(IN_FLIGHT, k, prio, g, lease_id)
                q.n_inflight += 1
                continue
            at = max(not_before, _ts(prio))
            if at > now:
                k = (at << 96) | (id_ << 32) | qn
                delayed.append(k)
                q.msgs[id_] = Entry(DELAYED, k, prio, g)
                q.n_delayed += 1
            else:
                k = ((prio + (1 << 63)) << 64) | id_
                lst = ready.get(g)
                if lst is None:
                    lst = ready[g] = []
                lst.append(k)
                q.msgs[id_] = Entry(READY, k, prio, g)
        for name, (rd, inf) in per_q.items():
            self.queues[name].index.bulk_load(rd, inf)
        self.delayed = SortedList(delayed)
        self.leases = SortedList(leases)

    # -- time ----------------------------------------------------------------------------
    def _advance(self, now: int, spared: frozenset[tuple[str, int, int]] = frozenset()) -> None:
        """Replicated time reaches `now`: due delays end, due leases expire, due dedup
        records are forgotten. A due lease the batch releases (`spared`: (queue, id,
        lease id) of its `Nack(release=True)` commands) does not expire: the release
        undoes its delivery, no attempt counted (a dequeue that committed after its
        lease's end, e.g. through a quorum loss, is released by the service that never
        handed it out; its release must not lose to the expiry)."""
        delayed = self.delayed
        if delayed and delayed[0] >> 96 <= now:
            by_num = self._by_num
            while delayed and delayed[0] >> 96 <= now:
                k = delayed.pop(0)
                q = by_num[k & MASK32]
                id_ = (k >> 32) & MASK64
                e = q.msgs[id_]
                q.n_delayed -= 1
                self._changed.add(q.name)
                e.state = READY
                e.key = ready_key(e.prio, id_)
                q.index.add(e.key, e.group)
        leases = self.leases
        if leases and leases[0] >> 96 <= now:
            kept: list[int] = []
            while leases and leases[0] >> 96 <= now:
                k = leases.pop(0)
                q = self._by_num[k & MASK32]
                id_ = (k >> 32) & MASK64
                e = q.msgs[id_]
                if spared and (q.name, id_, e.lease_id) in spared:
                    kept.append(k)
                    continue
                q.n_inflight -= 1
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
    def _place(self, q: Queue, id_: int, e: Entry, deliver_at: int) -> None:
        """Put a not-in-flight entry into the ready or delayed index."""
        if deliver_at > self.now_ms:
            e.state = DELAYED
            e.key = (deliver_at << 96) | (id_ << 32) | q.qnum
            self.delayed.add(e.key)
            q.n_delayed += 1
        else:
            e.state = READY
            e.key = ready_key(e.prio, id_)
            q.index.add(e.key, e.group)

    def _unplace(self, q: Queue, e: Entry) -> None:
        """Remove an entry from whichever index holds it."""
        if e.state == READY:
            q.index.remove(e.key, e.group)
        elif e.state == DELAYED:
            self.delayed.remove(e.key)
            q.n_delayed -= 1
        else:
            self.leases.remove(e.key)
            q.n_inflight -= 1
            q.index.unleased(e.group)

    def _return(self, q: Queue, id_: int, e: Entry, delay_ms: int, prio: int | None) -> None:
        """A message left flight without ack (expiry or nack): requeue or dead-letter.
        The caller already removed it from the lease index and counters."""
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
        e.lease_id = 0
        e.prio = p
        self._place(q, id_, e, max(not_before, _ts(p)))

    def _dead_letter(self, q: Queue, id_: int, mkey: bytes, rec: bytes) -> None:
        self.store.delete(mkey)
        del q.msgs[id_]
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
        e = Entry(READY, 0, prio, g)
        q.msgs[id_] = e
        self._place(q, id_, e, max(not_before, _ts(prio)))
        return id_

    # -- queues --------------------------------------------------------------------------
    def _queue(self, name: object) -> Queue:
        """The queue a command acts on (marked changed: the command may alter its info)."""
        q = self.queues.get(name) if type(name) is str else None
        if q is None:
            raise QueueNotFound(f"queue {name!r} not found")
        self._changed.add(q.name)
        return q

    def _add_queue(self, name: str, qtype: QueueType, settings: QueueSettings, dead: int = 0,
                   cursor: str = "") -> Queue:
        self._qnums += 1
        q = Queue(name, qtype, settings, self._qnums, dead, cursor)
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
            q.index.set_limit(settings.max_unacked_per_group)
        self.store.put(K.queue_key(q.name), q.record())
        return q.info()

    def _purge(self, q: Queue) -> int:
        n = len(q.msgs)
        delete = self.store.delete
        prefix = q.prefix
        for id_, e in q.msgs.items():
            if e.state == DELAYED:
                self.delayed.remove(e.key)
            elif e.state == IN_FLIGHT:
                self.leases.remove(e.key)
            delete(prefix + _U64.pack(id_))
        q.msgs = {}
        q.index.clear()
        q.n_delayed = q.n_inflight = 0
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
        del self.queues[q.name]
        del self._by_num[q.qnum]
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
        base = (1 << 63) << 64  # ready_key(0, id) == base | id
        keys = [base | i for i in ids]
        g = q.index.group_name("") if q.qtype is QueueType.FAIR else ""
        q.msgs.update(zip(ids, [Entry(READY, k, 0, g) for k in keys], strict=True))
        q.index.add_many(keys, g)
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
        if prios and (set(map(type, prios)) != {int} or min(prios) < INT64_MIN or max(prios) > INT64_MAX):
            return None
        groups = cmd.groups
        gbs: list[bytes] = []
        if groups:
            if set(map(type, groups)) != {str}:
                return None
            try:
                gbs = [g.encode() for g in groups]
            except UnicodeError:
                return None
            if max(map(len, gbs)) > 0xFFFF:
                return None
        dlen = len(tails[0]) - len(cmd.contents[0]) if cmd.dedup_ids else 0
        first = self.next_id
        ids = range(first, first + n)
        self.next_id = first + n
        now = self.now_ms
        pack = _HDR.pack
        ps = prios or [0] * n
        if gbs:
            recs = [pack(p, 0, now, 0, 0, 0, 0, len(gb), dlen, 0) + gb + t for p, gb, t in zip(ps, gbs, tails, strict=True)]
        else:
            recs = [pack(p, 0, now, 0, 0, 0, 0, 0, dlen, 0) + t for p, t in zip(ps, tails, strict=True)]
        u64 = _U64.pack
        prefix = q.prefix
        self.store.insert_many([prefix + u64(i) for i in ids], b"", recs)
        if run is not None:
            self._remember_run(q, run[0], run[1], n, first)
        elif cmd.dedup_ids:
            self._remember_dedups(q, cmd.dedup_ids, ids)
        fair = q.qtype is QueueType.FAIR
        names: dict[str, str] = {}
        ready: dict[str, list[int]] = {}
        delayed: list[int] = []
        deliver: list[int] = []
        msgs = q.msgs
        qn = q.qnum
        base = 1 << 63
        for j, id_ in enumerate(ids):
            p = ps[j]
            g = ""
            if fair and groups:
                g = names.get(groups[j], "")
                if not g and groups[j]:
                    g = names[groups[j]] = q.index.group_name(groups[j])
            at = _ts(p) if p >= R.TS_PRIORITY_MIN else 0
            deliver.append(at)
            if at > now:
                k = (at << 96) | (id_ << 32) | qn
                msgs[id_] = Entry(DELAYED, k, p, g)
                delayed.append(k)
            else:
                k = ((p + base) << 64) | id_
                msgs[id_] = Entry(READY, k, p, g)
                lst = ready.get(g)
                if lst is None:
                    lst = ready[g] = []
                lst.append(k)
        if delayed:
            self.delayed.update(delayed)
            q.n_delayed += len(delayed)
        for g in sorted(ready):
            keys = ready[g]
            keys.sort()
            q.index.add_many(keys, g)
        q.enqueued += n
        return EnqueueColumnsResult(ids, deliver_at_ms=deliver if any(deliver) else [])

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
            if deliver_at > now:
                k = (deliver_at << 96) | (id_ << 32) | q.qnum
                q.msgs[id_] = Entry(DELAYED, k, prio, g)
                self.delayed.add(k)
                q.n_delayed += 1
            else:
                k = ((prio + (1 << 63)) << 64) | id_
                q.msgs[id_] = Entry(READY, k, prio, g)
                q.index.add(k, g)
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
        cursor = q.cursor
        ids = [k & MASK64 for k in q.index.pop_many(mx, not ack)]
        if q.cursor != cursor:
            self.store.put(K.queue_key(q.name), q.record())
        if not ids:
            return []
        q.delivered += len(ids)
        prefix = q.prefix
        pack = _U64.pack
        mkeys = [prefix + pack(i) for i in ids]
        msgs = q.msgs
        if ack:
            q.acked += len(ids)
            recs = self.store.pop_many(mkeys)
            for id_ in ids:
                del msgs[id_]
            return self._views(q, ids, recs, 0, None)  # type: ignore[arg-type]
        exp = self.now_ms + vis
        seed = _int(cmd.seed, 0, MASK64, "seed")
        lid0 = self.next_lease
        self.next_lease = lid0 + len(ids)
        lids = lease_ids(seed, lid0, len(ids))
        views: list[MessageView] = []

        def lease(recs: list[bytes]) -> list[bytes]:
            news: list[bytes] = []
            views.extend(self._views(q, ids, recs, exp, lids, news))
            return news

        self.store.rewrite_many(mkeys, lease)
        hi = exp << 96
        qn = q.qnum
        lease_keys = []
        for id_, lid in zip(ids, lids, strict=True):
            e = msgs[id_]
            e.state = IN_FLIGHT
            e.lease_id = lid
            e.key = k = hi | (id_ << 32) | qn
            lease_keys.append(k)
        q.n_inflight += len(ids)
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
        for id_, rec, lid in zip(ids, recs, lids if lids is not None else itertools.repeat(0, len(ids)), strict=True):
            prio, not_before, enq, _, _, attempts, _, glen, dlen, mlen = unpack(rec)
            attempts += 1
            if glen or mlen:
                group, dedup, md, content = R.message_parts(rec)
            else:
                group, md = "", {}
                dedup = rec[_HDR_SIZE : _HDR_SIZE + dlen].decode() if dlen else ""
                content = rec[_HDR_SIZE + dlen :]
            ap(MessageView(id_, name, group, prio, attempts,
                           max(not_before, _ts(prio)) if prio >= R.TS_PRIORITY_MIN else not_before,
                           exp, enq, in_flight, lid, dedup, md, content))
            if leased is not None:
                leased.append(pack(prio, not_before, enq, exp, lid, attempts, flag, glen, dlen, mlen)
                              + rec[_HDR_SIZE:])
        return out

    def _in_flight(self, q: Queue, id_: object, lease_id: object) -> Entry:
        """The in-flight entry named by (id, lease) or the error the rules prescribe."""
        _int(lease_id, 0, MASK64, "lease_id")
        e = q.msgs.get(_int(id_, 1, MASK64, "id"))
        if e is None:
            raise MessageNotFound(f"message {id_} not found in queue {q.name!r}")
        if lease_id and (e.state != IN_FLIGHT or lease_id != e.lease_id):
            raise StaleLease(f"lease {lease_id} of message {id_} is no longer current")
        if e.state != IN_FLIGHT:
            raise FailedPrecondition(f"message {id_} is not in flight", reason="NOT_IN_FLIGHT")
        return e

    def _ack(self, cmd: c.Ack) -> list[DoqError | None]:
        q = self._queue(cmd.queue)
        ids, lids = cmd.ids, cmd.lease_ids
        if type(ids) is not list or type(lids) is not list or (lids and len(lids) != len(ids)):
            raise InvalidArgument("lease_ids must be empty or as long as ids",
                                  reason="INVALID_LEASE_IDS")
        out: list[DoqError | None] = []
        msgs = q.msgs
        unleased = q.index.unleased if isinstance(q.index, FairIndex) else None
        acked: list[int] = []
        lease_keys: list[int] = []
        for i, id_ in enumerate(ids):
            lid = lids[i] if lids else 0
            if not (type(id_) is int and type(lid) is int and lid >= 0 and (e := msgs.get(id_)) is not None
                    and e.state == IN_FLIGHT and (not lid or lid == e.lease_id)):
                try:
                    e = self._in_flight(q, id_, lid)  # the error the rules prescribe
                except DoqError as err:
                    out.append(err)
                    continue
            lease_keys.append(e.key)
            if unleased is not None:
                unleased(e.group)
            del msgs[id_]
            acked.append(id_)
            out.append(None)
        if acked:  # the lease index and the records, in bulk
            q.acked += len(acked)
            q.n_inflight -= len(acked)
            lease_keys.sort()
            remove_many(self.leases, lease_keys)
            prefix = q.prefix
            pack = _U64.pack
            self.store.pop_many([prefix + pack(i) for i in acked])
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
        self.leases.remove(e.key)
        q.n_inflight -= 1
        q.index.unleased(e.group)
        if cmd.release:
            self._release(q, cmd.id, e)
        else:
            self._return(q, cmd.id, e, delay, cmd.priority)
        return None

    def _release(self, q: Queue, id_: int, e: Entry) -> None:
        """Undo a delivery (the caller took the entry out of flight): the attempt it
        counted is taken back and the message is placed as before it was delivered."""
        mkey = q.prefix + _U64.pack(id_)
        rec = self.store.get(mkey)
        assert rec is not None
        h = _HDR.unpack_from(rec)
        prio, not_before, attempts = h[0], h[1], h[5]
        self.store.put(mkey, R.with_header(rec, prio, not_before, 0, 0, max(attempts - 1, 0), 0))
        e.lease_id = 0
        self._place(q, id_, e, max(not_before, _ts(prio)))

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

    def _entry(self, q: Queue, id_: object) -> Entry:
        e = q.msgs.get(_int(id_, 1, MASK64, "id"))
        if e is None:
            raise MessageNotFound(f"message {id_} not found in queue {q.name!r}")
        return e

    def _update_priority(self, cmd: c.UpdatePriority) -> MessageView:
        q = self._queue(cmd.queue)
        prio = _int(cmd.priority, INT64_MIN, INT64_MAX, "priority")
        e = self._entry(q, cmd.id)
        mkey = q.prefix + _U64.pack(cmd.id)
        rec = self.store.get(mkey)
        assert rec is not None
        h = _HDR.unpack_from(rec)
        rec = R.with_header(rec, prio, h[1], h[3], h[4], h[5], h[6])
        self.store.put(mkey, rec)
        if e.state != IN_FLIGHT:
            self._unplace(q, e)
            e.prio = prio
            self._place(q, cmd.id, e, max(h[1], _ts(prio)))
        else:
            e.prio = prio
        return R.message_view(q.name, cmd.id, rec, self.now_ms, with_content=False)

    def _delete_message(self, cmd: c.DeleteMessage) -> None:
        q = self._queue(cmd.queue)
        if type(cmd.holder_only) is not bool:
            raise InvalidArgument("holder_only must be a bool")
        if cmd.lease_id:
            e = self._in_flight(q, cmd.id, cmd.lease_id)
        else:
            e = self._entry(q, cmd.id)
            if cmd.holder_only and e.state == IN_FLIGHT:
                raise FailedPrecondition(
                    f"message {cmd.id} is in flight: deleting it needs its lease_id (from the delivery) "
                    "or an admin key", reason="MESSAGE_IN_FLIGHT")
        self._unplace(q, e)
        del q.msgs[cmd.id]
        self.store.delete(q.prefix + _U64.pack(cmd.id))
        return None


def _released(commands: Sequence[c.Command]) -> frozenset[tuple[str, int, int]]:
    """(queue, id, lease id) of the well-formed `Nack(release=True)` among `commands`."""
    out = [(cmd.queue, cmd.id, cmd.lease_id) for cmd in commands
           if type(cmd) is c.Nack and cmd.release is True and type(cmd.queue) is str
           and type(cmd.id) is int and type(cmd.lease_id) is int and cmd.lease_id]
    return frozenset(out) if out else frozenset()
