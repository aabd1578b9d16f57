"""Redrive (doq.queues.redrive) in the state machine: against a reference model (hypothesis,
with every other command interleaved), pacing by the replicated clock, determinism and
bad input."""

from __future__ import annotations

import struct
from fractions import Fraction
from math import ceil, floor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from doq.errors import DoqError, FailedPrecondition, InvalidArgument, NotFound, QueueNotFound
from doq.queues import codec
from doq.queues import commands as c
from doq.queues import redrive as RD
from doq.queues.machine import QueueMachine
from doq.queues.model import EnqueueResult, QueueSettings
from doq.queues.store import MemoryStore
from tests.queues.reference import Reference, RMsg
from tests.queues.test_machine_stateful import T0, MachineVsReference, item_st, norm


# -- the reference: plain lists and fractions ---------------------------------------------
class RedriveReference(Reference):
    """The reference model plus redrive, written from the rules of doq.queues.redrive:
    after every batch each running task (by DLQ name) takes its credit (messages, a
    Fraction: +rate per second of replicated time, at most rate + 1) and moves that many
    whole messages (at most STEP_MESSAGES; all it can without a rate) of the DLQ's
    messages older than its start and not in flight, lowest id first."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[str, dict[str, object]] = {}

    def _StartRedrive(self, cmd: RD.StartRedrive) -> tuple[str, str, int]:
        dlq = self._q(cmd.queue)
        if not 0 <= cmd.max_per_second <= RD.MAX_RATE:
            raise InvalidArgument("rate")
        to = cmd.to
        if not to:
            sources = [q.name for q in self.queues.values() if q.settings.dead_letter_queue == cmd.queue]
            if len(sources) != 1:
                raise FailedPrecondition("ambiguous")
            to = sources[0]
        if to == cmd.queue:
            raise InvalidArgument("itself")
        self._q(to)
        old = self.tasks.get(cmd.queue)
        if old is not None and old["state"] == "running":
            raise FailedPrecondition("running")
        total = sum(1 for m in dlq.msgs if not m.inflight)
        self.tasks[cmd.queue] = {"to": to, "rate": cmd.max_per_second, "state": "running", "moved": 0,
                                 "total": total, "upto": self.next_id, "credit": Fraction(1), "at": self.now}
        return (cmd.queue, to, 0)

    def _CancelRedrive(self, cmd: RD.CancelRedrive) -> tuple[str, str, int]:
        self._q(cmd.queue)
        t = self.tasks.get(cmd.queue)
        if t is None:
            raise NotFound("none")
        if t["state"] == "running":
            t["state"] = "cancelled"
        return (cmd.queue, str(t["to"]), int(t["moved"]))  # type: ignore[call-overload]

    def _DeleteQueue(self, cmd: c.DeleteQueue) -> None:
        super()._DeleteQueue(cmd)
        self.tasks.pop(cmd.name, None)

    def _credit(self, t: dict[str, object]) -> Fraction:
        rate = int(t["rate"])  # type: ignore[call-overload]
        gained = Fraction(self.now - int(t["at"]), 1000) * rate  # type: ignore[call-overload]
        return min(Fraction(rate + 1), t["credit"] + gained)  # type: ignore[operator]

    def step(self) -> None:
        """End of a batch: every running task moves what it may."""
        for name in sorted(self.tasks):
            t = self.tasks[name]
            if t["state"] != "running":
                continue
            target = self.queues.get(str(t["to"]))
            if target is None:
                t["state"] = "failed"
                continue
            rate = int(t["rate"])  # type: ignore[call-overload]
            if rate:
                t["credit"] = self._credit(t)
                t["at"] = self.now
                n = min(floor(t["credit"]), RD.STEP_MESSAGES)  # type: ignore[call-overload]
                if n == 0:
                    continue
            else:
                n = RD.STEP_MESSAGES
            dlq = self.queues[name]
            cands = sorted((m for m in dlq.msgs if m.id < t["upto"] and not m.inflight),  # type: ignore[operator]
                           key=lambda m: m.id)
            for m in cands[:n]:
                dlq.msgs.remove(m)
                target.msgs.append(RMsg(self.next_id, m.group, m.prio, m.not_before, self.now, m.content,
                                        m.metadata, m.dedup))
                self.next_id += 1
            moved = min(n, len(cands))
            t["moved"] = int(t["moved"]) + moved  # type: ignore[call-overload]
            if rate:
                t["credit"] = t["credit"] - moved  # type: ignore[operator]
            if len(cands) <= n:
                t["state"] = "completed"

    def next_due(self) -> int | None:
        due = super().next_due()
        for t in self.tasks.values():
            if t["state"] != "running":
                continue
            rate = int(t["rate"])  # type: ignore[call-overload]
            want = max(Fraction(1), Fraction(rate * RD.STEP_MS, 1000))  # a step's worth, at least one
            short = want - self._credit(t) if rate else Fraction(0)
            at = self.now + (ceil(short * 1000 / rate) if short > 0 else 0)
            due = at if due is None else min(due, at)
        return due


def task_view(result: object) -> object:
    if isinstance(result, RD.RedriveTask):
        return (result.queue, result.to, result.moved)
    return norm(result)


class RedriveVsReference(MachineVsReference):
    """MachineVsReference (every queue command) with redrives started and cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.ref = RedriveReference()

    def run(self, cmd: c.Command, dt: int = 1) -> tuple[object, object]:
        got, want = super().run(cmd, dt)
        assert isinstance(self.ref, RedriveReference)
        self.ref.step()
        return got, want

    @rule()
    def enqueue_run(self) -> None:  # type: ignore[override]
        """(Replaced: it applies without the reference's step; `enqueue` covers columns' rules.)"""

    @rule(name=st.sampled_from(["a", "b", "dlq"]), items=st.lists(item_st, min_size=2, max_size=8),
          deqs=st.lists(st.integers(1, 4), min_size=1, max_size=4))
    def burst(self, name: str, items: list[c.EnqueueItem], deqs: list[int]) -> None:
        """Several commands in ONE batch: the machine steps its redrives once, at its end."""
        cmds: list[c.Command] = [c.Enqueue(name, items)] + [c.Dequeue(name, n) for n in deqs]
        self.now += 1
        self.index += 1
        got = self.m.apply(self.index, c.CommandBatch(self.now, cmds))
        want = [self.ref.apply(self.now, cmd) for cmd in cmds]
        assert isinstance(self.ref, RedriveReference)
        self.ref.step()
        if isinstance(want[0], DoqError):
            assert [type(g) for g in got] == [type(w) for w in want]
            return
        assert norm(got[0]) == want[0]
        for g, w in zip(got[1:], want[1:], strict=True):
            assert isinstance(g, list)
            assert [(v.id, v.attempts, v.lease_id, v.lease_expires_at_ms) for v in g] == w
            self.known.extend((name, v.id, v.lease_id) for v in g)

    @rule(name=st.sampled_from(["dlq", "dlq", "dlq", "a", "b", "nope"]),
          to=st.sampled_from(["", "", "a", "b", "dlq", "nope"]),
          rate=st.sampled_from([0, 0, 1, 3, 40, 5000, -1]))
    def start_redrive(self, name: str, to: str, rate: int) -> None:
        got, want = self.run(RD.StartRedrive(name, to, rate))
        if isinstance(want, DoqError):
            assert isinstance(got, type(want)), (got, want)
        else:
            assert task_view(got) == want

    @rule(name=st.sampled_from(["dlq", "a", "nope"]))
    def cancel_redrive(self, name: str) -> None:
        got, want = self.run(RD.CancelRedrive(name))
        if isinstance(want, DoqError):
            assert isinstance(got, type(want)), (got, want)
        else:
            assert task_view(got) == want

    @invariant()
    def same_tasks(self) -> None:
        assert isinstance(self.ref, RedriveReference)
        got = {n: (t.state, t.to, t.moved, t.total, t.upto_id, t.max_per_second)
               for n, t in self.m.redrive.tasks.items()}
        want = {n: (t["state"], t["to"], t["moved"], t["total"], t["upto"], t["rate"])
                for n, t in self.ref.tasks.items()}
        assert got == want
        assert self.m.redrive.running == tuple(sorted(n for n, t in got.items() if t[0] == "running"))


