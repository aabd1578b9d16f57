"""What the sync and asyncio workers share: their rules, without calls or clock reads.

- `Backoff`: the delay before a failed message is delivered again.
- `LeasePlan`: when a held message's lease is extended (touched), from the worker's own
  monotonic clock (never the server's wall clock: no skew to trust).
- `Held`: one message a worker holds, and the one transition that decides who settles it
  (the handler finishing, or a stop releasing it): `claim`.
- `take_acks` / `ack_outcomes`: the acks of handlers that returned, coalesced into
  `AckBatch` calls (one call carries every ack that came while the previous one was out).
- `WorkerHooks`: the metrics callbacks.
- `WorkerOptions`: the validated settings both loops read.

The loops (`doq_client.aio_worker`, and `doq_client.worker` generated from it) only add
tasks or threads and the calls to the client around these.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from doq_client import _ops
from doq_client.errors import (
    DoqClientError,
    FailedPrecondition,
    NotFound,
    StaleLease,
    invalid_argument,
)
from doq_client.retry import is_failover
from doq_client.types import AckResult, Message, QueueSettings

log = logging.getLogger("doq_client.worker")

DEFAULT_LEASE_MS = 30_000  # the server's lease when neither the worker nor the queue sets one
MAX_DELAY_MS = 366 * 24 * 3600 * 1000  # the most a nack may delay a message (the server's bound)
MAX_LEASE_MS = 12 * 3600 * 1000  # the longest lease a dequeue or touch may ask for
MAX_WAIT_MS = 60_000  # the longest long poll the server allows
RETRY_POLL_S = 1.0  # pause after a failed poll (a failover error the client gave up on)
MAX_ACKS_PER_CALL = 1_000  # acks per AckBatch call


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before a failed message is delivered again (its nack's `delay_ms`).

    After the `attempts`-th delivery failed: ``min(cap_ms, base_ms * factor**(attempts-1))``,
    then reduced by a random fraction of at most `jitter` (0 <= jitter <= 1; 0 = exact),
    so a delay never exceeds `cap_ms` and failures of many messages spread out.
    """

    base_ms: int = 1_000
    factor: float = 2.0
    cap_ms: int = 300_000
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (type(self.base_ms) is int and 0 <= self.base_ms <= MAX_DELAY_MS):
            raise invalid_argument(f"base_ms must be an integer within 0..{MAX_DELAY_MS}, not {self.base_ms!r}")
        if not (type(self.cap_ms) is int and 0 <= self.cap_ms <= MAX_DELAY_MS):
            raise invalid_argument(f"cap_ms must be an integer within 0..{MAX_DELAY_MS}, not {self.cap_ms!r}")
        if not (isinstance(self.factor, int | float) and 1 <= self.factor < math.inf):
            raise invalid_argument(f"factor must be a finite number >= 1, not {self.factor!r}")
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1):
            raise invalid_argument(f"jitter must be within 0..1, not {self.jitter!r}")

    def delay_ms(self, attempts: int, rand: float = 0.0) -> int:
        """The delay after the `attempts`-th delivery failed; `rand` in [0, 1) draws the jitter."""
        try:
            raw = self.base_ms * float(self.factor) ** max(attempts - 1, 0)
        except OverflowError:
            raw = math.inf
        return int(min(float(self.cap_ms), raw) * (1.0 - self.jitter * rand))


