"""An obviously-correct reference model of the queue semantics: plain lists, O(n) scans.

Mirrors the documented rules of `doq.queues.machine` (see its module docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from doq.errors import (
    AlreadyExists,
    DoqError,
    FailedPrecondition,
    InvalidArgument,
    MessageNotFound,
    QueueNotFound,
    StaleLease,
)
from doq.queues import commands as c
from doq.queues.model import QueueSettings

M64 = 2**64


def _mix(x: int) -> int:
    """splitmix64 (Steele, Lea, Flood 2014), written out independently of the machine's."""
    z = (x + 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)


def ts_rule(priority: int) -> int:
    return min(priority * 1000, 2**63 - 1) if priority >= 1_000_000_000 else 0


@dataclass
class RMsg:
    id: int
    group: str
    prio: int
    not_before: int
    enqueued: int
    content: bytes
    metadata: dict[str, str]
    dedup: str = ""
    attempts: int = 0
    inflight: bool = False
    lease_exp: int = 0
    lease_id: int = 0

    @property
    def deliver_at(self) -> int:
        return max(self.not_before, ts_rule(self.prio))


@dataclass
class RQueue:
    name: str
    type: str
    settings: QueueSettings
    msgs: list[RMsg] = field(default_factory=list)
    dead: int = 0
    cursor: str = ""
    dedup: dict[str, tuple[int, int]] = field(default_factory=dict)
    credit: int = 0  # deliveries the cursor's group may still make in its turn
    overrides: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> (weight|0, rate|-1)
    buckets: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> (milli-tokens, at_ms)

    def find(self, id_: int) -> RMsg | None:
        for m in self.msgs:
            if m.id == id_:
                return m
        return None


