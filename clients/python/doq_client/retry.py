"""When a failed call is sent again, and when not: the client's retry rules, in one place.

Two kinds of failure are retried:

- **Failover** errors, gRPC UNAVAILABLE (not the leader, no leader, shutting down, the
  connection lost or refused): the client moves to the leader (the address the error
  names, else the leader the refusing node lists, else the next known address) and tries
  again, at once after a first leader hint, otherwise after a jittered backoff, for at
  most `FailoverPolicy.timeout_s` from the first failure (a success ends the episode). On
  by default.
- Other `retryable` errors (OVERLOADED, a storage alarm, ...): the same node after a
  backoff, at most `RetryPolicy.max_attempts` tries. Off by default.

Either way a request is sent again only when that is safe: the failure proves it was not
applied (`NOT_APPLIED_REASONS`: the node refused it before it entered the log, or its log
entry was replaced), or the call is *repeatable* (`doq_client._ops.Op`): a repeat cannot
apply it twice. OUTCOME_UNKNOWN (a leader lost its leadership with the command in its
log), a deadline the client set passing, LEADER_UNREACHABLE (a relay to the leader broke) and a lost
connection prove nothing: the command may still be applied.

A repeat after such an outcome-unknown failure may find its own first attempt applied:
the reasons in `Op.gone` then count as success (an ack with a lease id whose repeat
answers MESSAGE_NOT_FOUND: the message is removed, by this ack or, after its lease ended,
by another delivery's).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import grpc

from doq_client.errors import DoqClientError

log = logging.getLogger("doq_client")

#: reasons that prove the command was not applied (and never will be)
NOT_APPLIED_REASONS = frozenset({"OVERLOADED", "NOT_LEADER"})


def _backoff_s(attempt: int, initial_s: float, multiplier: float, max_s: float) -> float:
    """Sleep before try number `attempt + 1` (attempt counts from 1); half jitter."""
    cap = min(max_s, initial_s * multiplier ** min(attempt - 1, 64))
    return random.uniform(cap / 2, cap)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry of `retryable` errors other than failover ones, on the same node: at most
    `max_attempts` tries, sleeping an exponentially growing, jittered backoff.

    `RetryPolicy(max_attempts=1)` (the default `NO_RETRY`) disables it.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def backoff_s(self, attempt: int) -> float:
        return _backoff_s(attempt, self.initial_backoff_s, self.multiplier, self.max_backoff_s)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    """How long a client looks for a leader after a failover error, and how it paces tries.

    `timeout_s` bounds one failover, from the first failure until the client gives up and
    raises (or fails a stream's pending work); any success ends the failover. 0 disables
    retrying (the client still moves to the leader for its next call). Following a leader
    hint is immediate the first time; other tries wait a jittered backoff growing from
    `initial_backoff_s` to `max_backoff_s`.
    """

    timeout_s: float = 15.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    def backoff_s(self, attempt: int) -> float:
        return _backoff_s(attempt, self.initial_backoff_s, 2.0, self.max_backoff_s)


NO_FAILOVER = FailoverPolicy(timeout_s=0.0)


def is_failover(err: DoqClientError) -> bool:
    """The node cannot serve the call (or could not be reached): look for the leader."""
    return err.code == grpc.StatusCode.UNAVAILABLE


class Attempts:
    """The retry state of one call (or of one stream's reconnections).

    `repeatable`: the request may be sent again after an outcome-unknown failure.
    `unknown` becomes True once a failed attempt may have been applied.
    """

    __slots__ = ("retry", "failover", "repeatable", "count", "hops", "deadline", "unknown")

    def __init__(self, retry: RetryPolicy, failover: FailoverPolicy, repeatable: bool) -> None:
        self.retry = retry
        self.failover = failover
        self.repeatable = repeatable
        self.count = 1  # tries so far
        self.hops = 0  # leader hints followed at once
        self.deadline: float | None = None  # of the failover, from its first failure
        self.unknown = False

    def next_delay(self, err: DoqClientError, hinted: bool) -> float | None:
        """After try number `count` failed with `err`: the sleep before the next try, or
        None to give up (raise `err`). `hinted`: the client moved to a leader `err` named."""
        maybe_applied = err.reason not in NOT_APPLIED_REASONS
        if maybe_applied and not self.repeatable:
            return None
        if is_failover(err):
            now = time.monotonic()
            if self.deadline is None:
                self.deadline = now + self.failover.timeout_s
                if self.failover.timeout_s > 0:  # say what the client waits for, once per failover
                    log.warning("doq_client: %s (%s); looking for a leader for up to %g s "
                                "(FailoverPolicy.timeout_s)", err.message, err.reason or err.code.name,
                                self.failover.timeout_s)
            if now >= self.deadline:
                return None
            if hinted and self.hops == 0:
                self.hops += 1
                delay = 0.0
            else:
                delay = min(self.failover.backoff_s(self.count), self.deadline - now)
        elif err.retryable and self.count < self.retry.max_attempts:
            delay = self.retry.backoff_s(self.count)
        else:
            return None
        self.unknown = self.unknown or maybe_applied
        self.count += 1
        return delay