TestRedriveVsReference = RedriveVsReference.TestCase
TestRedriveVsReference.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- direct rules ------------------------------------------------------------------------
class Harness:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.m = QueueMachine(self.store)
        self.now = T0
        self.index = 0

    def run(self, *cmds: c.Command, dt: int = 1) -> list[object]:
        self.now += dt
        self.index += 1
        batch = c.CommandBatch(self.now, list(cmds))
        try:
            assert codec.decode_batch(codec.encode_batch(batch)) == batch  # as the log carries it
        except struct.error:  # a negative rate: the service refuses it before any encoding
            pass
        return self.m.apply(self.index, batch)

    def setup(self, n: int, *, dlq_of: tuple[str, ...] = ("src",)) -> None:
        self.run(c.CreateQueue("dlq", "fair", QueueSettings()))
        for s in dlq_of:
            self.run(c.CreateQueue(s, "delayed", QueueSettings(max_attempts=1, dead_letter_queue="dlq")))
        self.run(c.CreateQueue("other", "delayed", QueueSettings()))
        items = [c.EnqueueItem(b"m%d" % i, group=f"g{i % 3}", priority=i % 4, metadata={"k": str(i)},
                               dedup_id=f"d{i}") for i in range(n)]
        if n:
            self.run(c.Enqueue("dlq", items))