@dataclass(frozen=True, slots=True)
class LeasePlan:
    """When to extend a lease of `lease_ms`.

    A lease starts on the server after the request that takes or extends it was sent, so
    the worker counts it from that send time (`leased_at_s`, its own monotonic clock): its
    idea of the expiry is never later than the server's. It extends once `extend_at` of the
    lease has passed (default 1/3: two thirds of the lease stay for the touch to be
    committed, however slow the machine), and after a failed touch tries again after
    `retry_at` of the lease.
    """

    lease_ms: int
    extend_at: float = 1 / 3
    retry_at: float = 1 / 10

    def __post_init__(self) -> None:
        if not (type(self.lease_ms) is int and 1 <= self.lease_ms <= MAX_LEASE_MS):
            raise invalid_argument(f"the lease must be within 1..{MAX_LEASE_MS} ms, not {self.lease_ms!r}")
        if not (isinstance(self.extend_at, int | float) and 0 < self.extend_at < 1):
            raise invalid_argument(f"extend_at must be a fraction of the lease within (0, 1), not {self.extend_at!r}")

    def next_extend_s(self, leased_at_s: float) -> float:
        """When to touch a lease taken or extended by a request sent at `leased_at_s`."""
        return leased_at_s + self.lease_ms / 1000 * self.extend_at

    def retry_s(self, now_s: float) -> float:
        """When to try a failed touch again."""
        return now_s + self.lease_ms / 1000 * self.retry_at


def lease_lost(err: DoqClientError) -> bool:
    """A touch, ack or nack failed because the delivery's lease is gone (it expired and
    the message was delivered again, or it was settled): trying again cannot help."""
    return isinstance(err, StaleLease | NotFound | FailedPrecondition)


def poll_retryable(err: DoqClientError) -> bool:
    """A failed poll that a later one may get past (the worker keeps going)."""
    return err.retryable or is_failover(err)


class State(enum.Enum):
    RUNNING = "running"  # the handler has it
    SETTLING = "settling"  # the handler returned: the worker acks or nacks it
    RELEASED = "released"  # a stop handed it back; the handler's outcome is ignored


@dataclass(eq=False, slots=True)
class Held:
    """A message the worker holds. `leased_at_s`: when the request that took or last
    extended its lease was sent; `lost`: a touch found the lease gone."""

    msg: Message
    leased_at_s: float
    next_extend_s: float
    state: State = State.RUNNING
    lost: bool = False
    started_s: float = 0.0

    def claim(self, to: State) -> bool:
        """Move a RUNNING message to SETTLING (the handler returned) or RELEASED (a stop hands
        it back); False if the other happened first. The caller holds the worker's lock (the
        asyncio worker needs none): exactly one of the two settles the message."""
        if self.state is not State.RUNNING:
            return False
        self.state = to
        return True

    def wants_extend(self, now_s: float) -> bool:
        return self.state is State.RUNNING and not self.lost and now_s >= self.next_extend_s


def take_acks(pending: list[Held], queue: str) -> tuple[list[Held], _ops.Op[list[AckResult]]]:
    """Take up to MAX_ACKS_PER_CALL of the `pending` acks (removed from it) and the
    `AckBatch` call that settles them (each with its delivery's lease id: safe to repeat)."""
    batch = pending[:MAX_ACKS_PER_CALL]
    del pending[:MAX_ACKS_PER_CALL]
    return batch, _ops.ack_batch(queue, [h.msg.id for h in batch], [h.msg.lease_id for h in batch])


def ack_outcomes(batch: list[Held], results: list[AckResult] | Exception) -> list[tuple[Held, Exception | None]]:
    """Each acked message with its error (None: acked); a failed call fails them all."""
    if isinstance(results, Exception):
        return [(h, results) for h in batch]
    return [(h, r.error) for h, r in zip(batch, results, strict=True)]


def note_touch(h: Held, plan: LeasePlan, queue: str, sent_s: float, outcome: int | Exception,
               now_s: float) -> bool:
    """Record on `h` the outcome of a touch sent at `sent_s` (the new expiry, or the
    error); True if the lease was extended. A lost lease is not touched again; another
    failure is tried again after `plan.retry_s`."""
    if not isinstance(outcome, Exception):
        h.leased_at_s = sent_s
        h.next_extend_s = plan.next_extend_s(sent_s)
        return True
    if isinstance(outcome, DoqClientError) and lease_lost(outcome):
        h.lost = True
        if h.state is State.RUNNING:
            log.warning("the lease of message %d of %r was lost (%s): it will be delivered again",
                        h.msg.id, queue, outcome)
    else:
        log.warning("extending the lease of message %d of %r failed (%s); trying again", h.msg.id, queue, outcome)
        h.next_extend_s = plan.retry_s(now_s)
    return False


