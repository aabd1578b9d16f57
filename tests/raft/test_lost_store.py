"""A voter that comes back with an empty store (its disk was lost), in the pure core.

Real `RaftCore`s in the deterministic simulator (`tools.sim.harness.Cluster`, with its
invariant checker); the "wipe" replaces a node's storage by an empty one. The rule under
test: the driver disables voting (`RaftCore.allow_voting(False)`) on such a node until it
is re-admitted; then it can neither elect a leader that lacks acknowledged entries nor
crash on the leader's heartbeats (docs/raft.md, "A member that lost its disk")."""

from __future__ import annotations

from doq.raft import Message, MessageType, RaftCore, Role
from doq.raft.storage import MemoryStorage
from tools.sim.harness import Cluster

MT = MessageType


def _commit_on_a_and_c_only(c: Cluster) -> int:
    """a leads a, b, c; then an entry commits with c's acknowledgement while b hears
    nothing of it. Returns its index."""
    c.elect("a")
    c.partition(["a", "c"], ["b"])
    index = c.propose("a", b"acknowledged")
    assert c.core("a").log.committed >= index  # a + c: a quorum of three
    assert c.nodes["b"].storage.last_index() < index
    return index


def _wipe(c: Cluster, nid: str, *, voting: bool) -> RaftCore:
    """`nid` restarts with an empty store (same id); voting as the driver decided."""
    node = c.add_node(nid, MemoryStorage())
    assert node.core is not None
    node.core.allow_voting(voting)
    return node.core


def test_a_wiped_voter_that_may_not_vote_cannot_elect_a_leader_lacking_acknowledged_entries() -> None:
    c = Cluster(("a", "b", "c"), check_quorum=True)
    _commit_on_a_and_c_only(c)
    _wipe(c, "c", voting=False)
    c.crash("a")
    c.heal()
    c.tick(100, ["b", "c"])
    assert c.core("b").role != Role.LEADER  # b lacks the entry: only a's return can help
    assert c.core("c").role != Role.LEADER
    c.restart("a")
    c.tick(100)
    leader = c.leader()
    assert leader == "a"  # the only voter holding every acknowledged entry
    assert b"acknowledged" in c.log_data("b")
    assert c.checker.violations == []


def test_without_the_rule_the_wiped_voter_elects_a_leader_that_lost_an_acknowledged_entry() -> None:
    # why the rule exists: the same run with voting allowed breaks leader completeness
    c = Cluster(("a", "b", "c"), check_quorum=True)
    _commit_on_a_and_c_only(c)
    _wipe(c, "c", voting=True)
    c.crash("a")
    c.heal()
    c.tick(100, ["b", "c"])
    assert c.core("b").role == Role.LEADER
    assert any("completeness" in v for v in c.checker.violations), c.checker.violations


def test_a_node_that_may_not_vote_refuses_votes_and_pre_votes_and_never_campaigns() -> None:
    c = Cluster(("a", "b", "c"), pre_vote=False)
    core = c.core("b")
    core.allow_voting(False)
    core.step(Message(MT.VOTE, to="b", frm="a", term=5, index=9, log_term=4))
    core.step(Message(MT.PRE_VOTE, to="b", frm="c", term=6, index=9, log_term=4))
    rd = core.ready()
    assert [(m.type, m.reject) for m in rd.messages] == [(MT.VOTE_RESP, True), (MT.PRE_VOTE_RESP, True)]
    assert core.vote == ""
    core.advance(rd)
    core.campaign()
    core.step(Message(MT.TIMEOUT_NOW, to="b", frm="a", term=core.term))
    for _ in range(100):
        core.tick()
    assert core.role == Role.FOLLOWER
    core.allow_voting(True)
    core.campaign()
    assert core.role == Role.CANDIDATE


def test_a_heartbeat_committing_past_the_log_commits_nothing_instead_of_failing() -> None:
    # the leader's match for a node that lost its log is stale: its heartbeat's commit
    # (min(match, committed)) lies past the empty log
    c = Cluster(("a", "b", "c"))
    c.elect("a")
    for i in range(5):
        c.propose("a", b"x%d" % i)
    core = _wipe(c, "c", voting=False)
    core.step(Message(MT.HEARTBEAT, to="c", frm="a", term=c.core("a").term, commit=7))
    assert core.log.committed == 0
    rd = core.ready()
    assert [(m.type, m.to) for m in rd.messages] == [(MT.HEARTBEAT_RESP, "a")]
