"""Ready index of a fair queue: round-robin across groups, priority then FIFO inside one.

Rotation is a function of replicated state only: groups are ordered by name, and the next
turn goes to the first *active* group whose name sorts after `cursor` (the group served
last), wrapping around. A group is active when it has a ready message and is below the
queue's `max_unacked_per_group` (0 = no limit). The cursor is persisted with the queue, so
a rebuilt replica continues the same rotation.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from doq.queues.sortedext import extend_sorted


class Group:
    __slots__ = ("name", "ready", "inflight", "active")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: SortedList = SortedList()
        self.inflight = 0
        self.active = False


class FairIndex:
    __slots__ = ("groups", "active", "limit", "cursor", "n_ready")

    def __init__(self, limit: int = 0, cursor: str = "") -> None:
        self.groups: dict[str, Group] = {}
        self.active: SortedList = SortedList()
        self.limit = limit
        self.cursor = cursor
        self.n_ready = 0

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
        want = bool(g.ready) and (self.limit == 0 or g.inflight < self.limit)
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
        g = self._group(group)
        extend_sorted(g.ready, keys)
        self.n_ready += len(keys)
        self._refresh(g)

    def add(self, key: int, group: str) -> None:
        g = self._group(group)
        g.ready.add(key)
        self.n_ready += 1
        self._refresh(g)

    def remove(self, key: int, group: str) -> None:
        g = self.groups[group]
        g.ready.remove(key)
        self.n_ready -= 1
        self._refresh(g)

    def pop(self, lease: bool) -> tuple[int, str] | None:
        """Serve the next group in the rotation; `lease` counts the message as in flight."""
        act = self.active
        if not act:
            return None
        i = act.bisect_right(self.cursor)
        if i == len(act):
            i = 0
        g = self.groups[act[i]]
        key = g.ready.pop(0)
        self.n_ready -= 1
        self.cursor = g.name
        if lease:
            g.inflight += 1
        self._refresh(g)
        return key, g.name

    def pop_many(self, n: int, lease: bool) -> list[int]:
        """The keys of up to `n` `pop(lease)` calls, in order."""
        out: list[int] = []
        while len(out) < n and (picked := self.pop(lease)) is not None:
            out.append(picked[0])
        return out

    def unleased(self, group: str) -> None:
        g = self.groups[group]
        g.inflight -= 1
        self._refresh(g)

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        for name in sorted(self.groups):
            self._refresh(self.groups[name])

    def bulk_load(self, keys: dict[str, list[int]], inflight: dict[str, int]) -> None:
        for name, ks in keys.items():
            g = self._group(name)
            g.ready = SortedList(ks)
            self.n_ready += len(ks)
        for name, n in inflight.items():
            self._group(name).inflight += n
        active = []
        for name in sorted(self.groups):
            g = self.groups[name]
            g.active = bool(g.ready) and (self.limit == 0 or g.inflight < self.limit)
            if g.active:
                active.append(name)
        self.active = SortedList(active)

    def clear(self) -> None:
        self.groups.clear()
        self.active = SortedList()
        self.n_ready = 0
