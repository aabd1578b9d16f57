"""Bounded retry of unary calls on errors the server marks retryable.

Contract: a call is retried only when its error is `retryable` AND either the call is
idempotent (reads; enqueues that carry a `dedup_id`) or the server's `reason` proves the
command was not applied (not the leader, overloaded, shutting down, no leader). So a
retried enqueue is never stored twice when it has a `dedup_id` (within the queue's dedup
window), and an enqueue without one is retried only when it certainly was not stored.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from doq_client.errors import DoqClientError

T = TypeVar("T")

#: reasons that guarantee the command was refused before it was proposed
NOT_APPLIED_REASONS = frozenset({"NOT_LEADER", "NO_LEADER", "OVERLOADED", "SHUTTING_DOWN"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """At most `max_attempts` tries, sleeping an exponentially growing, jittered backoff.

    `RetryPolicy(max_attempts=1)` disables retries.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def backoff_s(self, attempt: int) -> float:
        """Sleep before try number `attempt + 1` (attempt counts from 1); full jitter."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return random.uniform(cap / 2, cap)

    def should_retry(self, err: DoqClientError, attempt: int, idempotent: bool) -> bool:
        if attempt >= self.max_attempts or not err.retryable:
            return False
        return idempotent or err.reason in NOT_APPLIED_REASONS


NO_RETRY = RetryPolicy(max_attempts=1)


def call_with_retry(policy: RetryPolicy, idempotent: bool, fn: Callable[[], T]) -> T:
    attempt = 1
    while True:
        try:
            return fn()
        except DoqClientError as e:
            if not policy.should_retry(e, attempt, idempotent):
                raise
            time.sleep(policy.backoff_s(attempt))
            attempt += 1


async def acall_with_retry(
    policy: RetryPolicy, idempotent: bool, fn: Callable[[], Awaitable[T]]
) -> T:
    attempt = 1
    while True:
        try:
            return await fn()
        except DoqClientError as e:
            if not policy.should_retry(e, attempt, idempotent):
                raise
            await asyncio.sleep(policy.backoff_s(attempt))
            attempt += 1
