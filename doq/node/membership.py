"""`Membership`: a Raft node's membership and leadership changes (`ClusterAdmin`'s mutations).

An orchestration over four primitives of the node driver (`MembershipDriver`): check that
this node serves, run a closure on the core between two Readies, wait for a proposal's
entry, wait for the leader to change. Every change is one conf change at a time, committed
by the current configuration (`RaftCore.propose_conf_change`), resolved once its entry is
applied to the core (after the write that applied it), or failed:

- `NotLeader` (+ hint) on a follower; `Unavailable` CONF_CHANGE_PENDING while another
  change is not applied, CONF_CHANGE_TIMEOUT after `admin_timeout_ms`;
- `FailedPrecondition` for what the cluster refuses (CLUSTER_MISMATCH, MEMBER_EXISTS,
  LAST_VOTER, NO_TRANSFER_TARGET, NOT_A_VOTER, TRANSFER_REFUSED, and ADDRESS_IN_USE for
  an address another member has); `NotFound` for an unknown member; `InvalidArgument` for
  a malformed id or address (`doq.node.member_input`).

A new member joins as a learner; `promote_caught_up_learner` (called by the driver on
ticks, on the leader) makes it a voter once its log reached the commit index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from doq.errors import FailedPrecondition, NotFound, NotLeader, Unavailable
from doq.node import member_input
from doq.node.cluster import ClusterStatus, MemberAddrs
from doq.node.proposals import Proposal, fail_future, resolve_future
from doq.node.raft_meta import encode_addrs
from doq.node.wal_log import WalLogStorage
from doq.raft.core import RaftCore
from doq.raft.types import ConfChange, ConfChangeType, ProposalDropped
from doq.raft.types import NotLeader as CoreNotLeader
from doq.storage.state import StateStore

log = logging.getLogger(__name__)


class MembershipDriver(Protocol):
    """What membership changes use of the node driver (`doq.node.raft_node.RaftNode`)."""

    node_id: str
    core: RaftCore | None
    state: StateStore
    storage: WalLogStorage

    @property
    def leader_hint(self) -> str: ...

    def check_serving(self) -> None:
        """Raise unless this node is the serving leader (`Unavailable` while stopping,
        `NotLeader` + hint on a follower or a removed node)."""
        ...

    def run_on_core(self, request: Callable[[RaftCore], None]) -> None:
        """Run `request(core)` on the event loop between two Readies (soon: it wakes the loop)."""
        ...

    def add_proposal(self, index: int, prop: Proposal) -> None:
        """Resolve `prop`'s futures with the fate of the entry just proposed at `index`."""
        ...

    async def wait_leader_change(self, timeout_s: float) -> None:
        """Return when the leader this node knows of changes, or after `timeout_s`."""
        ...

    def cluster_status(self) -> ClusterStatus: ...