class Reference:
    def __init__(self) -> None:
        self.now = 0
        self.next_id = 1
        self.next_lease = 1
        self.queues: dict[str, RQueue] = {}

    # -- time --------------------------------------------------------------------------
    def advance(self, now: int) -> None:
        self.now = max(self.now, now)
        due = sorted(
            ((m.lease_exp, m.id), q.name)
            for q in self.queues.values() for m in q.msgs if m.inflight and m.lease_exp <= self.now
        )
        for (_, id_), qname in due:
            q = self.queues[qname]
            m = q.find(id_)
            assert m is not None
            self._return(q, m, 0, None)
        for q in self.queues.values():
            q.dedup = {d: v for d, v in q.dedup.items() if v[1] > self.now}

    def _return(self, q: RQueue, m: RMsg, delay: int, prio: int | None) -> None:
        m.inflight = False
        m.lease_exp = 0
        m.lease_id = 0
        if q.settings.max_attempts and m.attempts >= q.settings.max_attempts:
            q.msgs.remove(m)
            q.dead += 1
            dlq = self.queues.get(q.settings.dead_letter_queue) if q.settings.dead_letter_queue else None
            if dlq is not None:
                dlq.msgs.append(RMsg(self.next_id, m.group, m.prio, 0,
                                     self.now, m.content, m.metadata))
                self.next_id += 1
            return
        if prio is not None:
            m.prio = prio
        if delay:
            m.not_before = self.now + delay

    def ready(self, q: RQueue) -> list[RMsg]:
        return [m for m in q.msgs if not m.inflight and m.deliver_at <= self.now]

    def counts(self, q: RQueue) -> tuple[int, int, int, int]:
        ready = len(self.ready(q))
        infl = sum(1 for m in q.msgs if m.inflight)
        return ready, len(q.msgs) - ready - infl, infl, q.dead

    # -- commands ----------------------------------------------------------------------
    def apply(self, now: int, cmd: c.Command) -> object:
        self.advance(now)
        try:
            return getattr(self, "_" + type(cmd).__name__)(cmd)
        except DoqError as e:
            return e

    def _q(self, name: str) -> RQueue:
        if name not in self.queues:
            raise QueueNotFound(name)
        return self.queues[name]

    def _CreateQueue(self, cmd: c.CreateQueue) -> tuple[str, str, QueueSettings]:
        old = self.queues.get(cmd.name)
        if old is not None:
            if old.type == cmd.type and old.settings == cmd.settings:
                return (cmd.name, cmd.type, cmd.settings)
            raise AlreadyExists(cmd.name)
        self.queues[cmd.name] = RQueue(cmd.name, cmd.type, cmd.settings)
        return (cmd.name, cmd.type, cmd.settings)

    def _UpdateQueue(self, cmd: c.UpdateQueue) -> tuple[str, str, QueueSettings]:
        q = self._q(cmd.name)
        before = {g: self.settle(q, g) for g in q.buckets}
        q.settings = cmd.settings
        for g, level in before.items():
            if level is None:
                del q.buckets[g]
            else:
                self._rebase(q, g, level)
        return (q.name, q.type, q.settings)

    # -- fair-queue groups: weights and token buckets ---------------------------------
    def weight(self, q: RQueue, g: str) -> int:
        o = q.overrides.get(g)
        return o[0] if o is not None and o[0] else (q.settings.default_group_weight or 1)

    def rate(self, q: RQueue, g: str) -> int:
        o = q.overrides.get(g)
        return o[1] if o is not None and o[1] != -1 else q.settings.default_group_max_per_second

    def level(self, q: RQueue, g: str) -> int:
        """Milli-tokens in the group's bucket now: +rate per ms, at most one
        second's worth (at least 1000); no bucket = full."""
        r = self.rate(q, g)
        cap = max(1000, r * 1000)
        b = q.buckets.get(g)
        return cap if b is None else min(cap, b[0] + (self.now - b[1]) * r)

    def settle(self, q: RQueue, g: str) -> int | None:
        """The bucket's level now, None if it is full (a full bucket is full under any
        rate: a group that went quiet bursts at its new rate)."""
        if g not in q.buckets:
            return None
        level = self.level(q, g)
        return None if level >= max(1000, self.rate(q, g) * 1000) else level

    def throttled(self, q: RQueue, g: str) -> bool:
        return self.rate(q, g) > 0 and self.level(q, g) < 1000

    def wake_at(self, q: RQueue, g: str) -> int | None:
        if not self.throttled(q, g):
            return None
        t, at = q.buckets[g]
        r = self.rate(q, g)
        return at + -(-(1000 - t) // r)

    def _rebase(self, q: RQueue, g: str, level: int) -> None:
        r = self.rate(q, g)
        if r <= 0 or level >= max(1000, r * 1000):
            q.buckets.pop(g, None)
        else:
            q.buckets[g] = (level, self.now)

    def _SetGroupPolicy(self, cmd: c.SetGroupPolicy) -> tuple[str, int, int, bool]:
        q = self._q(cmd.queue)
        if q.type != "fair":
            raise FailedPrecondition(cmd.queue)
        if cmd.weight is not None and not 0 <= cmd.weight <= 10_000:
            raise InvalidArgument("weight")
        if cmd.max_per_second is not None and not -1 <= cmd.max_per_second <= 1_000_000:
            raise InvalidArgument("max_per_second")
        g = cmd.group
        level = self.settle(q, g)
        w, r = q.overrides.get(g, (0, -1))
        w = w if cmd.weight is None else cmd.weight
        r = r if cmd.max_per_second is None else cmd.max_per_second
        if (w, r) == (0, -1):
            q.overrides.pop(g, None)
        else:
            q.overrides[g] = (w, r)
        if level is None:
            q.buckets.pop(g, None)
        else:
            self._rebase(q, g, level)
        return (g, self.weight(q, g), self.rate(q, g), self.throttled(q, g))

    def _DeleteQueue(self, cmd: c.DeleteQueue) -> None:
        self._q(cmd.name)
        del self.queues[cmd.name]

    def _PurgeQueue(self, cmd: c.PurgeQueue) -> int:
        q = self._q(cmd.name)
        n = len(q.msgs)
        q.msgs = []
        return n

    def _Tick(self, cmd: c.Tick) -> None:
        return None

    def _Enqueue(self, cmd: c.Enqueue) -> list[tuple[int, bool]]:
        q = self._q(cmd.queue)
        out = []
        for it in cmd.items:
            if it.dedup_id and it.dedup_id in q.dedup:
                out.append((q.dedup[it.dedup_id][0], True))
                continue
            nb = self.now + it.delay_ms if it.delay_ms else 0
            q.msgs.append(RMsg(self.next_id, it.group, it.priority, nb, self.now, it.content,
                               dict(it.metadata), it.dedup_id))
            if it.dedup_id:
                q.dedup[it.dedup_id] = (self.next_id, self.now + q.settings.effective_dedup_window_ms)
            out.append((self.next_id, False))
            self.next_id += 1
        return out

    def _pick_preview(self, q: RQueue) -> RMsg | None:
        """What the next dequeue would deliver, without moving the cursor."""
        cursor, credit, buckets = q.cursor, q.credit, dict(q.buckets)
        try:
            return self._pick(q)
        finally:
            q.cursor, q.credit, q.buckets = cursor, credit, buckets

    def _pick(self, q: RQueue) -> RMsg | None:
        ready = self.ready(q)
        if not ready:
            return None
        if q.type == "delayed":
            return min(ready, key=lambda m: (m.prio, m.id))
        limit = q.settings.max_unacked_per_group
        groups = sorted({
            m.group for m in ready
            if (not limit or sum(1 for x in q.msgs if x.group == m.group and x.inflight) < limit)
            and not self.throttled(q, m.group)
        })
        if not groups:
            return None
        if q.credit > 0 and q.cursor in groups:  # the cursor's turn goes on
            g = q.cursor
            q.credit -= 1
        else:
            after = [g for g in groups if g > q.cursor]
            g = after[0] if after else groups[0]
            q.cursor = g
            q.credit = self.weight(q, g) - 1
        if self.rate(q, g) > 0:
            q.buckets[g] = (self.level(q, g) - 1000, self.now)
        return min((m for m in ready if m.group == g), key=lambda m: (m.prio, m.id))

    def _Dequeue(self, cmd: c.Dequeue) -> list[tuple[int, int, int, int]]:
        q = self._q(cmd.queue)
        vis = cmd.visibility_timeout_ms or q.settings.effective_visibility_timeout_ms
        out = []
        # lease ids: from a base splitmix64(seed + counter) in [1, 2**64 - 2 - n], consecutive;
        # or the counter itself without a seed
        base = (_mix(cmd.seed + self.next_lease) % (M64 - 2 - cmd.max_messages) + 1) if cmd.seed else self.next_lease
        lids = iter(range(base, base + cmd.max_messages))
        for _ in range(cmd.max_messages):
            m = self._pick(q)
            if m is None:
                break
            m.attempts += 1
            if cmd.ack:
                q.msgs.remove(m)
                out.append((m.id, m.attempts, 0, 0))
            else:
                m.inflight = True
                m.lease_exp = self.now + vis
                m.lease_id = next(lids)
                self.next_lease += 1
                out.append((m.id, m.attempts, m.lease_id, m.lease_exp))
        return out

    def _check(self, q: RQueue, id_: int, lease_id: int) -> RMsg:
        m = q.find(id_)
        if m is None:
            raise MessageNotFound(str(id_))
        if lease_id and (not m.inflight or m.lease_id != lease_id):
            raise StaleLease(str(id_))
        if not m.inflight:
            raise FailedPrecondition(str(id_))
        return m

    def _Ack(self, cmd: c.Ack) -> list[object]:
        q = self._q(cmd.queue)
        out: list[object] = []
        for i, id_ in enumerate(cmd.ids):
            try:
                m = self._check(q, id_, cmd.lease_ids[i] if cmd.lease_ids else 0)
            except DoqError as e:
                out.append(e)
                continue
            q.msgs.remove(m)
            out.append(None)
        return out

    def _Nack(self, cmd: c.Nack) -> None:
        q = self._q(cmd.queue)
        if cmd.release and (cmd.delay_ms or cmd.priority is not None):
            raise InvalidArgument("a release takes no delay_ms and no priority")
        m = self._check(q, cmd.id, cmd.lease_id)
        if cmd.release:  # undo the delivery: attempt taken back, never dead-lettered
            m.inflight, m.lease_exp, m.lease_id = False, 0, 0
            m.attempts = max(m.attempts - 1, 0)
            return
        self._return(q, m, cmd.delay_ms, cmd.priority)

    def _Touch(self, cmd: c.Touch) -> int:
        q = self._q(cmd.queue)
        m = self._check(q, cmd.id, cmd.lease_id)
        m.lease_exp = self.now + (cmd.visibility_timeout_ms or q.settings.effective_visibility_timeout_ms)
        return m.lease_exp

    def _UpdatePriority(self, cmd: c.UpdatePriority) -> tuple[int, int]:
        q = self._q(cmd.queue)
        m = q.find(cmd.id)
        if m is None:
            raise MessageNotFound(str(cmd.id))
        m.prio = cmd.priority
        return m.id, m.prio

    def _DeleteMessage(self, cmd: c.DeleteMessage) -> None:
        q = self._q(cmd.queue)
        if cmd.lease_id:
            m = self._check(q, cmd.id, cmd.lease_id)
        else:
            found = q.find(cmd.id)
            if found is None:
                raise MessageNotFound(str(cmd.id))
            if cmd.holder_only and found.inflight:  # another's delivery: only with its lease
                raise FailedPrecondition(str(cmd.id))
            m = found
        q.msgs.remove(m)

    def next_due(self) -> int | None:
        times = [m.lease_exp for q in self.queues.values() for m in q.msgs if m.inflight]
        times += [m.deliver_at for q in self.queues.values() for m in q.msgs
                  if not m.inflight and m.deliver_at > self.now]
        times += [w for q in self.queues.values() for g in q.buckets if (w := self.wake_at(q, g)) is not None]
        return min(times) if times else None
