"""Producers and consumers that run through faults and record a history for the checker.

Everything goes through the Python client (`doq_client`), as a user's code would:
- a `ProducerWorker` pipelines unique payloads on one EnqueueStream (`Producer`), each
  with its payload as dedup id, at a steady rate with at most `window` unacknowledged
  (a quarter of them delayed by up to 3 s, so a backlog is at risk when a node dies);
- a `ConsumerWorker` takes messages from one DequeueStream (`Consumer`) and acks each:
  a share `confirm_ratio` with a unary `Ack` naming the lease (confirmed: ok, failed or
  unknown), the others in the stream only (never confirmed: unknown outcome);
- `drain` dequeues every queue until it is empty, waiting out the leases of consumers
  that died.

On any error, or when a call makes no progress for `stall_s` (a paused node), a worker
drops its connection, records what it does not know as unknown (`info`), and reconnects
with backoff to the leader that `GET /cluster` names, or else to the next node in turn.
A producer sends again, with the same dedup id, every payload whose enqueue was not
acknowledged, so a retry after a failover is idempotent.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc

from doq_client import (
    AlreadyExists,
    Consumer,
    DoqClient,
    DoqClientError,
    EnqueueResult,
    FailedPrecondition,
    InvalidArgument,
    Message,
    NotFound,
    QueueSettings,
    StaleLease,
    TooLarge,
)
from doq_client.retry import NOT_APPLIED_REASONS
from tools.chaos.checker import ACK, DELIVER, ENQUEUE, FAIL, INFO, INVOKE, OK, Op

#: errors after which the request certainly did not take effect (besides NOT_APPLIED_REASONS)
_REFUSED = (InvalidArgument, NotFound, FailedPrecondition, StaleLease, TooLarge, AlreadyExists)
#: errors a retry of the same request cannot cure
_PERMANENT = (InvalidArgument, NotFound, TooLarge)
#: what ends a worker's connection (a call on a channel closed under it raises ValueError)
CONNECTION_ERRORS = (DoqClientError, grpc.RpcError, ValueError)


def outcome_of(err: DoqClientError) -> str:
    """`fail` if `err` proves the request was not applied, else `info` (unknown)."""
    return FAIL if isinstance(err, _REFUSED) or err.reason in NOT_APPLIED_REASONS else INFO


class History:
    """A thread-safe, append-only list of `Op`s stamped with the monotonic clock."""

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    def add(self, type: str, f: str, process: str, queue: str, **kw: Any) -> None:
        with self._lock:
            self._ops.append(Op(type, f, process, time.monotonic(), queue, **kw))

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: str
    grpc_addr: str
    http_addr: str


class Targets:
    """Where a worker connects: the leader if a node's `GET /cluster` names one, else the
    next node in turn (a lone node, or followers that forward)."""

    def __init__(self, endpoints: Sequence[Endpoint], http_timeout_s: float = 0.5) -> None:
        self.endpoints = list(endpoints)
        self.http_timeout_s = http_timeout_s
        self._turn = 0
        self._lock = threading.Lock()

    def pick(self) -> str:
        if len(self.endpoints) > 1:
            leader = self._leader()
            if leader:
                return leader
        with self._lock:
            self._turn += 1
            return self.endpoints[self._turn % len(self.endpoints)].grpc_addr

    def _leader(self) -> str:
        for ep in self.endpoints:
            try:
                with urllib.request.urlopen(f"http://{ep.http_addr}/cluster",
                                            timeout=self.http_timeout_s) as r:
                    doc = json.load(r)
            except (OSError, ValueError):
                continue
            leader_id = doc.get("leader_id") if isinstance(doc, dict) else None
            if not leader_id:
                continue
            for ep2 in self.endpoints:
                if ep2.node_id == leader_id:
                    return ep2.grpc_addr
        return ""


class Backoff:
    """Jittered exponential sleeps between reconnects, interrupted by `stop`."""

    def __init__(self, stop: threading.Event, first_s: float = 0.05, max_s: float = 1.0) -> None:
        self.stop, self.first_s, self.max_s = stop, first_s, max_s
        self.next_s = first_s

    def reset(self) -> None:
        self.next_s = self.first_s

    def sleep(self) -> None:
        self.stop.wait(random.uniform(self.next_s / 2, self.next_s))
        self.next_s = min(self.max_s, self.next_s * 2)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    type: str  # "delayed" | "fair"


@dataclass(frozen=True, slots=True)
class _Item:
    queue: QueueSpec
    payload: str
    priority: int
    delay_ms: int

    @property
    def group(self) -> str:
        return f"g{self.priority % 4}" if self.queue.type == "fair" else ""


@dataclass(slots=True)
class _Pending:
    item: _Item
    future: Future[EnqueueResult]
    sent_t: float


class _Worker(threading.Thread):
    """A daemon thread that reconnects until `stop` is set; `crash` holds an unexpected
    exception that ended it (a harness bug: the run must not pass)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.worker = name
        self.stop = threading.Event()
        self.sessions = 0
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.crash = e

    def _loop(self) -> None:
        raise NotImplementedError


