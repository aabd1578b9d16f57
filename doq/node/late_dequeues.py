"""Dequeues that committed after their lease had ended hand nobody their messages.

A dequeue can commit late (through a quorum loss, say), maybe proposed by another member
that cannot settle it now: by the leader's clock its lease has already ended, and the
proposing service does not hand the messages out either. The leader releases them
(`Nack(release=True)`), so they are ready at once with no attempt counted; the machine
lets such a release win over the lease's expiry in its batch, and a release the proposing
service also made fails harmlessly. Pure: the driver proposes what `releases` yields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from doq.queues.commands import Nack
from doq.queues.model import MessageView


def releases(results: Sequence[list[object]], clock_ms: Callable[[], int]) -> Iterator[Nack]:
    """The releases of the messages that the dequeues among these applied results
    (one list per entry, one result per command) leased with a lease that ended by
    `clock_ms()` (read once, and only if some dequeue leased anything)."""
    now_ms = 0
    for res in results:
        for r in res:
            if type(r) is not list or not r or type(r[0]) is not MessageView:
                continue
            first = r[0]
            if not first.lease_id:
                continue  # removed on delivery: nothing to release
            now_ms = now_ms or clock_ms()
            if first.lease_expires_at_ms > now_ms:
                continue  # one dequeue's messages share one lease end
            for m in r:
                yield Nack(m.queue_name, m.id, m.lease_id, release=True)
