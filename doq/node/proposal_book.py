"""`ProposalBook`: the entries a node proposed as leader, waiting for their fate.

Every future a proposal in the log carries ends exactly once, whatever happens:

- its entry is applied **with the term it was proposed in**: the machine's results
  (`resolve_committed`; a conf change: None), the dequeues' first (`resolve_results`);
- another entry is applied at its index (another leader's won), or a newer proposal of
  this node takes its index: `NotLeader` (+ hint), never applied;
- its fate cannot be known here (a snapshot replaced the log around it, the node stops,
  or stays a follower too long after a step-down): `OutcomeUnknown` (`fail_upto`).

Used on the node's event loop only; the writer thread may read `by_index` during a write
(the loop changes it only between two writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from doq.errors import NotLeader, OutcomeUnknown
from doq.node.base import resolve_results
from doq.node.proposals import Proposal, fail_future, resolve_future
from doq.queues.commands import Command
from doq.raft.types import Entry

NOT_APPLIED = "leadership changed before the proposal committed; it was not applied"


class ProposalBook:
    """The proposals of one node by log index (see the module doc)."""

    def __init__(self) -> None:
        self.by_index: dict[int, Proposal] = {}

    def __bool__(self) -> bool:
        return bool(self.by_index)

    def add(self, index: int, prop: Proposal, leader_hint: str) -> None:
        """Wait for the entry at `index` (this node just appended it as leader). A proposal
        of an earlier term still waiting there lost its entry (this leader's log, which
        holds every committed entry, has another one at that index): never applied."""
        old = self.by_index.get(index)
        if old is not None:
            err = NotLeader(NOT_APPLIED, leader_hint=leader_hint)
            for fut in old.futs:
                fail_future(fut, err)
        self.by_index[index] = prop

    def resolve_committed(self, committed: Sequence[Entry], results: Sequence[list[object]],
                          leader_hint: str) -> None:
        """Give the proposals these applied entries carried their results (`results[i]`:
        the machine's results of `committed[i]`, one per command)."""
        props = self.by_index
        if not props:
            return
        done: list[tuple[Command, asyncio.Future[object], object]] = []
        for e, res in zip(committed, results, strict=False):
            p = props.pop(e.index, None)
            if p is None:
                continue
            if e.term != p.term:
                err = NotLeader(NOT_APPLIED, leader_hint=leader_hint)
                for fut in p.futs:
                    fail_future(fut, err)
            elif p.conf:
                for fut in p.futs:
                    resolve_future(fut, None)
            else:
                assert p.batch is not None  # every command proposal keeps its batch
                done.extend(zip(p.batch.commands, p.futs, res, strict=True))
        resolve_results(done)

    def fail_upto(self, index: int | None, why: str, leader_hint: str) -> None:
        """Fail the proposals at indexes <= index (all if None): their entries' fate is
        not known here (`OutcomeUnknown`, with `why`)."""
        err = OutcomeUnknown(why, leader_hint=leader_hint)
        for i in [i for i in self.by_index if index is None or i <= index]:
            for fut in self.by_index.pop(i).futs:
                fail_future(fut, err)