class ProducerWorker(_Worker):
    """Enqueues `rate_per_s` unique payloads a second over the queues, round robin."""

    def __init__(self, name: str, queues: Sequence[QueueSpec], targets: Targets, history: History,
                 *, rate_per_s: float, window: int, stall_s: float, call_timeout_s: float) -> None:
        super().__init__(name)
        self.queues, self.targets, self.history = list(queues), targets, history
        self.rate_per_s, self.window, self.stall_s = rate_per_s, window, stall_s
        self.call_timeout_s = call_timeout_s
        self.retry: deque[_Item] = deque()
        self.pending: deque[_Pending] = deque()
        self.seq = 0

    def _loop(self) -> None:
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            client = DoqClient(self.targets.pick(), timeout_s=self.call_timeout_s)
            producer = client.producer(window=self.window)
            self.sessions += 1
            try:
                if self._session(producer):
                    backoff.reset()
            except CONNECTION_ERRORS:
                pass
            finally:
                if self.stop.is_set():
                    producer.flush(self.stall_s)
                client.close()  # cancels the stream: what is pending fails
                self._settle_all()
                _quietly(functools.partial(producer.close, 1.0))  # ends its request thread
            if not self.stop.is_set():
                backoff.sleep()

    def _session(self, producer: Any) -> bool:
        """Send until stopped, an error, or a stall; True if anything was acknowledged."""
        progress = False
        next_send = time.monotonic()
        while not self.stop.is_set():
            acked, refused = self._harvest()
            progress |= acked
            if refused:
                return progress  # e.g. NOT_LEADER: reconnect, to the leader if known
            now = time.monotonic()
            if self.pending and now - self.pending[0].sent_t > self.stall_s:
                return progress  # no answer: the node is paused or gone
            if len(self.pending) >= self.window or now < next_send:
                self.stop.wait(min(0.01, max(0.0, next_send - now)))
                continue
            item = self.retry.popleft() if self.retry else self._new_item()
            self._record(INVOKE, item)
            try:
                fut = producer.enqueue(item.queue.name, item.payload, group=item.group,
                                       priority=item.priority, dedup_id=item.payload,
                                       delay_ms=item.delay_ms)
            except DoqClientError:  # the stream had failed: this one was never sent
                self._record(FAIL, item)
                self.retry.appendleft(item)
                raise
            self.pending.append(_Pending(item, fut, now))
            next_send = max(next_send + 1 / self.rate_per_s, now - 1.0)
        return progress

    def _new_item(self) -> _Item:
        """Round robin over the queues; every 4th message delayed by 0.5-3 s, so that a
        backlog sits in the queues when a node dies."""
        self.seq += 1
        n = self.seq
        delay_ms = 500 + n * 37 % 2500 if n % 4 == 0 else 0
        return _Item(self.queues[n % len(self.queues)], f"{self.worker}-{n}", n % 7, delay_ms)

    def _harvest(self) -> tuple[bool, bool]:
        """Record the answers that arrived (in order): (any acknowledged, any refused)."""
        acked = refused = False
        while self.pending and self.pending[0].future.done():
            ok = self._settle(self.pending.popleft())
            acked |= ok
            refused |= not ok
        return acked, refused

    def _settle_all(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pending:
            p = self.pending.popleft()
            try:
                p.future.exception(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - timeout (or cancelled): unknown outcome
                self._record(INFO, p.item)
                self.retry.append(p.item)
                continue
            self._settle(p)

    def _settle(self, p: _Pending) -> bool:
        err = p.future.exception()
        if err is None:
            self._record(OK, p.item, id=p.future.result().id)
            return True
        if isinstance(err, DoqClientError):
            self._record(outcome_of(err), p.item)
            if not isinstance(err, _PERMANENT):
                self.retry.append(p.item)
        else:
            self._record(INFO, p.item)
            self.retry.append(p.item)
        return False

    def _record(self, type: str, item: _Item, **kw: Any) -> None:
        self.history.add(type, ENQUEUE, self.worker, item.queue.name, payload=item.payload, **kw)


class ConsumerWorker(_Worker):
    """Consumes one queue over a DequeueStream and acks every message it is given."""

    def __init__(self, name: str, queue: str, targets: Targets, history: History, *, prefetch: int,
                 visibility_timeout_ms: int, confirm_ratio: float, stall_s: float,
                 call_timeout_s: float, seed: int) -> None:
        super().__init__(name)
        self.queue, self.targets, self.history = queue, targets, history
        self.prefetch, self.visibility_timeout_ms = prefetch, visibility_timeout_ms
        self.confirm_ratio, self.stall_s, self.call_timeout_s = confirm_ratio, stall_s, call_timeout_s
        self.rng = random.Random(seed)
        self._client: DoqClient | None = None
        self._progress_t = time.monotonic()
        self._lock = threading.Lock()

    def _loop(self) -> None:
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            client = DoqClient(self.targets.pick(), timeout_s=self.call_timeout_s)
            consumer = client.consumer(self.queue, prefetch=self.prefetch,
                                       visibility_timeout_ms=self.visibility_timeout_ms)
            with self._lock:
                self._client = client
                self._progress_t = time.monotonic()
            self.sessions += 1
            try:
                if self._session(client, consumer):
                    backoff.reset()
            except CONNECTION_ERRORS:
                pass
            finally:
                with self._lock:
                    self._client = None
                client.close()
                _quietly(consumer.close)  # ends its request thread (the call is cancelled)
            if not self.stop.is_set():
                backoff.sleep()

    def interrupt_if_stalled(self, now: float) -> None:
        """Called by a monitor: drop the connection if stopping or idle for `stall_s`."""
        with self._lock:
            if self._client is not None and (self.stop.is_set() or now - self._progress_t > self.stall_s):
                self._client.close()  # the blocked read fails with CANCELLED

    def _session(self, client: DoqClient, consumer: Consumer) -> bool:
        got = False
        while not self.stop.is_set():
            msg = consumer.next()
            if msg is None:
                return got
            got = True
            with self._lock:
                self._progress_t = time.monotonic()
            self.history.add(OK, DELIVER, self.worker, self.queue, payload=msg.content.decode(),
                             id=msg.id, lease_id=msg.lease_id,
                             lease_expires_at_ms=msg.lease_expires_at_ms,
                             visibility_timeout_ms=self.visibility_timeout_ms)
            if self.rng.random() < self.confirm_ratio:
                err = ack_unary(client, self.history, self.worker, self.queue, msg.id, msg.lease_id)
                if err is not None and not isinstance(err, (StaleLease, NotFound)):
                    return got  # e.g. NOT_LEADER or no answer: reconnect
            else:
                self.history.add(INVOKE, ACK, self.worker, self.queue, id=msg.id, lease_id=msg.lease_id)
            # In the stream too: this returns the stream's credit. After a confirmed ack
            # the server refuses it (the message is gone), and nothing is recorded.
            try:
                consumer.ack(msg)
            except ValueError:  # the consumer was closed under us
                return got
        return got


def ack_unary(client: DoqClient, history: History, worker: str, queue: str, id_: int,
              lease_id: int) -> DoqClientError | None:
    """Ack one delivery by its lease with a unary call, recording the outcome; the error."""
    history.add(INVOKE, ACK, worker, queue, id=id_, lease_id=lease_id)
    try:
        client.ack(queue, id_, lease_id=lease_id)
    except DoqClientError as e:
        history.add(outcome_of(e), ACK, worker, queue, id=id_, lease_id=lease_id)
        return e
    history.add(OK, ACK, worker, queue, id=id_, lease_id=lease_id)
    return None


def _ack_batch(client: DoqClient, history: History, worker: str, queue: str, msgs: Sequence[Message]) -> None:
    """Ack deliveries by their leases with one unary call, recording each outcome."""
    for m in msgs:
        history.add(INVOKE, ACK, worker, queue, id=m.id, lease_id=m.lease_id)
    try:
        results = client.ack_batch(queue, [m.id for m in msgs], [m.lease_id for m in msgs])
    except DoqClientError as e:
        for m in msgs:
            history.add(outcome_of(e), ACK, worker, queue, id=m.id, lease_id=m.lease_id)
        return
    for m, r in zip(msgs, results, strict=True):
        history.add(OK if r.error is None else outcome_of(r.error), ACK, worker, queue, id=m.id, lease_id=m.lease_id)


def create_queues(targets: Targets, queues: Sequence[QueueSpec], settings: QueueSettings,
                  timeout_s: float) -> None:
    """Create every queue (idempotent), retrying until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for q in queues:
        while True:
            with DoqClient(targets.pick(), timeout_s=5.0) as client:
                try:
                    client.create_queue(q.name, q.type, settings)
                    break
                except DoqClientError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.2)


def drain(targets: Targets, queues: Sequence[str], history: History, *, visibility_timeout_ms: int,
          timeout_s: float, batch: int = 100) -> dict[str, int]:
    """Dequeue and ack (by lease, a batch at a time) every queue until it is empty, or
    until it gave nothing for `timeout_s` (the clock restarts with every message received:
    a slow machine drains slowly, it does not stop early).

    Messages leased by consumers that died come back when their leases end, so
    `timeout_s` must exceed the visibility timeout. Returns what each queue still held.
    """
    left = {q: -1 for q in queues}
    for q in queues:
        deadline = [time.monotonic() + timeout_s]  # moved on by `_drain_one` at each message
        while time.monotonic() < deadline[0]:
            with DoqClient(targets.pick(), timeout_s=10.0) as client:
                try:
                    left[q] = _drain_one(client, q, history, visibility_timeout_ms, deadline, batch, timeout_s)
                except DoqClientError:
                    time.sleep(0.2)
                    continue
            if left[q] == 0:
                break
    return left


def _drain_one(client: DoqClient, queue: str, history: History, visibility_timeout_ms: int,
               deadline: list[float], batch: int, timeout_s: float) -> int:
    while time.monotonic() < deadline[0]:
        wait_ms = int(max(0.0, min(1.0, deadline[0] - time.monotonic())) * 1000)
        msgs = client.dequeue(queue, max_messages=batch, wait_ms=wait_ms,
                              visibility_timeout_ms=visibility_timeout_ms)
        for m in msgs:
            history.add(OK, DELIVER, "drain", queue, payload=m.content.decode(), id=m.id,
                        lease_id=m.lease_id, lease_expires_at_ms=m.lease_expires_at_ms,
                        visibility_timeout_ms=visibility_timeout_ms)
        if msgs:
            deadline[0] = time.monotonic() + timeout_s
            _ack_batch(client, history, "drain", queue, msgs)
            continue
        s = client.get_queue(queue).stats
        if s.ready + s.delayed + s.in_flight == 0:
            return 0
    s = client.get_queue(queue).stats
    return s.ready + s.delayed + s.in_flight


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - best-effort cleanup of a broken connection
        pass


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Shape of the load. Rates are per producer; consumers are per queue."""

    queues: tuple[QueueSpec, ...] = (QueueSpec("chaos-delayed", "delayed"), QueueSpec("chaos-fair", "fair"))
    producers: int = 2
    rate_per_s: float = 100.0
    window: int = 64
    consumers_per_queue: int = 2
    prefetch: int = 16
    visibility_timeout_ms: int = 2000
    confirm_ratio: float = 0.5
    stall_s: float = 2.0
    call_timeout_s: float = 5.0
    dedup_window_ms: int = 3_600_000
    seed: int = 0


class Workload:
    """The producers, the consumers and a monitor that unblocks stalled consumers."""

    def __init__(self, cfg: WorkloadConfig, targets: Targets, history: History) -> None:
        self.cfg, self.targets, self.history = cfg, targets, history
        self.producers = [
            ProducerWorker(f"p{i}", cfg.queues, targets, history, rate_per_s=cfg.rate_per_s,
                           window=cfg.window, stall_s=cfg.stall_s, call_timeout_s=cfg.call_timeout_s)
            for i in range(cfg.producers)
        ]
        self.consumers = [
            ConsumerWorker(f"c{i}-{q.name}", q.name, targets, history, prefetch=cfg.prefetch,
                           visibility_timeout_ms=cfg.visibility_timeout_ms,
                           confirm_ratio=cfg.confirm_ratio, stall_s=cfg.stall_s + 2,
                           call_timeout_s=cfg.call_timeout_s, seed=cfg.seed * 1000 + n)
            for n, (q, i) in enumerate((q, i) for q in cfg.queues for i in range(cfg.consumers_per_queue))
        ]
        self._monitor_stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="chaos-monitor", daemon=True)

    @property
    def workers(self) -> list[_Worker]:
        return [*self.producers, *self.consumers]

    def setup(self, timeout_s: float = 30.0) -> None:
        settings = QueueSettings(visibility_timeout_ms=self.cfg.visibility_timeout_ms,
                                 dedup_window_ms=self.cfg.dedup_window_ms)
        create_queues(self.targets, self.cfg.queues, settings, timeout_s)

    def start(self) -> None:
        for w in self.workers:
            w.start()
        self._monitor.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the producers (they wait for their answers), then the consumers."""
        for group in (self.producers, self.consumers):
            for w in group:
                w.stop.set()
            for w in group:
                w.join(timeout_s)
        self._monitor_stop.set()
        self._monitor.join(timeout_s)
        stuck = [w.worker for w in self.workers if w.is_alive()]
        if stuck:
            raise RuntimeError(f"workers did not stop within {timeout_s} s: {stuck}")

    def crashes(self) -> list[str]:
        return [f"{w.worker}: {w.crash!r}" for w in self.workers if w.crash is not None]

    def drain(self, timeout_s: float) -> dict[str, int]:
        return drain(self.targets, [q.name for q in self.cfg.queues], self.history,
                     visibility_timeout_ms=self.cfg.visibility_timeout_ms, timeout_s=timeout_s)

    def _watch(self) -> None:
        while not self._monitor_stop.wait(0.2):
            now = time.monotonic()
            for c in self.consumers:
                c.interrupt_if_stalled(now)