def test_moved_messages_keep_content_group_metadata_dedup_and_reset_attempts() -> None:
    h = Harness()
    h.setup(0)
    h.run(c.Enqueue("src", [c.EnqueueItem(b"body", group="g", priority=3, metadata={"a": "1"}, dedup_id="x")]))
    v = h.run(c.Dequeue("src", 1, visibility_timeout_ms=10))[0]
    assert isinstance(v, list) and v[0].attempts == 1
    h.run(c.Tick(), dt=20)  # the lease expires: max_attempts 1, dead-lettered
    assert h.m.queue_info("dlq").stats.ready == 1 and h.m.queue_info("src").stats.total == 0
    # a message dead-lettered is a new message without its dedup id (machine rules); one
    # enqueued into the DLQ keeps its own: both travel as they are
    h.run(c.Enqueue("dlq", [c.EnqueueItem(b"two", group="h", metadata={"b": "2"}, dedup_id="y")]))
    h.run(c.Dequeue("dlq", 1, visibility_timeout_ms=5))  # delivered once from the DLQ too
    h.run(c.Tick(), dt=10)
    [task] = h.run(RD.StartRedrive("dlq"))
    assert isinstance(task, RD.RedriveTask) and task.to == "src" and task.total == 2
    t = h.m.redrive.tasks["dlq"]
    assert (t.state, t.moved) == ("completed", 2)
    views = [h.m.get_message("src", i) for i in list(h.m.queues["src"].members)]
    assert [(m.content, m.group, m.metadata, m.dedup_id, m.attempts, m.priority) for m in views] == [
        (b"body", "g", {"a": "1"}, "", 0, 3), (b"two", "h", {"b": "2"}, "y", 0, 0)]
    assert all(m.enqueued_at_ms == t.updated_at_ms for m in views)
    assert h.m.queue_info("dlq").stats.total == 0


def test_messages_in_flight_or_newer_than_the_start_stay() -> None:
    h = Harness()
    h.setup(5)
    [held] = h.run(c.Dequeue("dlq", 1, visibility_timeout_ms=60_000))  # one in flight in the DLQ
    assert isinstance(held, list)
    h.run(RD.StartRedrive("dlq", "other", 1))  # 1/s: one now
    [[late]] = h.run(c.Enqueue("dlq", [c.EnqueueItem(b"late")]))  # after the start: not moved
    for _ in range(10):
        h.run(c.Tick(), dt=1000)
    t = h.m.redrive.tasks["dlq"]
    assert (t.state, t.moved, t.total) == ("completed", 4, 4)
    left = list(h.m.queues["dlq"].members)
    assert isinstance(late, EnqueueResult)
    assert left == sorted([held[0].id, late.id])  # the held one and "late"
    assert h.m.queue_info("other").stats.ready == 4