class WorkerHooks:
    """Metrics callbacks; subclass and override what you need (each does nothing here).

    Called from the worker's threads (sync) or its event loop (asyncio); keep them quick.
    An exception in a hook is logged and otherwise ignored.
    """

    def on_start(self, msg: Message) -> None:
        """The handler is about to run with `msg`."""

    def on_success(self, msg: Message, duration_s: float) -> None:
        """The handler returned and the message was acked."""

    def on_failure(self, msg: Message, error: BaseException, retry_in_ms: int | None) -> None:
        """The handler raised `error`; the message was nacked to be delivered again in
        `retry_in_ms`, or (None) it was its last attempt and the server dead-letters it."""

    def on_extend(self, msg: Message, expires_at_ms: int) -> None:
        """The lease was extended; `expires_at_ms`: the server's new expiry (Unix ms)."""

    def on_release(self, msg: Message) -> None:
        """A stop handed the message back (released: ready at once, attempt not counted)."""


def call_hook(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("worker hook %s failed", getattr(fn, "__name__", fn))


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """A worker's settings (see `DoqClient.worker`)."""

    concurrency: int = 1
    visibility_timeout_ms: int = 0  # 0: the queue's setting, else DEFAULT_LEASE_MS
    backoff: Backoff = field(default_factory=Backoff)
    extend_at: float = 1 / 3
    grace_s: float = 30.0
    poll_wait_ms: int = 1_000

    def __post_init__(self) -> None:
        if not (type(self.concurrency) is int and 1 <= self.concurrency <= 100_000):
            raise invalid_argument(f"concurrency must be an integer within 1..100000, not {self.concurrency!r}")
        if not (type(self.visibility_timeout_ms) is int and 0 <= self.visibility_timeout_ms <= MAX_LEASE_MS):
            raise invalid_argument(
                f"visibility_timeout_ms must be within 0..{MAX_LEASE_MS}, not {self.visibility_timeout_ms!r}",
                "INVALID_TIMEOUT")
        if not (isinstance(self.grace_s, int | float) and 0 <= self.grace_s < math.inf):
            raise invalid_argument(f"grace_s must be a finite number >= 0, not {self.grace_s!r}")
        if not (type(self.poll_wait_ms) is int and 1 <= self.poll_wait_ms <= MAX_WAIT_MS):
            raise invalid_argument(f"poll_wait_ms must be within 1..{MAX_WAIT_MS}, not {self.poll_wait_ms!r}")
        LeasePlan(self.visibility_timeout_ms or DEFAULT_LEASE_MS, self.extend_at)  # validates extend_at

    def plan(self, settings: QueueSettings) -> LeasePlan:
        """The lease the worker asks for: its own, else the queue's, else the server's default."""
        lease_ms = self.visibility_timeout_ms or settings.visibility_timeout_ms or DEFAULT_LEASE_MS
        return LeasePlan(lease_ms, self.extend_at)


def retry_in_ms(msg: Message, max_attempts: int, backoff: Backoff, rand: float) -> int | None:
    """The nack delay after `msg`'s handler failed, or None when this was its last attempt
    (`max_attempts` > 0 reached: the server dead-letters it on the nack)."""
    if max_attempts and msg.attempts >= max_attempts:
        return None
    return backoff.delay_ms(msg.attempts, rand)


def worker_options(concurrency: int, options: dict[str, object]) -> tuple[WorkerOptions, dict[str, object]]:
    """Split `DoqClient.worker`'s keyword options into `WorkerOptions` and the worker's own
    (`hooks`, `rng`); an unknown name is a TypeError, as for any call."""
    own: dict[str, object] = {k: options.pop(k) for k in ("hooks", "rng") if k in options}
    return WorkerOptions(concurrency, **options), own  # type: ignore[arg-type]
