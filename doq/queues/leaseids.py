"""Lease ids: unguessable by other consumers, yet the same on every replica. Pure.

A `Dequeue` carries a random 64-bit `seed` the leader draws for it (`secrets`); the
machine derives the lease ids of the `n` messages it delivers from that seed and the
replicated lease counter: a base `splitmix64(seed + counter)` mapped into
[1, 2**64 - 2 - n], then `base + i` for the `i`-th message. So ids are never 0 ("no
lease") nor 2**64 - 1 (reserved: a lease id no delivery has), are distinct within a
command, and cost one mix per command, not per message. Every replica applies the same
entry, so it derives the same ids (digests stay equal). The seed never leaves the log: a
consumer sees only the lease ids of its own deliveries, which tell nothing of another
command's seed, so it cannot guess the leases of deliveries made to others. An entry
without a seed (0: written before seeds existed) keeps the old sequential ids:
`counter + i`.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The splitmix64 finalizer of `x` (mod 2**64): a bijection that mixes every bit."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def lease_ids(seed: int, counter: int, n: int) -> range:
    """The ids of `n` leases granted by one dequeue with `seed`, the lease counter at
    `counter` (which the caller then advances by `n`)."""
    if not seed:
        return range(counter, counter + n)
    base = splitmix64((seed + counter) & MASK64) % (MASK64 - 1 - n) + 1
    return range(base, base + n)
