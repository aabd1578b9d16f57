"""Stateful property test: QueueMachine (fake in-memory store) against the reference model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from doq.errors import DoqError
from doq.queues import commands as c
from doq.queues.machine import QueueMachine
from doq.queues.model import (
    EnqueueColumnsResult,
    EnqueueResult,
    GroupStats,
    MessageState,
    MessageView,
    QueueInfo,
    QueueSettings,
)
from doq.queues.store import MemoryStore
from tests.queues.reference import Reference

T0 = 1_000_000_000_000  # ms; priorities >= 1e9 below are timestamps around T0
QUEUES = ["a", "b", "dlq"]
MSG_QUEUES = st.sampled_from(["a", "a", "a", "a", "dlq", "b"])
GROUPS = ["", "g1", "g2"]
PRIOS = st.sampled_from([0, 1, 5, -3, 7, 1_000_000_001, 1_000_000_003])

settings_st = st.builds(
    QueueSettings,
    visibility_timeout_ms=st.sampled_from([0, 100, 1000]),
    max_attempts=st.sampled_from([0, 1, 2, 3]),
    dead_letter_queue=st.sampled_from(["", "dlq", "nope"]),
    max_unacked_per_group=st.sampled_from([0, 1, 2]),
    dedup_window_ms=st.sampled_from([0, 500]),
    default_group_weight=st.sampled_from([0, 0, 1, 3]),
    default_group_max_per_second=st.sampled_from([0, 0, 5, 20, 1000]),
)
# canonical dedup ids (a producer's stamped ids, remembered as runs) of two producers
PRODUCERS = ["00000000000000a1-", "00000000000000b2-"]
CANON = [f"{PRODUCERS[0]}{s:012x}" for s in range(1, 5)] + [f"{PRODUCERS[1]}{1:012x}"]
item_st = st.builds(
    c.EnqueueItem,
    content=st.binary(max_size=8),
    group=st.sampled_from(GROUPS),
    priority=PRIOS,
    metadata=st.sampled_from([{}, {"k": "v"}, {"b": "2", "a": "1"}]),
    dedup_id=st.sampled_from(["", "", "d1", "d2", *CANON]),
    delay_ms=st.sampled_from([0, 0, 50, 700]),
)


def norm(result: object) -> object:
    """Machine result -> the reference's shape."""
    if isinstance(result, DoqError):
        return type(result)
    if isinstance(result, list):
        return [norm(r) for r in result]
    if isinstance(result, EnqueueResult):
        return (result.id, result.duplicate)
    if isinstance(result, MessageView):
        return result
    if isinstance(result, GroupStats):
        return (result.group, result.weight, result.max_per_second, result.throttled)
    if isinstance(result, QueueInfo):  # CreateQueue / UpdateQueue: the queue as it is now
        return (result.name, result.type.value, result.settings)
    return result


class MachineVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.m = QueueMachine(self.store)
        self.ref = Reference()
        self.now = T0
        self.index = 0
        self.known: list[tuple[str, int, int]] = []  # (queue, id, last lease id)
        self.copy: dict[str, object] = {}  # a reader's copy, refreshed by take_changed()

    def run(self, cmd: c.Command, dt: int = 1) -> tuple[object, object]:
        self.now += dt
        self.index += 1
        got = self.m.apply(self.index, c.CommandBatch(self.now, [cmd]))
        assert len(got) == 1
        want = self.ref.apply(self.now, cmd)
        return got[0], want

    def pick(self, data: st.DataObject) -> tuple[str, int, int]:
        use_known = data.draw(st.booleans())
        if self.known and use_known:
            return data.draw(st.sampled_from(self.known[-12:]))
        return data.draw(MSG_QUEUES), data.draw(st.integers(1, 40)), 0

    # -- rules -------------------------------------------------------------------------
    @initialize(typ=st.sampled_from(["delayed", "fair"]), s=settings_st,
                dlq_typ=st.sampled_from(["delayed", "fair"]))
    def setup(self, typ: str, s: QueueSettings, dlq_typ: str) -> None:
        self.create("a", typ, s)
        self.create("dlq", dlq_typ, QueueSettings())

    @rule(name=st.sampled_from(QUEUES), typ=st.sampled_from(["delayed", "fair"]), s=settings_st)
    def create(self, name: str, typ: str, s: QueueSettings) -> None:
        got, want = self.run(c.CreateQueue(name, typ, s))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(name=MSG_QUEUES, s=settings_st)
    def update(self, name: str, s: QueueSettings) -> None:
        got, want = self.run(c.UpdateQueue(name, s))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(name=st.sampled_from(QUEUES), purge=st.booleans(), rarely=st.integers(0, 5))
    def delete_or_purge(self, name: str, purge: bool, rarely: int) -> None:
        if rarely:  # destructive commands are rare, so queues fill up
            return self.tick(1)
        cmd: c.Command = c.PurgeQueue(name) if purge else c.DeleteQueue(name)
        got, want = self.run(cmd)
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(name=MSG_QUEUES, items=st.lists(item_st, min_size=1, max_size=6))
    def enqueue(self, name: str, items: list[c.EnqueueItem]) -> None:
        got, want = self.run(c.Enqueue(name, items))
        if isinstance(want, DoqError):
            assert isinstance(got, type(want))
            return
        assert norm(got) == want
        for id_, dup in want:  # type: ignore[attr-defined]
            if not dup:
                self.known.append((name, id_, 0))

    @rule(name=MSG_QUEUES, producer=st.sampled_from(PRODUCERS), first=st.integers(0, 7),
          n=st.integers(1, 5), dt=st.sampled_from([0, 0, 1, 200]))
    def enqueue_run(self, name: str, producer: str, first: int, n: int, dt: int) -> None:
        """A producer's frame: consecutive canonical ids in columns (fresh, a resend, or a
        partial overlap), against the reference's one-id-at-a-time dedup."""
        dids = [f"{producer}{s:012x}" for s in range(first, first + n)]
        cmd = c.EnqueueColumns(name, [b"r%d" % i for i in range(n)], dedup_ids=dids)
        self.now += dt
        self.index += 1
        got = self.m.apply(self.index, c.CommandBatch(self.now, [cmd]))[0]
        want = self.ref.apply(self.now, c.Enqueue(name, cmd.to_items()))
        if isinstance(want, DoqError):
            assert isinstance(got, type(want))
            return
        assert isinstance(got, EnqueueColumnsResult) and isinstance(want, list)
        dups = [i for i, (_, dup) in enumerate(want) if dup]
        assert (list(got.ids), got.duplicates) == ([id_ for id_, _ in want], dups)
        self.known += [(name, id_, 0) for id_, dup in want if not dup]

    @rule(name=MSG_QUEUES, n=st.integers(1, 3), ack=st.sampled_from([False, False, False, True]),
          vis=st.sampled_from([0, 50, 300]), dt=st.sampled_from([0, 1, 30]),
          seed=st.sampled_from([0, 1, 2**64 - 1]) | st.integers(0, 2**64 - 1))
    def dequeue(self, name: str, n: int, ack: bool, vis: int, dt: int, seed: int) -> None:
        got, want = self.run(c.Dequeue(name, n, ack, vis, seed), dt)
        if isinstance(want, DoqError):
            assert isinstance(got, type(want))
            return
        assert isinstance(got, list)
        assert [(v.id, v.attempts, v.lease_id, v.lease_expires_at_ms) for v in got] == want
        for v in got:
            assert v.state is MessageState.IN_FLIGHT and v.queue_name == name
            ref_msg_content = v.content  # content came from the store record
            assert isinstance(ref_msg_content, bytes)
            if not ack:
                self.known.append((name, v.id, v.lease_id))

    @rule(name=MSG_QUEUES, items=st.lists(item_st, min_size=2, max_size=8),
          deqs=st.lists(st.integers(1, 4), min_size=1, max_size=4))
    def burst(self, name: str, items: list[c.EnqueueItem], deqs: list[int]) -> None:
        """Several commands in ONE batch (one replicated time): enqueue, then dequeues."""
        cmds: list[c.Command] = [c.Enqueue(name, items)]
        cmds += [c.Dequeue(name, n) for n in deqs]
        self.now += 1
        self.index += 1
        got = self.m.apply(self.index, c.CommandBatch(self.now, cmds))
        want = [self.ref.apply(self.now, cmd) for cmd in cmds]
        if isinstance(want[0], DoqError):
            assert [type(g) for g in got] == [type(w) for w in want]
            return
        assert norm(got[0]) == want[0]
        for g, w in zip(got[1:], want[1:], strict=True):
            assert isinstance(g, list)
            assert [(v.id, v.attempts, v.lease_id, v.lease_expires_at_ms) for v in g] == w
            self.known.extend((name, v.id, v.lease_id) for v in g)

    @rule(data=st.data(), lease=st.sampled_from(["known", "zero", "wrong"]))
    def ack(self, data: st.DataObject, lease: str) -> None:
        q, id_, lid = self.pick(data)
        lid = {"known": lid, "zero": 0, "wrong": 999_999}[lease]
        got, want = self.run(c.Ack(q, [id_, id_], [lid, lid]))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else norm(want))

    @rule(data=st.data(), zero=st.booleans(), delay=st.sampled_from([0, 40, 600]),
          prio=st.none() | PRIOS, release=st.booleans())
    def nack(self, data: st.DataObject, zero: bool, delay: int, prio: int | None, release: bool) -> None:
        q, id_, lid = self.pick(data)
        got, want = self.run(c.Nack(q, id_, 0 if zero else lid, delay, prio, release))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(data=st.data(), vis=st.sampled_from([0, 20, 2000]))
    def touch(self, data: st.DataObject, vis: int) -> None:
        q, id_, lid = self.pick(data)
        got, want = self.run(c.Touch(q, id_, lid, vis))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(data=st.data(), prio=PRIOS)
    def update_priority(self, data: st.DataObject, prio: int) -> None:
        q, id_, _ = self.pick(data)
        got, want = self.run(c.UpdatePriority(q, id_, prio))
        if isinstance(want, DoqError):
            assert isinstance(got, type(want))
        else:
            assert isinstance(got, MessageView) and (got.id, got.priority) == want

    @rule(data=st.data(), holder_only=st.booleans(), with_lease=st.booleans())
    def delete_message(self, data: st.DataObject, holder_only: bool, with_lease: bool) -> None:
        q, id_, lease = self.pick(data)
        got, want = self.run(c.DeleteMessage(q, id_, lease if with_lease else 0, holder_only))
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(name=MSG_QUEUES, group=st.sampled_from(GROUPS),
          weight=st.sampled_from([None, 0, 1, 2, 5, -1, 10_001]),
          rate=st.sampled_from([None, -1, 0, 3, 10, 100, -2, 1_000_001]),
          dt=st.sampled_from([0, 1, 50]))
    def set_group_policy(self, name: str, group: str, weight: int | None, rate: int | None, dt: int) -> None:
        got, want = self.run(c.SetGroupPolicy(name, group, weight, rate), dt)
        assert norm(got) == (type(want) if isinstance(want, DoqError) else want)

    @rule(dt=st.sampled_from([0, 10, 60, 120, 400, 1100, 3000]))
    def tick(self, dt: int) -> None:
        got, want = self.run(c.Tick(), dt)
        assert got is None and want is None

    @rule()
    def rebuild(self) -> None:
        """A replica rebuilt from the records alone must behave identically from now on."""
        fresh = QueueMachine(self.store)
        fresh.load(self.store.items())
        self.m = fresh
        self.copy = {}  # a reader refreshes everything after a rebuild

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def take_changed_names_every_changed_queue(self) -> None:
        """Refreshing only the queues `take_changed()` names keeps a copy of every
        `QueueInfo` (and deliverable count) exact: what the store's reader view relies on."""
        for name in self.m.take_changed():
            if name in self.m.queues:
                self.copy[name] = (self.m.queue_info(name), self.m.deliverable(name))
            else:
                self.copy.pop(name, None)
        assert self.copy == {i.name: (i, self.m.deliverable(i.name)) for i in self.m.queue_infos()}

    @invariant()
    def same_state(self) -> None:
        ref = self.ref
        infos = self.m.queue_infos()
        assert [i.name for i in infos] == sorted(ref.queues)
        for info in infos:
            rq = ref.queues[info.name]
            s = info.stats
            assert (s.ready, s.delayed, s.in_flight, s.dead) == ref.counts(rq), info.name
            assert s.total == len(rq.msgs)
            assert self.m.has_deliverable(info.name) == (ref._pick_preview(rq) is not None)
            for rm in rq.msgs:
                v = self.m.get_message(info.name, rm.id)
                assert (v.group, v.priority, v.attempts, v.lease_id, v.lease_expires_at_ms,
                        v.deliver_at_ms, v.content, v.metadata, v.dedup_id) == (
                    rm.group, rm.prio, rm.attempts, rm.lease_id, rm.lease_exp, rm.deliver_at,
                    rm.content, rm.metadata, rm.dedup)
                want_state = (MessageState.IN_FLIGHT if rm.inflight else
                              MessageState.DELAYED if rm.deliver_at > ref.now else MessageState.READY)
                assert v.state is want_state
        assert self.m.next_due_ms() == ref.next_due()
        for info in infos:  # every group's policy in effect, throttling included
            rq = ref.queues[info.name]
            if rq.type != "fair":
                continue
            live = {m.group for m in rq.msgs if m.inflight or m.deliver_at <= ref.now}
            got = {g.group: (g.weight, g.max_per_second, g.throttled) for g in self.m.group_stats(info.name)
                   if g.group in live}
            assert got == {g: (ref.weight(rq, g), ref.rate(rq, g), ref.throttled(rq, g)) for g in live}
        assert (self.m.next_id, self.m.next_lease) == (ref.next_id, ref.next_lease)
        # every remembered dedup id counted once, runs by their ids
        assert self.m.dedup_n == sum(len(rq.dedup) for rq in ref.queues.values())
        assert len(self.m.dedup_exp) == sum(
            len(q.dedup) + sum(len(runs) for runs in q.runs.values()) for q in self.m.queues.values())


TestMachineVsReference = MachineVsReference.TestCase
TestMachineVsReference.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.slow
@pytest.mark.timeout(900)
class TestMachineVsReferenceLong(MachineVsReference.TestCase):  # type: ignore[misc,valid-type]
    """The same comparison with a larger budget (the slow suite)."""

    settings = settings(
        max_examples=400, stateful_step_count=80, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