@pytest.mark.parametrize("cmd,err,reason", [
    (RD.StartRedrive("nope"), QueueNotFound, "QUEUE_NOT_FOUND"),
    (RD.StartRedrive("dlq", "dlq"), InvalidArgument, "REDRIVE_TO_ITSELF"),
    (RD.StartRedrive("dlq", "missing"), QueueNotFound, "QUEUE_NOT_FOUND"),
    (RD.StartRedrive("dlq", "other", -1), InvalidArgument, "INVALID_ARGUMENT"),
    (RD.StartRedrive("dlq", "other", RD.MAX_RATE + 1), InvalidArgument, "INVALID_ARGUMENT"),
    (RD.StartRedrive("dlq", "bad name!"), InvalidArgument, "INVALID_QUEUE_NAME"),
    (RD.StartRedrive("other"), FailedPrecondition, "REDRIVE_TARGET_REQUIRED"),  # no queue dead-letters into it
    (RD.StartRedrive("dlq", "src", 1), FailedPrecondition, "REDRIVE_RUNNING"),
    (RD.CancelRedrive("nope"), QueueNotFound, "QUEUE_NOT_FOUND"),
    (RD.CancelRedrive("other"), NotFound, "REDRIVE_NOT_FOUND"),
])
def test_bad_input_changes_nothing(cmd: c.Command, err: type, reason: str) -> None:
    h = Harness()
    h.setup(50)
    h.run(RD.StartRedrive("dlq", "src", 1))  # running: 1/s
    before = dict(h.store.data)
    tasks = h.m.redrive.tasks
    [got] = h.run(cmd, dt=0)  # (no time passes: the running task moves nothing either)
    assert isinstance(got, err) and got.reason == reason, got
    assert h.store.data == before and h.m.redrive.tasks is tasks


def test_two_sources_need_a_target() -> None:
    h = Harness()
    h.setup(3, dlq_of=("s1", "s2"))
    [got] = h.run(RD.StartRedrive("dlq"))
    assert isinstance(got, FailedPrecondition) and got.reason == "REDRIVE_TARGET_REQUIRED"
    assert "s1, s2" in got.message
    [task] = h.run(RD.StartRedrive("dlq", "s2"))
    assert isinstance(task, RD.RedriveTask) and h.m.redrive.tasks["dlq"].state == "completed"


def test_cancel_stops_and_a_new_task_moves_the_rest() -> None:
    h = Harness()
    h.setup(20)
    h.run(RD.StartRedrive("dlq", max_per_second=2))
    h.run(c.Tick(), dt=1000)
    [t] = h.run(RD.CancelRedrive("dlq"))
    assert isinstance(t, RD.RedriveTask) and (t.state, t.moved) == ("cancelled", 3)
    h.run(c.Tick(), dt=5000)
    assert h.m.redrive.tasks["dlq"].moved == 3 and h.m.queue_info("dlq").stats.ready == 17
    assert h.m.redrive.running == () and h.m.next_due_ms() is None  # nothing left to tick for
    [again] = h.run(RD.CancelRedrive("dlq"))  # cancelling an ended task: unchanged
    assert again == h.m.redrive.tasks["dlq"]
    [t2] = h.run(RD.StartRedrive("dlq"))  # resumed: no limit, moves the other 17 at once
    assert isinstance(t2, RD.RedriveTask) and t2.total == 17
    assert (h.m.redrive.tasks["dlq"].state, h.m.redrive.tasks["dlq"].moved) == ("completed", 17)
    assert h.m.queue_info("src").stats.ready == 20


def test_target_deleted_fails_the_task_and_deleting_the_dlq_forgets_it() -> None:
    h = Harness()
    h.setup(10)
    h.run(RD.StartRedrive("dlq", "other", 1))
    h.run(c.DeleteQueue("other"))
    t = h.m.redrive.tasks["dlq"]
    assert t.state == "failed" and "other" in t.reason and t.moved == 1
    h.run(c.DeleteQueue("dlq"))
    assert "dlq" not in h.m.redrive.tasks and not any(k[:1] == b"R" for k in h.store.data)


