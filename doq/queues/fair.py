"""Ready index of a fair queue: weighted round-robin across groups, priority then FIFO
inside one.

Rotation is a function of replicated state only: groups are ordered by name, and a turn
goes to the first *active* group whose name sorts after `cursor` (the group served last),
wrapping around. A turn is `weight` deliveries (deficit style: `credit` counts the
deliveries the cursor's group may still make in its turn, and it carries over from one
dequeue to the next, so batch sizes do not change who gets what); a turn ends early when
its group is not active at a delivery (the next active group's turn begins). A group is active when it has a ready message,
is below the queue's `max_unacked_per_group` (0 = no limit) and is not throttled by its
rate (`doq.queues.group_policy`: it is skipped, the others go on). With every weight 1
(the default) this is the plain round-robin. The cursor and credit are persisted with
the queue, so a rebuilt replica continues the same rotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice, repeat
from operator import add, attrgetter, le, lshift, lt, or_

from sortedcontainers import SortedList

from doq.queues.group_policy import GroupPolicies
from doq.queues.pairlist import PairList

_OFF = 1 << 63  # ready_key(priority, id) = (priority + _OFF) << 64 | id (doq.queues.delayed)
_MASK64 = (1 << 64) - 1
_ready = attrgetter("ready")


def _pair(key: int) -> tuple[int, int]:
    """The (priority, id) of a ready key."""
    return (key >> 64) - _OFF, key & _MASK64


def _key(priority: int, id_: int) -> int:
    return ((priority + _OFF) << 64) | id_


class Group:
    """A group's ready messages as (priority, id) pairs (a `PairList`: ~16 bytes a
    message), its count in flight, and whether it is in the rotation."""

    __slots__ = ("name", "ready", "inflight", "active")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = PairList()
        self.inflight = 0
        self.active = False


class FairIndex:
    __slots__ = ("groups", "active", "limit", "cursor", "n_ready", "credit", "policy")

    def __init__(self, limit: int = 0, cursor: str = "", credit: int = 0,
                 policy: GroupPolicies | None = None) -> None:
        self.groups: dict[str, Group] = {}
        self.active: SortedList = SortedList()
        self.limit = limit
        self.cursor = cursor
        self.n_ready = 0
        self.credit = credit
        self.policy = policy if policy is not None else GroupPolicies()

    def has_ready(self) -> bool:
        return bool(self.active)

    def group_name(self, group: str) -> str:
        """The interned name object of an existing group (saves memory per message)."""
        g = self.groups.get(group)
        return g.name if g is not None else group

    def _group(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = Group(name)
        return g

    def _refresh(self, g: Group) -> None:
        want = (bool(g.ready) and (self.limit == 0 or g.inflight < self.limit)
                and not self.policy.is_throttled(g.name))
        if want != g.active:
            g.active = want
            if want:
                self.active.add(g.name)
            else:
                self.active.remove(g.name)
        if not g.ready and g.inflight == 0:
            del self.groups[g.name]

    def add_many(self, keys: list[int], group: str) -> None:
        """`add(k, group)` for every key (ascending; one group)."""
        if not keys:
            return
        self.add_pairs([(k >> 64) - _OFF for k in keys], [k & _MASK64 for k in keys], group)

    def add_pairs(self, priorities: Sequence[int], ids: Sequence[int], group: str) -> None:
        """Add the (priority, id) pairs of one group, in any order (ids distinct, none held)."""
        if not ids:
            return
        g = self._group(group)
        g.ready.add_many(priorities, ids)
        self.n_ready += len(ids)
        self._refresh(g)

    def add(self, key: int, group: str) -> None:
        g = self._group(group)
        g.ready.add(*_pair(key))
        self.n_ready += 1
        self._refresh(g)

    def remove(self, key: int, group: str) -> None:
        g = self.groups[group]
        g.ready.remove(*_pair(key))
        self.n_ready -= 1
        self._refresh(g)

    def pop(self, lease: bool, now_ms: int = 0) -> tuple[int, str] | None:
        """Serve the cursor's group if its turn goes on, else the next group in the
        rotation; `lease` counts the message as in flight; a rate-limited group spends a
        token at `now_ms` (replicated time)."""
        act = self.active
        if not act:
            return None
        g = self.groups.get(self.cursor) if self.credit > 0 else None
        if g is not None and g.active:
            self.credit -= 1
        else:
            i = act.bisect_right(self.cursor)
            if i == len(act):
                i = 0
            g = self.groups[act[i]]
            self.cursor = g.name
            self.credit = self.policy.weight(g.name) - 1
        (p,), (i,) = g.ready.pop_front(1)
        key = _key(p, i)
        self.n_ready -= 1
        if lease:
            g.inflight += 1
        self.policy.take(g.name, now_ms)
        self._refresh(g)
        return key, g.name

    def pop_many(self, n: int, lease: bool, now_ms: int = 0) -> list[int]:
        """The keys of up to `n` `pop(lease, now_ms)` calls, in order."""
        pol = self.policy
        if (self.credit <= 0 and pol.default_weight == 1 and pol.default_rate <= 0 and not pol.overrides
                and not pol.throttled):
            return self._pop_rounds(n, lease)
        out: list[int] = []
        while len(out) < n and (picked := self.pop(lease, now_ms)) is not None:
            out.append(picked[0])
        return out

    def _pop_rounds(self, n: int, lease: bool) -> list[int]:
        """`pop_many` when every turn is one delivery and no group has a rate (the
        default): rounds over the active groups from the cursor on, in name order. No
        group joins the rotation meanwhile, so the next active group after the cursor is
        the next of a round's snapshot still active: the same pops as `pop`, one at a
        time, without a search of the rotation per pop."""
        out: list[int] = []
        act, groups, limit = self.active, self.groups, self.limit
        cursor = self.cursor
        while len(out) < n and act:
            start = act.bisect_right(cursor)
            want = n - len(out)  # the round's next `want` names from the cursor on, not all of them
            names = list(act.islice(start, start + want))
            if len(names) < want:
                names += act.islice(0, min(start, want - len(names)))
            if not names:
                break
            gs = list(map(groups.__getitem__, names))
            ps, ids = PairList.pop_firsts(list(map(_ready, gs)))  # one pair of each, in C-driven steps
            out.extend(map(or_, map(lshift, map(add, ps, repeat(_OFF)), repeat(64)), ids))
            cursor = names[-1]
            for g in gs:
                if lease:
                    g.inflight += 1
                if not g.ready or (limit and g.inflight >= limit):
                    self._refresh(g)
        self.n_ready -= len(out)
        self.cursor = cursor
        if out:
            self.credit = 0  # weight 1 - 1: each turn ends with its delivery
        return out

    def preview(self, n: int, now_ms: int) -> list[int]:
        """The keys the next `n` pops at `now_ms` would take (with leases, which the
        per-group limit counts), computed without changing the index."""
        limit, policy = self.limit, self.policy
        room: dict[str, int] = {}
        for name in self.active:
            g = self.groups[name]
            r = len(g.ready) if limit == 0 else min(len(g.ready), limit - g.inflight)
            allowed = policy.allowance(name, now_ms)
            room[name] = r if allowed is None else min(r, allowed)
        live = SortedList(name for name, r in room.items() if r > 0)
        taken: dict[str, int] = {}
        cursor, credit = self.cursor, self.credit
        out: list[int] = []
        while live and len(out) < n:
            if credit > 0 and cursor in room and room[cursor] > 0:
                credit -= 1
            else:
                i = live.bisect_right(cursor)
                cursor = live[i if i < len(live) else 0]
                credit = policy.weight(cursor) - 1
            i = taken.get(cursor, 0)
            out.append(_key(*self.groups[cursor].ready.islice(i, i + 1)[0]))
            taken[cursor] = i + 1
            room[cursor] -= 1
            if not room[cursor]:
                live.remove(cursor)
                credit = 0
        return out

    def refresh_groups(self, names: list[str]) -> None:
        """Re-evaluate the named groups (their throttling or weight changed)."""
        for name in names:
            g = self.groups.get(name)
            if g is not None:
                self._refresh(g)

    def unleased(self, group: str) -> None:
        g = self.groups[group]
        g.inflight -= 1
        if self.limit or not g.ready:  # else neither its place in the rotation nor its entry can change
            self._refresh(g)

    def unleased_many(self, names: Sequence[str]) -> None:
        """`unleased(name)` for each of `names`, in one call."""
        groups, refresh = self.groups, self._refresh
        limit = self.limit
        for name in names:
            g = groups[name]
            g.inflight -= 1
            if limit or not g.ready:
                refresh(g)

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        for name in sorted(self.groups):
            self._refresh(self.groups[name])

    def load_groups(self, pairs: Mapping[str, tuple[Sequence[int], Sequence[int]]],
                    inflight: Mapping[str, int]) -> None:
        """Load the groups' ready (priorities, ids) columns (any order; ids distinct) and
        their counts in flight, then the rotation."""
        for name, (ps, ids) in pairs.items():
            g = self._group(name)
            if all(map(le, ps, islice(ps, 1, None))) and all(map(lt, ids, islice(ids, 1, None))):
                g.ready = PairList.from_sorted(ps, ids)
            else:
                g.ready = PairList.from_unsorted(ps, ids)
            self.n_ready += len(ids)
        for name, n in inflight.items():
            self._group(name).inflight += n
        active = []
        throttled = self.policy.is_throttled
        for name in sorted(self.groups):
            g = self.groups[name]
            g.active = bool(g.ready) and (self.limit == 0 or g.inflight < self.limit) and not throttled(name)
            if g.active:
                active.append(name)
        self.active = SortedList(active)

    def clear(self) -> None:
        """Drop every message (a purge); the groups' policies stay, the turn ends."""
        self.groups.clear()
        self.active = SortedList()
        self.n_ready = 0
