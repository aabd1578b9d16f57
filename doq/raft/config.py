"""Configuration of one :class:`~doq.raft.core.RaftCore`."""

from __future__ import annotations

from dataclasses import dataclass, field

KNOWN_BUGS = frozenset({"commit-old-term", "no-persist-vote", "skip-prev-check"})
"""Deliberate bugs the simulator must catch; only ever enabled by tests and `tools.sim`."""


@dataclass(slots=True, frozen=True)
class RaftConfig:
    """Tunables of a Raft node. Ticks are abstract; the driver decides their period.

    - ``election_tick``: a follower campaigns after a random timeout in
      ``[election_tick, 2*election_tick)`` ticks without hearing from a leader;
      with ``check_quorum`` a leader steps down after ``election_tick`` ticks
      without hearing from a quorum.
    - ``heartbeat_tick``: the leader sends heartbeats every this many ticks.
    - ``max_inflight_msgs``: bound of the pipelined MsgApp window per follower.
    - ``max_entries_per_msg`` / ``max_msg_bytes``: batching limits of one MsgApp.
    - ``max_committed_bytes``: soft limit on committed entries handed out per Ready.
    - ``snapshot_chunk_bytes``: snapshots are sent to followers in chunks of this size.
    - ``broadcast_commit``: when the leader's commit index advances, send every follower
      an append at once (empty if it has every entry) so it learns the new commit index
      (etcd-raft's behaviour). ``False``: the commit index rides the next append or
      heartbeat (Raft paper §5.3: "it includes that index in future AppendEntries RPCs
      (including heartbeats)"), so a follower learns it at most one heartbeat later and
      applies it in the Ready that persists its next entries: one message each way and
      one Ready per follower fewer per commit. The commit of a conf change is sent at
      once all the same (membership takes effect when applied).
    - ``applied``: at a restart, the index the application's state already holds (etcd's
      ``Config.Applied``): the committed entries up to it are not handed out again. It
      must be at most the hard state's commit index, and the storage's
      ``initial_state()`` must give the membership as of it (the snapshot's conf state
      with every conf change up to ``applied`` applied: ``ConfState.changed``). 0: the
      entries after the storage's first index are handed out again.
    - ``bugs``: names from :data:`KNOWN_BUGS`; empty in production.
    """

    id: str
    election_tick: int = 10
    heartbeat_tick: int = 1
    max_inflight_msgs: int = 256
    max_entries_per_msg: int = 512
    max_msg_bytes: int = 1 << 20
    max_committed_bytes: int = 4 << 20
    snapshot_chunk_bytes: int = 1 << 20
    pre_vote: bool = True
    check_quorum: bool = True
    broadcast_commit: bool = True
    applied: int = 0
    bugs: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("node id must be non-empty")
        if self.heartbeat_tick <= 0 or self.election_tick <= self.heartbeat_tick:
            raise ValueError("need 0 < heartbeat_tick < election_tick")
        if self.max_inflight_msgs <= 0 or self.max_entries_per_msg <= 0:
            raise ValueError("max_inflight_msgs and max_entries_per_msg must be positive")
        if self.snapshot_chunk_bytes <= 0:
            raise ValueError("snapshot_chunk_bytes must be positive")
        if self.applied < 0:
            raise ValueError("applied must be >= 0")
        unknown = self.bugs - KNOWN_BUGS
        if unknown:
            raise ValueError(f"unknown bugs: {sorted(unknown)}")