def test_no_limit_moves_in_bounded_steps() -> None:
    h = Harness()
    n = RD.STEP_MESSAGES * 2 + 5
    h.setup(n)
    h.run(RD.StartRedrive("dlq"))
    assert h.m.redrive.tasks["dlq"].moved == RD.STEP_MESSAGES
    assert h.m.next_due_ms() == h.now  # the leader ticks again at once
    h.run(c.Tick(), dt=0)
    h.run(c.Tick(), dt=0)
    t = h.m.redrive.tasks["dlq"]
    assert (t.state, t.moved) == ("completed", n) and h.m.next_due_ms() is None


@settings(max_examples=80, deadline=None)
@given(rate=st.integers(1, RD.STEP_MESSAGES - 1), n=st.integers(0, 400),
       dts=st.lists(st.integers(0, 1000), min_size=1, max_size=40))
def test_pacing_follows_the_replicated_clock(rate: int, n: int, dts: list[int]) -> None:
    """Stepped at least once a second of replicated time, the task has moved exactly
    min(n, 1 + rate * elapsed_ms // 1000) after every batch; `next_due_ms` is when the
    next message may move."""
    h = Harness()
    h.setup(n)
    h.run(RD.StartRedrive("dlq", max_per_second=rate), dt=0)
    start = h.now
    for dt in dts:
        due = h.m.next_due_ms()
        t = h.m.redrive.tasks["dlq"]
        if due is not None and t.state == "running":
            # the due time is the first at which the bucket holds a step's worth (STEP_MS of
            # the rate, at least one message) beyond what moved
            step = min(max(1000, rate * RD.STEP_MS), (rate + 1) * 1000)
            assert 1000 + rate * (due - start) - 1000 * t.moved >= step > 1000 + rate * (due - 1 - start) - 1000 * t.moved
        h.run(c.Tick(), dt=dt)
        t = h.m.redrive.tasks["dlq"]
        want = min(n, 1 + rate * (h.now - start) // 1000)
        assert t.moved == want
        assert h.m.queue_info("src").stats.ready == want
        assert (t.state == "completed") == (want == n)


def test_replicas_agree_and_a_rebuilt_replica_continues() -> None:
    """Two replicas given the same batches hold the same records; one rebuilt from its
    records mid-redrive goes on exactly as the other."""
    a, b = Harness(), Harness()
    for h in (a, b):
        h.setup(30)
        h.run(RD.StartRedrive("dlq", max_per_second=7))
    for i in range(12):
        for h in (a, b):
            h.run(c.Tick(), dt=150 + 37 * i)
        if i == 4:
            fresh = QueueMachine(b.store)
            fresh.load(b.store.items())
            assert fresh.redrive.tasks == b.m.redrive.tasks
            b.m = fresh
        assert a.store.data == b.store.data
    assert a.m.redrive.tasks["dlq"].state == "completed"


def test_record_round_trip() -> None:
    t = RD.RedriveTask("dlq", "é-src", 5, "failed", 3, 9, 77, 1, 2, 1500, 4, "the target queue 'x' was deleted")
    assert RD.decode_task("dlq", RD.encode_task(t)) == t
    with pytest.raises(ValueError):
        RD.decode_task("dlq", RD.encode_task(t)[:-1])


def test_an_idle_gap_allows_one_second_and_one_message_at_most() -> None:
    """The bucket is full at rate + 1 messages: a step after a long gap of replicated time
    (no batch applied) moves no more."""
    h = Harness()
    h.setup(100)
    h.run(RD.StartRedrive("dlq", max_per_second=2), dt=0)
    assert h.m.redrive.tasks["dlq"].moved == 1
    h.run(c.Tick(), dt=10_000)
    assert h.m.redrive.tasks["dlq"].moved == 1 + 3


def test_codec_tags_60_and_61() -> None:
    """The redrive commands have tags of their own (60-69 are redrive's); a batch decodes
    back to the same commands."""
    for cmd, tag in ((RD.StartRedrive("dlq", "src", 7), 60), (RD.CancelRedrive("dlq"), 61)):
        raw = codec.encode_batch(c.CommandBatch(5, [cmd]))
        assert raw[13] == tag  # after the header: version (1), now_ms (8), count (4)
        assert codec.decode_batch(raw) == c.CommandBatch(5, [cmd])
    with pytest.raises(ValueError):
        codec.decode_batch(codec.encode_batch(c.CommandBatch(5, [RD.CancelRedrive("dlq")]))[:-1])
