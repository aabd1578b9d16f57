"""Redrive: a replicated task that moves the messages of a dead-letter queue back to a
queue (pure: no clock, no I/O; part of the queue state machine).

Contract:
- `StartRedrive(queue, to, max_per_second)` starts the task of `queue` (the dead-letter
  queue, "DLQ"). `to` names the target; "" means the DLQ's source: the one queue whose
  `dead_letter_queue` setting names the DLQ (the machine does not record per message
  where it was dead-lettered from; with none or several such queues `to` is required:
  FailedPrecondition REDRIVE_TARGET_REQUIRED, HTTP 409). Refused, changing nothing: an unknown DLQ or
  target (QueueNotFound), `to` = the DLQ itself (InvalidArgument REDRIVE_TO_ITSELF), a rate
  outside 0..MAX_RATE (InvalidArgument), a task of that DLQ still running
  (FailedPrecondition REDRIVE_RUNNING, HTTP 409). Result: the new `RedriveTask`.
- The task moves the messages the DLQ holds when it starts (ids below `upto_id`, the
  machine's next id then): those ready or delayed, oldest (lowest id) first. A message the
  DLQ received after the start (dead-lettered again) is not moved by this task, so a
  message that keeps failing cannot loop. A message in flight in the DLQ (a consumer holds
  it) is skipped; the task completes when none of its messages is left to move (those in
  flight then stay in the DLQ).
- A moved message keeps its content, group, metadata, dedup id, priority and delivery
  time (`not_before`); it gets a new id, its attempt count is reset to 0 (the target's
  `max_attempts` applies afresh) and its `enqueued_at_ms` is the move's time. Its dedup id
  is carried in the message but not entered in the target's dedup window.
- Pacing: with `max_per_second` N > 0 the task moves at most `1 + N * t / 1000` messages
  in its first `t` ms of replicated time (a token bucket in milli-messages, starting with
  one message and full at one second's worth plus one: while the machine steps the task at
  least once a second it moves exactly `min(left, 1 + N * t // 1000)` by time `t`, for N
  below STEP_MESSAGES), never by a local clock: it advances with
  the leader's `now_ms` stamped in each batch. N = 0: no limit beyond `STEP_MESSAGES`
  per applied batch. The machine steps running tasks at the end of every applied batch
  and reports when the next step is due (`next_due_ms`: once the bucket holds STEP_MS of
  the rate, at least one message), so the leader proposes a `Tick` then (as for leases):
  the task goes on on a new leader after a failover, from its replicated progress.
- `CancelRedrive(queue)` stops a running task (state cancelled; messages moved stay
  moved; a new `StartRedrive` moves what is left). Of a task that ended it returns the
  task unchanged; with no task: NotFound REDRIVE_NOT_FOUND.
- A task whose target is deleted fails (state failed, `reason` says why); deleting the DLQ
  forgets its task.
- The task is replicated state: one record per DLQ (`doq.queues.keys.redrive_key`), in
  the digest, snapshots and backups; `load` rebuilds it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any, Protocol

from doq.errors import FailedPrecondition, InvalidArgument, NotFound, QueueNotFound
from doq.queues import keys as K
from doq.queues import limits as L
from doq.queues.store import Store

RUNNING, COMPLETED, CANCELLED, FAILED = "running", "completed", "cancelled", "failed"
STATES = (RUNNING, COMPLETED, CANCELLED, FAILED)
MAX_RATE = 1_000_000  # messages per second
STEP_MESSAGES = 1000  # messages moved per applied batch at most (bounds an apply's cost)
STEP_MS = 10  # a paced task asks for a step once the bucket holds this long's worth (or one message)
_MILLI = 1000  # the bucket counts milli-messages


@dataclass(frozen=True, slots=True)
class StartRedrive:
    """Start moving `queue`'s messages to `to` ("" = its source queue) at most
    `max_per_second` a second (0 = no limit). Result: `RedriveTask`."""

    queue: str
    to: str = ""
    max_per_second: int = 0


@dataclass(frozen=True, slots=True)
class CancelRedrive:
    """Cancel `queue`'s running redrive. Result: `RedriveTask`."""

    queue: str


RedriveCommand = StartRedrive | CancelRedrive


