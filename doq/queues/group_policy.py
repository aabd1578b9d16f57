"""Per-group weights and rate limits of a fair queue (pure: replicated state only).

Contract:
- A group's **weight** (1..`MAX_GROUP_WEIGHT`) is how many deliveries it makes per turn
  of the round-robin (`doq.queues.fair`); its **rate** (messages per second, 0 = no
  limit) caps its deliveries with a token bucket. Each is the group's override if set,
  else the queue's default (`default_group_weight`, 0 meaning 1;
  `default_group_max_per_second`, 0 meaning no limit).
- The bucket holds milli-tokens: it refills by `rate` milli-tokens per millisecond of
  replicated time (exact integers), up to `capacity_mt(rate)` (one second's worth:
  a burst of at most `rate` messages, so a consumer that pauses for up to a second
  loses none of the group's share); a delivery takes 1000. A group whose bucket holds less
  than 1000 is *throttled* until `wake_at` (derived from the bucket alone): the
  rotation skips it without waiting for it. A bucket that is full again is forgotten
  (absent means full), so the state does not grow with groups that went quiet.
- Every change names the group in `dirty`; the machine writes `record(name)` (or deletes
  the group's record when it is None) and `load` rebuilds the same state from the records
  and the replicated time, so a rebuilt replica throttles exactly as the live one.
"""

from __future__ import annotations

import struct

from sortedcontainers import SortedList

from doq.queues.limits import MAX_GROUP_RATE, MAX_GROUP_WEIGHT

TOKEN_MT = 1000  # milli-tokens one delivery takes
INHERIT_RATE = -1  # an override's rate that means "the queue's default"

# flags (1: has a bucket), weight override (0: inherit), rate override (-1: inherit),
# bucket milli-tokens, bucket time (ms of replicated time)
_REC = struct.Struct("<BIqqQ")


