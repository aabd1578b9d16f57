"""Membership changes under the lazy commit (`RaftConfig.broadcast_commit=False`), pure core.

A conf change takes effect on a node when it applies it, and a follower applies what it
knows committed; with the lazy commit a follower learns a commit with the leader's next
append or heartbeat. Two consequences the core must cover (docs/raft.md, "Membership
changes under the lazy commit"):

- a transfer target whose promotion it has not applied ignores TimeoutNow (it is no
  voter yet): the leader sends TimeoutNow again with each heartbeat answer of the
  caught-up target, until the transfer ends;
- the commit of a conf change is sent to every follower at once (as etcd does for every
  commit), so the survivors of a leader that dies right after it can elect a leader in
  the new configuration.
"""

from __future__ import annotations

from doq.raft import ConfChange, ConfChangeType, MessageType, Role
from tools.sim.harness import Cluster

MT = MessageType


def _promote(c: Cluster, nid: str) -> int:
    """Propose `nid`'s promotion on the leader a; returns the entry's index."""
    idx = c.core("a").propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, nid))
    c.stabilize()
    return idx


def test_a_transfer_target_that_has_not_applied_its_promotion_gets_timeout_now_again() -> None:
    c = Cluster(("a", "b", "c"), broadcast_commit=False)
    c.elect("a")
    c.add_learner("a", "d")
    c.tick(2)
    # the append that would tell d the promotion's commit (no entries) is lost
    c.filters.append(lambda m: not (m.type == MT.APP and m.to == "d" and not m.entries))
    idx = _promote(c, "d")  # b's, c's and d's acknowledgements: d acked all a holds
    c.heal()
    a = c.core("a")
    assert a.log.applied >= idx and "d" in a.voters and a.prs["d"].match == a.log.last_index()
    d = c.core("d")  # the append of the entry carried the commit index from before it
    assert d.log.committed < idx and "d" not in d.voters
    c.delivered.clear()
    a.transfer_leadership("d")
    c.stabilize()
    assert [m.to for m in c.delivered if m.type == MT.TIMEOUT_NOW] == ["d"]
    assert c.core("d").role == Role.FOLLOWER  # ignored: no voter yet
    c.tick(3, nodes=["a"])  # heartbeats: d learns the commit, applies it, answers
    assert c.leader() == "d"
    assert [m.to for m in c.delivered if m.type == MT.TIMEOUT_NOW] == ["d", "d"]
    c.propose("d", b"after")
    assert c.checker.violations == []


def test_the_survivors_elect_a_leader_when_it_dies_right_after_a_promotion_commits() -> None:
    """Voters a, b; learner c, promoted. The promotion commits with b's acknowledgement
    while a's link to c is down; a dies at once. b and c are a quorum of the new
    configuration only if b has applied it."""
    c = Cluster(("a", "b"), broadcast_commit=False)
    c.elect("a")
    c.add_learner("a", "c")
    c.tick(2)
    c.blocked.add(("a", "c"))
    idx = _promote(c, "c")
    assert c.core("a").log.applied >= idx
    assert "c" not in c.core("c").voters  # c never got the entry
    c.crash("a")
    c.heal()
    c.tick(100)
    lead = c.leader()
    assert lead in ("b", "c")
    c.propose(lead, b"after")
    assert all(c.core(n).voters == ("a", "b", "c") for n in "bc")
    assert c.checker.violations == []