@dataclass(frozen=True, slots=True)
class RedriveTask:
    """The replicated state of one DLQ's redrive (immutable: replaced whole)."""

    queue: str
    to: str
    max_per_second: int  # 0 = no limit
    state: str  # RUNNING | COMPLETED | CANCELLED | FAILED
    moved: int  # messages moved so far
    total: int  # messages the task set out to move (ready + delayed at the start)
    upto_id: int  # it moves messages with ids below this (the next id at its start)
    started_at_ms: int
    updated_at_ms: int  # replicated time of the last change (a move, the end)
    credit_milli: int  # the pacing bucket at `clock_ms` (milli-messages)
    clock_ms: int  # replicated time the bucket was last computed at
    reason: str = ""  # why it failed ("" otherwise)

    def remaining(self, ready: int, delayed: int) -> int:
        """Messages the task may still move, given the DLQ's ready and delayed counts now
        (an upper bound while it runs: some may have been consumed or deleted)."""
        if self.state != RUNNING:
            return 0
        return max(0, min(self.total - self.moved, ready + delayed))


# -- record ------------------------------------------------------------------------------
# version, state, max_per_second, moved, total, upto_id, started, updated, credit, clock,
# then the target and the reason (u16-length-prefixed utf-8)
_REC = struct.Struct("<BBQQQQQQQQ")
_U16 = struct.Struct("<H")
_REC_VERSION = 1


def encode_task(t: RedriveTask) -> bytes:
    to, why = t.to.encode(), t.reason.encode()
    return b"".join((
        _REC.pack(_REC_VERSION, STATES.index(t.state), t.max_per_second, t.moved, t.total, t.upto_id,
                  t.started_at_ms, t.updated_at_ms, t.credit_milli, t.clock_ms),
        _U16.pack(len(to)), to, _U16.pack(len(why)), why,
    ))


def decode_task(queue: str, rec: bytes) -> RedriveTask:
    """The task of `queue` from its record; raises ValueError if malformed."""
    if len(rec) < _REC.size + 4:
        raise ValueError(f"a redrive record of {len(rec)} bytes is too short")
    v, st, rate, moved, total, upto, started, updated, credit, clock = _REC.unpack_from(rec)
    if v != _REC_VERSION or st >= len(STATES):
        raise ValueError(f"unknown redrive record version {v} or state {st}")
    p = _REC.size
    n = _U16.unpack_from(rec, p)[0]
    to = rec[p + 2 : p + 2 + n].decode()
    p += 2 + n
    if p + 2 > len(rec):
        raise ValueError("truncated redrive record")
    n = _U16.unpack_from(rec, p)[0]
    why = rec[p + 2 : p + 2 + n].decode()
    if p + 2 + n != len(rec):
        raise ValueError("a redrive record of the wrong length")
    return RedriveTask(queue, to, rate, STATES[st], moved, total, upto, started, updated, credit, clock, why)


# -- the tasks ---------------------------------------------------------------------------
class QueueMachine(Protocol):
    """What the tasks use of `doq.queues.machine.QueueMachine` (its queues are
    `doq.queues.machine.Queue`s)."""

    queues: dict[str, Any]
    next_id: int
    now_ms: int
    store: Store
    _changed: set[str]

    def redrive_candidates(self, q: Any, upto_id: int, n: int) -> list[int]: ...

    def move_messages(self, src: Any, ids: list[int], dst: Any) -> None: ...