def capacity_mt(rate: int) -> int:
    """Bucket size in milli-tokens: one second of `rate` (at least one message)."""
    return max(TOKEN_MT, rate * 1000)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class GroupPolicies:
    """The overrides and token buckets of one fair queue's groups."""

    __slots__ = ("default_weight", "default_rate", "overrides", "buckets", "throttled",
                 "wakes", "full_at", "fills", "dirty")

    def __init__(self, default_weight: int = 0, default_rate: int = 0) -> None:
        self.default_weight = default_weight or 1
        self.default_rate = default_rate
        self.overrides: dict[str, tuple[int, int]] = {}  # name -> (weight or 0, rate or -1)
        self.buckets: dict[str, tuple[int, int]] = {}  # name -> (milli-tokens, at_ms)
        self.throttled: dict[str, int] = {}  # name -> wake_at_ms
        self.wakes: SortedList = SortedList()  # (wake_at_ms, name)
        self.full_at: dict[str, int] = {}  # name -> ms at which its bucket is full again
        self.fills: SortedList = SortedList()  # (full_at_ms, name)
        self.dirty: set[str] = set()

    # -- reading -------------------------------------------------------------------------
    def weight(self, name: str) -> int:
        o = self.overrides.get(name)
        return o[0] if o is not None and o[0] else self.default_weight

    def rate(self, name: str) -> int:
        o = self.overrides.get(name)
        return o[1] if o is not None and o[1] != INHERIT_RATE else self.default_rate

    def is_throttled(self, name: str) -> bool:
        return name in self.throttled

    def level_mt(self, name: str, now_ms: int) -> int:
        """Milli-tokens in the group's bucket at `now_ms` (a full bucket if it has none)."""
        rate = self.rate(name)
        cap = capacity_mt(rate)
        b = self.buckets.get(name)
        if b is None:
            return cap
        return min(cap, b[0] + max(0, now_ms - b[1]) * rate)

    def allowance(self, name: str, now_ms: int) -> int | None:
        """Deliveries the group may make at `now_ms` before it is throttled (None: no limit)."""
        if self.rate(name) <= 0:
            return None
        return self.level_mt(name, now_ms) // TOKEN_MT

    def next_timer_ms(self) -> int | None:
        """Earliest replicated time at which a throttled group wakes or a bucket fills."""
        due = [lst[0][0] for lst in (self.wakes, self.fills) if lst]
        return min(due) if due else None

    def names(self) -> set[str]:
        """Groups with an override or a bucket."""
        return set(self.overrides) | set(self.buckets)

    # -- changing ------------------------------------------------------------------------
    def take(self, name: str, now_ms: int) -> None:
        """One delivery of group `name` at `now_ms` (a no-op without a rate)."""
        rate = self.rate(name)
        if rate <= 0:
            return
        self.buckets[name] = (self.level_mt(name, now_ms) - TOKEN_MT, now_ms)
        self._schedule(name)

    def wake(self, now_ms: int) -> list[str]:
        """Forget buckets full by `now_ms`; the groups no longer throttled (by name)."""
        fills = self.fills
        while fills and fills[0][0] <= now_ms:
            _, name = fills.pop(0)
            del self.full_at[name]
            self.buckets.pop(name, None)
            self.dirty.add(name)
        woken: list[str] = []
        wakes = self.wakes
        while wakes and wakes[0][0] <= now_ms:
            _, name = wakes.pop(0)
            del self.throttled[name]
            woken.append(name)
        return sorted(woken)

    def set_override(self, name: str, weight: int | None, rate: int | None, now_ms: int) -> None:
        """Set (None: keep) the group's weight (0: the default) and rate (-1: the default);
        its bucket keeps what it holds at `now_ms`, counted under the new rate."""
        old = self.overrides.get(name, (0, INHERIT_RATE))
        new = (old[0] if weight is None else weight, old[1] if rate is None else rate)
        if new == old:
            return  # nothing changes (no record is written)
        before = self._settle(name, now_ms)
        if new == (0, INHERIT_RATE):
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = new
        self._rebase(name, before, now_ms)
        self.dirty.add(name)

    def set_defaults(self, weight: int, rate: int, now_ms: int) -> list[str]:
        """New queue defaults; the groups whose throttling may have changed (by name)."""
        names = sorted(self.buckets)
        before = {n: self._settle(n, now_ms) for n in names}
        self.default_weight = weight or 1
        self.default_rate = rate
        for n in names:
            self._rebase(n, before[n], now_ms)
        return names

    def forget(self, name: str) -> None:
        """Drop everything about a group (the queue is deleted or purged of it)."""
        self.overrides.pop(name, None)
        self.buckets.pop(name, None)
        self._unschedule(name)
        self.dirty.add(name)

    def take_dirty(self) -> list[str]:
        out = sorted(self.dirty)
        self.dirty.clear()
        return out

    def _settle(self, name: str, now_ms: int) -> int | None:
        """The bucket's level at `now_ms` under the current rate (None: no bucket)."""
        return self.level_mt(name, now_ms) if name in self.buckets else None

    def _rebase(self, name: str, level: int | None, now_ms: int) -> None:
        """Restart the bucket from `level` at `now_ms` under the group's current rate."""
        rate = self.rate(name)
        if level is None or rate <= 0 or level >= capacity_mt(rate):
            if self.buckets.pop(name, None) is not None:
                self.dirty.add(name)
            self._unschedule(name)
            return
        self.buckets[name] = (level, now_ms)
        self.dirty.add(name)
        self._schedule(name)

    def _unschedule(self, name: str) -> None:
        w = self.throttled.pop(name, None)
        if w is not None:
            self.wakes.remove((w, name))
        f = self.full_at.pop(name, None)
        if f is not None:
            self.fills.remove((f, name))

    def _schedule(self, name: str) -> None:
        """The timers of the group's bucket (derived from the bucket and rate alone)."""
        self._unschedule(name)
        self.dirty.add(name)
        tokens, at = self.buckets[name]
        rate = self.rate(name)
        if tokens < TOKEN_MT:
            w = at + _ceil_div(TOKEN_MT - tokens, rate)
            self.throttled[name] = w
            self.wakes.add((w, name))
        f = at + _ceil_div(capacity_mt(rate) - tokens, rate)
        self.full_at[name] = f
        self.fills.add((f, name))

    # -- records -------------------------------------------------------------------------
    def record(self, name: str) -> bytes | None:
        """The group's record (None: nothing to keep)."""
        o = self.overrides.get(name)
        b = self.buckets.get(name)
        if o is None and b is None:
            return None
        w, r = o if o is not None else (0, INHERIT_RATE)
        t, at = b if b is not None else (0, 0)
        return _REC.pack(1 if b is not None else 0, w, r, t, at)

    def load(self, name: str, rec: bytes) -> None:
        """Restore a group from its record (raises ValueError if malformed). A live
        replica has already forgotten the buckets full by its replicated time, so the
        timers rebuilt here all lie ahead of it."""
        flags, w, r, t, at = decode_group(rec)
        if w or r != INHERIT_RATE:
            self.overrides[name] = (w, r)
        if flags & 1:
            self.buckets[name] = (t, at)
            if self.rate(name) <= 0:
                raise ValueError(f"group {name!r}: a bucket without a rate")
            self._schedule(name)
        self.dirty.discard(name)


def decode_group(rec: bytes) -> tuple[int, int, int, int, int]:
    """(flags, weight override, rate override, milli-tokens, at_ms) of a group record;
    raises ValueError if malformed."""
    if len(rec) != _REC.size:
        raise ValueError(f"a group record is {_REC.size} bytes, got {len(rec)}")
    flags, w, r, t, at = _REC.unpack(rec)
    if flags & ~1 or not 0 <= w <= MAX_GROUP_WEIGHT or not INHERIT_RATE <= r <= MAX_GROUP_RATE:
        raise ValueError("group record out of range")
    if not flags and (t or at or (not w and r == INHERIT_RATE)):
        raise ValueError("group record without content")
    return flags, w, r, t, at
