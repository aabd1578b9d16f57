"""The peer door's rules (doq/node/peer_door.py), pure: what may reach a node's core."""

from __future__ import annotations

from doq.node.peer_door import Refusal, admit, cluster_matches
from doq.raft.types import Message, MessageType


def app(frm: str, to: str = "n1", term: int = 9) -> Message:
    return Message(type=MessageType.APP, to=to, frm=frm, term=term)


MEMBERS = frozenset({"n1", "n2", "n3"})


def test_a_frame_of_another_cluster_is_refused_whole_whatever_the_term() -> None:
    ok, refused = admit("n1", ("c1",), MEMBERS, "n2", ("c2",), [app("n2", term=10**6), app("n2")])
    assert ok == [] and [r for _, r in refused] == [Refusal.CLUSTER, Refusal.CLUSTER]


def test_a_frame_without_cluster_ids_is_refused_by_a_node_that_has_one() -> None:
    ok, refused = admit("n1", ("c1",), MEMBERS, "n2", (), [app("n2")])
    assert ok == [] and refused[0][1] == Refusal.CLUSTER


def test_a_made_up_sender_with_the_right_cluster_id_is_refused() -> None:
    ok, refused = admit("n1", ("c1",), MEMBERS, "mallory", ("c1",), [app("mallory", term=99)])
    assert ok == [] and refused[0][1] == Refusal.NOT_MEMBER


def test_a_message_whose_sender_is_not_the_streams_is_refused() -> None:
    ok, refused = admit("n1", ("c1",), MEMBERS, "mallory", ("c1",), [app("n2")])
    assert ok == [] and refused[0][1] == Refusal.SENDER_MISMATCH


def test_a_message_for_another_node_is_refused() -> None:
    ok, refused = admit("n1", ("c1",), MEMBERS, "n2", ("c1",), [app("n2", to="n3")])
    assert ok == [] and refused[0][1] == Refusal.WRONG_RECEIVER


def test_members_of_the_cluster_pass_in_order() -> None:
    msgs = [app("n2", term=t) for t in (3, 4, 5)]
    ok, refused = admit("n1", ("c1",), MEMBERS, "n2", ("c1",), msgs)
    assert ok == msgs and refused == []


def test_any_of_the_frames_ids_may_match_any_of_the_nodes() -> None:
    # a node that applied an online restore answers to its old id; a peer that has not yet
    # applied it still sends the old one, and the restored one sends both
    assert cluster_matches(("new", "old"), ("old",))
    assert cluster_matches(("old",), ("new", "old"))
    assert not cluster_matches(("new", "old"), ("other",))


def test_a_joiner_without_configuration_takes_any_sender_of_its_cluster_only() -> None:
    ok, _ = admit("n4", ("c1",), frozenset(), "n1", ("c1",), [app("n1", to="n4")])
    assert len(ok) == 1
    ok, refused = admit("n4", ("c1",), frozenset(), "n1", ("c2",), [app("n1", to="n4")])
    assert ok == [] and refused[0][1] == Refusal.CLUSTER


def test_a_node_without_any_cluster_id_checks_only_the_rest() -> None:
    # a state from before cluster ids: nothing to compare with
    ok, refused = admit("n1", (), MEMBERS, "n2", ("whatever",), [app("n2"), app("x")])
    assert len(ok) == 1 and refused[0][1] == Refusal.SENDER_MISMATCH