class Redrives:
    """The machine's redrive tasks by DLQ name. `tasks` is replaced whole on every change,
    so a reader on another thread may take it as an immutable snapshot."""

    def __init__(self) -> None:
        self.tasks: dict[str, RedriveTask] = {}
        self.running: tuple[str, ...] = ()  # names of running tasks, sorted

    def _set(self, m: QueueMachine, task: RedriveTask) -> None:
        self.tasks = {**self.tasks, task.queue: task}
        self.running = tuple(sorted(n for n, t in self.tasks.items() if t.state == RUNNING))
        m.store.put(K.redrive_key(task.queue), encode_task(task))

    def load(self, queue: str, rec: bytes) -> None:
        """Rebuild one task from its record (the machine's `load`)."""
        task = decode_task(queue, rec)
        self.tasks = {**self.tasks, queue: task}
        self.running = tuple(sorted(n for n, t in self.tasks.items() if t.state == RUNNING))

    def forget(self, m: QueueMachine, queue: str) -> None:
        """The DLQ `queue` was deleted: its task goes with it."""
        if queue in self.tasks:
            self.tasks = {n: t for n, t in self.tasks.items() if n != queue}
            self.running = tuple(n for n in self.running if n != queue)
            m.store.delete(K.redrive_key(queue))

    # -- commands --------------------------------------------------------------------------
    def start(self, m: QueueMachine, cmd: StartRedrive) -> RedriveTask:
        name = cmd.queue
        if type(name) is not str or not L.is_queue_name(name):
            raise InvalidArgument(f"invalid queue name: {L.QUEUE_NAME_RULE}", reason="INVALID_QUEUE_NAME")
        dlq = m.queues.get(name)
        if dlq is None:
            raise QueueNotFound(f"queue {name!r} not found")
        rate = cmd.max_per_second
        if type(rate) is not int or not 0 <= rate <= MAX_RATE:
            raise InvalidArgument(f"max_per_second must be an integer within 0..{MAX_RATE} (0: no limit)",
                                  reason="INVALID_ARGUMENT")
        to = cmd.to
        if type(to) is not str:
            raise InvalidArgument("to must be a queue name", reason="INVALID_QUEUE_NAME")
        if not to:
            sources = sorted(q.name for q in m.queues.values() if q.settings.dead_letter_queue == name)
            if len(sources) != 1:
                raise FailedPrecondition(
                    f"queue {name!r} is the dead-letter queue of {len(sources)} queues "
                    f"({', '.join(sources) or 'none'}): name the target with `to`",
                    reason="REDRIVE_TARGET_REQUIRED")
            to = sources[0]
        elif not L.is_queue_name(to):
            raise InvalidArgument(f"invalid target queue name: {L.QUEUE_NAME_RULE}", reason="INVALID_QUEUE_NAME")
        if to == name:
            raise InvalidArgument(f"a redrive moves messages out of {name!r}: `to` must be another queue",
                                  reason="REDRIVE_TO_ITSELF")
        if to not in m.queues:
            raise QueueNotFound(f"target queue {to!r} not found")
        old = self.tasks.get(name)
        if old is not None and old.state == RUNNING:
            raise FailedPrecondition(
                f"a redrive of {name!r} is running ({old.moved} moved): cancel it first",
                reason="REDRIVE_RUNNING")
        now = m.now_ms
        total = dlq.index.n_ready + dlq.n_delayed
        task = RedriveTask(name, to, rate, RUNNING, 0, total, m.next_id, now, now, _MILLI, now)
        self._set(m, task)
        m._changed.add(name)
        return task

    def cancel(self, m: QueueMachine, cmd: CancelRedrive) -> RedriveTask:
        name = cmd.queue
        if type(name) is not str or name not in m.queues:
            raise QueueNotFound(f"queue {name!r} not found")
        task = self.tasks.get(name)
        if task is None:
            raise NotFound(f"queue {name!r} has no redrive", reason="REDRIVE_NOT_FOUND")
        if task.state != RUNNING:
            return task
        task = replace(task, state=CANCELLED, updated_at_ms=m.now_ms)
        self._set(m, task)
        m._changed.add(name)
        return task

    # -- time --------------------------------------------------------------------------------
    def _credit(self, t: RedriveTask, now: int) -> int:
        """The bucket (milli-messages) at replicated time `now`."""
        cap = (t.max_per_second + 1) * _MILLI
        return min(cap, t.credit_milli + (now - t.clock_ms) * t.max_per_second)

    def step(self, m: QueueMachine) -> None:
        """Move what the running tasks may move now (end of every applied batch)."""
        for name in self.running:
            self._step(m, self.tasks[name])

    def _step(self, m: QueueMachine, t: RedriveTask) -> None:
        now = m.now_ms
        dlq = m.queues[t.queue]
        target = m.queues.get(t.to)
        if target is None:
            self._set(m, replace(t, state=FAILED, updated_at_ms=now,
                                 reason=f"the target queue {t.to!r} was deleted"))
            m._changed.add(t.queue)
            return
        if t.max_per_second:
            credit = self._credit(t, now)
            n = min(credit // _MILLI, STEP_MESSAGES)
            if n == 0:
                return  # nothing changes until the bucket holds a message
        else:
            credit, n = 0, STEP_MESSAGES
        ids = m.redrive_candidates(dlq, t.upto_id, n + 1)
        take = ids[:n]
        if take:
            m.move_messages(dlq, take, target)
        done = len(ids) <= n
        self._set(m, replace(
            t, state=COMPLETED if done else RUNNING, moved=t.moved + len(take), updated_at_ms=now,
            credit_milli=credit - len(take) * _MILLI if t.max_per_second else 0, clock_ms=now))
        m._changed.add(t.queue)

    def next_due_ms(self, now: int) -> int | None:
        """When a running task wants its next step: at once without a rate; else once its
        bucket holds STEP_MS of its rate (at least one message), so the leader's ticks
        come at most every STEP_MS (fewer log entries) and never later than the next
        message could move when the rate is below one message per STEP_MS."""
        due: int | None = None
        for name in self.running:
            t = self.tasks[name]
            if not t.max_per_second:
                at = now
            else:
                want = max(_MILLI, t.max_per_second * STEP_MS)
                short = want - self._credit(t, now)
                at = now if short <= 0 else now + -(-short // t.max_per_second)
            due = at if due is None else min(due, at)
        return due
