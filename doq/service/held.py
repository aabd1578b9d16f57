"""A delivery is settled only by whoever holds it.

- By id (gRPC `Ack`, `AckBatch`, `Nack`, `Touch`; HTTP `.../nack`, `.../touch`,
  `messages:ack`): the request must name the delivery's lease id (`require_lease`,
  `require_leases`: InvalidArgument LEASE_REQUIRED otherwise, nothing proposed); the
  machine refuses a lease that is not the message's current one (StaleLease). The one
  exception is the seed's `POST /API/v1/queues/{name}/messages/{id}/ack`, which has no
  lease in the seed's curl line: it settles whatever delivery is current, under a key that
  may consume the queue (the authorization table).
- On a dequeue stream (`Held`): the stream settles only what it delivered. It records
  each frame's (id, lease id) and settles an ack or nack with the lease it holds for that
  id; an id it did not deliver, or a lease id other than the one it holds, gets
  `NO_LEASE`, which matches no delivery: the session drops it (`DequeueSession.dropped`),
  nothing is proposed.
Lease ids are sequence numbers, not secrets: the scopes decide who may consume a queue,
the lease ids keep one consumer from settling another's delivery by mistake.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

from doq.errors import InvalidArgument
from doq.queues.model import MessageView

NO_LEASE = 2**64 - 1
"""A lease id no delivery has (lease ids count up from 1)."""
_ID = attrgetter("id")
_LEASE = attrgetter("lease_id")


def require_lease(lease_id: int) -> None:
    if not lease_id:
        raise InvalidArgument("settling a message by id needs its lease_id (from the delivery)",
                              reason="LEASE_REQUIRED")


def require_leases(ids: Sequence[int], lease_ids: Sequence[int]) -> None:
    """(`lease_ids` of another length than `ids` is left to the service: INVALID_LEASE_IDS.)"""
    if lease_ids and len(lease_ids) != len(ids):
        return
    if not lease_ids or not all(lease_ids):
        raise InvalidArgument("settling messages by id needs one lease_id (from the delivery) per id",
                              reason="LEASE_REQUIRED")


class Held:
    """The deliveries of one dequeue stream not yet settled through it: id -> lease id."""

    __slots__ = ("leases",)

    def __init__(self) -> None:
        self.leases: dict[int, int] = {}

    def record(self, msgs: Sequence[MessageView]) -> None:
        self.leases.update(zip(map(_ID, msgs), map(_LEASE, msgs), strict=True))  # C loops, no Python per message

    def acks(self, ids: Sequence[int], lease_ids: Sequence[int]) -> list[int]:
        """The lease ids to settle `ids` with (`lease_ids`: the client's, empty or one per id)."""
        held = list(map(self.leases.pop, ids, repeat(NO_LEASE)))
        if lease_ids and held != lease_ids:  # (the usual case compares equal, in one C call)
            held = [h if given == h else NO_LEASE for h, given in zip(held, lease_ids, strict=True)]
        return held

    def take(self, id_: int, lease_id: int) -> int:
        """The lease id to settle one nack with (`lease_id`: the client's, 0 if none)."""
        held = self.leases.pop(id_, NO_LEASE)
        return held if not lease_id or lease_id == held else NO_LEASE
