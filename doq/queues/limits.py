"""The bounds of queue names, settings and command arguments: defined here, once (pure).

The state machine refuses a command beyond them (so every replica agrees), the service
facade checks them before proposing (`doq.service.limits`: a clear error, nothing
proposed) and the HTTP models declare them in the OpenAPI document (`Field(ge=.., le=..)`
built from these names). All bounds are inclusive; the lower bound is 0 unless stated.
"""

from __future__ import annotations

import re

MAX_QUEUE_NAME_CHARS = 200
# JSON Schema syntax for the document; Python code must use `QUEUE_NAME_RE.fullmatch`
# (with `re.match`, `$` also matches before a trailing newline: "jobs\n" would pass).
QUEUE_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_QUEUE_NAME_CHARS - 1}}}$"
QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
QUEUE_NAME_RULE = (
    f"1-{MAX_QUEUE_NAME_CHARS} characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
)

# queue settings (0 selects the documented default)
MAX_VISIBILITY_TIMEOUT_MS = 12 * 3600 * 1000  # also of a dequeue's or touch's own timeout
MAX_ATTEMPTS = 1_000_000
MAX_UNACKED_PER_GROUP = 1_000_000_000
MAX_DELAY_MS = 366 * 24 * 3600 * 1000  # enqueue and nack delay_ms
MAX_DEDUP_WINDOW_MS = MAX_DELAY_MS
# fair-queue groups (doq.queues.group_policy): a weight is 1.. this (0 in a setting: 1),
# a rate this many messages per second at most (0: no limit)
MAX_GROUP_WEIGHT = 10_000
MAX_GROUP_RATE = 1_000_000

# messages and commands
PRIORITY_MIN, PRIORITY_MAX = -(2**63), 2**63 - 1  # signed 64-bit
MAX_BATCH_MESSAGES = 10_000  # messages per dequeue, per batch enqueue, ids per ack batch
MAX_WAIT_MS = 60_000  # a long poll's wait (the service's, not the machine's)


def is_queue_name(name: object) -> bool:
    """True if `name` is a valid queue name (the whole string, see QUEUE_NAME_RULE)."""
    return isinstance(name, str) and QUEUE_NAME_RE.fullmatch(name) is not None
