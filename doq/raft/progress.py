"""The leader's view of each follower: replication progress and flow control."""

from __future__ import annotations

from collections import deque
from enum import IntEnum


class ProgressState(IntEnum):
    PROBE = 0
    """Send one MsgApp at a time until the follower's match index is found."""
    REPLICATE = 1
    """Stream MsgApps optimistically within the in-flight window."""
    SNAPSHOT = 2
    """A snapshot is on its way; send nothing else until it is acknowledged."""


class Inflights:
    """Last indexes of MsgApps sent but not acknowledged, bounded by ``capacity``."""

    __slots__ = ("capacity", "_q")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._q: deque[int] = deque()

    def add(self, last_index: int) -> None:
        self._q.append(last_index)

    def free_le(self, index: int) -> None:
        q = self._q
        while q and q[0] <= index:
            q.popleft()

    def free_first_one(self) -> None:
        if self._q:
            self._q.popleft()

    def full(self) -> bool:
        return len(self._q) >= self.capacity

    def reset(self) -> None:
        self._q.clear()

    def __len__(self) -> int:
        return len(self._q)


class Progress:
    """Replication state of one peer: ``match`` (known replicated) and ``next`` (to send)."""

    __slots__ = (
        "match",
        "next",
        "state",
        "probe_sent",
        "pending_snapshot",
        "snapshot_ticks",
        "recent_active",
        "inflights",
        "is_learner",
    )

    def __init__(self, next_index: int, max_inflight: int, is_learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        self.recent_active = False
        self.inflights = Inflights(max_inflight)
        self.is_learner = is_learner

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def snapshot_failed(self) -> None:
        """The snapshot did not arrive: probe again from ``match + 1``."""
        self.pending_snapshot = 0
        self.become_probe()

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = index

    def maybe_update(self, n: int) -> bool:
        """The follower acknowledged up to ``n``; True if that is news."""
        updated = False
        if self.match < n:
            self.match = n
            updated = True
            self.probe_sent = False
        self.next = max(self.next, n + 1)
        return updated

    def optimistic_update(self, n: int) -> None:
        self.next = n + 1

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """The follower rejected a MsgApp whose previous index was ``rejected``; move
        ``next`` back (to just after the hint). False if the rejection is stale."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1, 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.probe_sent
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True


def quorum_index(matches: list[int]) -> int:
    """The largest index replicated on a majority, given each voter's match index."""
    if not matches:
        return 0
    s = sorted(matches, reverse=True)
    return s[len(s) // 2]


def has_quorum(voters: tuple[str, ...], yes: set[str]) -> bool:
    return sum(1 for v in voters if v in yes) * 2 > len(voters)


def vote_result(voters: tuple[str, ...], votes: dict[str, bool]) -> bool | None:
    """True if won, False if lost, None while undecided."""
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    q = len(voters) // 2 + 1
    if granted >= q:
        return True
    if rejected >= q or len(voters) - rejected < q:
        return False
    return None