class Membership:
    """Membership and leadership changes of one node (see the module doc); the node's
    `ClusterAdmin` methods call these."""

    def __init__(self, driver: MembershipDriver, *, admin_timeout_ms: int) -> None:
        self.driver = driver
        self.admin_timeout_ms = admin_timeout_ms

    def _core(self) -> RaftCore:
        self.driver.check_serving()
        core = self.driver.core
        assert core is not None  # serving: started
        return core

    async def add_member(self, node_id: str, addrs: MemberAddrs, *, empty: bool = False,
                         cluster_id: str = "") -> ClusterStatus:
        """See `ClusterAdmin.add_member`. The replacement of a member that came back with a
        new (or an empty) store is two conf changes, each committed by the current
        configuration: removing it (its stale progress goes with it; refused by Raft
        itself, not committed, while the other voters are no quorum), then adding it as
        a learner under its new store; `promote_caught_up_learner` makes it a voter once
        caught up."""
        d = self.driver
        core = self._core()
        if cluster_id and cluster_id != d.state.cluster_id:
            raise FailedPrecondition(
                f"this is cluster {d.state.cluster_id or '(no id)'}, not {cluster_id}: refused",
                reason="CLUSTER_MISMATCH")
        member_input.check_node_id(node_id)  # 400 for a malformed id or address
        member_input.check_member_addrs(addrs)
        if node_id in core.voters or node_id in core.learners:
            known = d.storage.members.get(node_id)
            new_store = bool(addrs.store_id) and (known is None or known.store_id != addrs.store_id)
            if new_store or (empty and node_id in core.voters):
                await self._replace_member(node_id, addrs, known)
                return d.cluster_status()
            if known is not None and known == addrs:  # the addresses (not the store)
                return d.cluster_status()
            raise FailedPrecondition(
                f"{node_id} is already a member with other addresses; remove it first",
                reason="MEMBER_EXISTS")
        members = {nid: d.storage.members.get(nid) or MemberAddrs("", "", "")
                   for nid in (*core.voters, *core.learners)}
        member_input.check_new_member(node_id, addrs, members)  # 409 for an address in use
        await self.conf_change(ConfChange(ConfChangeType.ADD_LEARNER, node_id, encode_addrs(addrs)))
        return d.cluster_status()

    async def _replace_member(self, node_id: str, addrs: MemberAddrs, known: MemberAddrs | None) -> None:
        if node_id == self.driver.node_id:
            raise FailedPrecondition("the leader cannot replace itself", reason="MEMBER_EXISTS")
        log.warning("member %s came back with %s store %s (admitted with %s): replacing it "
                    "(remove, then add as a learner with fresh progress)", node_id,
                    "a new" if addrs.store_id else "an empty", addrs.store_id or "-",
                    (known.store_id if known else "") or "-")
        await self.conf_change(ConfChange(ConfChangeType.REMOVE_NODE, node_id))
        await self.conf_change(ConfChange(ConfChangeType.ADD_LEARNER, node_id, encode_addrs(addrs)))

    async def remove_member(self, node_id: str) -> None:
        """Remove a voter or learner (`NotFound` if it is neither; never the last voter)."""
        core = self._core()
        if node_id not in core.voters and node_id not in core.learners:
            raise NotFound(f"{node_id!r} is not a member of the cluster", reason="NOT_FOUND")
        if core.voters == (node_id,):
            raise FailedPrecondition(f"{node_id!r} is the last voter: a cluster needs one (add another "
                                     "member first)", reason="LAST_VOTER")
        await self.conf_change(ConfChange(ConfChangeType.REMOVE_NODE, node_id))

    async def transfer_leader(self, target_id: str | None = None) -> str:
        """See `ClusterAdmin.transfer_leader`: returns once `target_id` leads (as this
        node knows), `Unavailable` TRANSFER_TIMEOUT after `admin_timeout_ms`."""
        d = self.driver
        core = self._core()
        if target_id is None:
            target_id = self._best_transferee(core)
            if target_id is None:
                raise FailedPrecondition("no other voter to transfer leadership to",
                                         reason="NO_TRANSFER_TARGET")
        if target_id == d.node_id:
            return d.node_id
        if target_id not in core.voters:
            raise FailedPrecondition(f"{target_id} is not a voter", reason="NOT_A_VOTER")
        target = target_id
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def request(core: RaftCore) -> None:
            try:
                core.transfer_leadership(target)
                resolve_future(done, None)
            except CoreNotLeader as e:
                fail_future(done, NotLeader("not the leader", leader_hint=e.leader_hint or ""))
            except ProposalDropped as e:
                fail_future(done, FailedPrecondition(str(e), reason="TRANSFER_REFUSED"))

        d.run_on_core(request)
        await done
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.admin_timeout_ms / 1000
        while d.leader_hint != target:
            left = deadline - loop.time()
            if left <= 0:
                raise Unavailable(f"leadership did not move to {target} in time",
                                  reason="TRANSFER_TIMEOUT")
            await d.wait_leader_change(left)
        return target

    def _best_transferee(self, core: RaftCore) -> str | None:
        """The most up-to-date other voter that was heard from recently (then the highest
        match index; ties by id). None without another voter."""
        best: tuple[bool, int, str] | None = None
        for nid in core.voters:
            pr = core.prs.get(nid)
            if nid == self.driver.node_id or pr is None:
                continue
            key = (pr.recent_active, pr.match, nid)
            if best is None or key[:2] > best[:2]:
                best = key
        return best[2] if best else None

    async def conf_change(self, cc: ConfChange) -> None:
        """Propose `cc` and wait until it is applied (see the module doc for the errors)."""
        d = self.driver
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def request(core: RaftCore) -> None:
            try:
                index = core.propose_conf_change(cc)
                d.add_proposal(index, Proposal(core.term, [fut], conf=True))
            except CoreNotLeader as e:
                fail_future(fut, NotLeader("not the leader", leader_hint=e.leader_hint or ""))
            except ProposalDropped as e:
                fail_future(fut, Unavailable(f"membership change refused for now: {e}",
                                             reason="CONF_CHANGE_PENDING"))

        d.run_on_core(request)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.admin_timeout_ms / 1000)
        except TimeoutError:
            raise Unavailable("membership change not applied in time",
                              reason="CONF_CHANGE_TIMEOUT") from None


def promote_caught_up_learner(core: RaftCore, members: dict[str, MemberAddrs]) -> None:
    """Leader, between two Readies: propose making the first learner whose match index
    reached the commit index a voter (one change at a time: not while a conf change is
    unapplied). `members`: the replicated addresses (carried by the conf change)."""
    if not core.learners or core.pending_conf_index > core.log.applied:
        return
    for nid in core.learners:
        pr = core.prs.get(nid)
        if pr is not None and pr.match >= core.log.committed:
            addrs = members.get(nid)
            ctx = encode_addrs(addrs) if addrs else b""
            try:
                core.propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, nid, ctx))
                log.info("promoting learner %s to voter", nid)
            except (ProposalDropped, CoreNotLeader):
                pass
            return
