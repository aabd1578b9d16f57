"""The peer door: which inbound Raft messages may reach this node's core (pure, no I/O).

Every frame of Raft messages a peer sends carries its cluster ids (`PeerFrame`): the
cluster id of its state first, then the ids it also answers to (one it had before an
online restore adopted a backup's id; the id of the cluster it was told to join). The
receiving node admits a frame's messages only when all of this holds, whatever their
term (a stranger must never raise a member's term or reach its log):

- cluster: the node's own ids and the frame's ids share one (a node that knows no id
  of its own, a state from before cluster ids, checks nothing here);
- receiver: the message is addressed to this node;
- sender: the message's sender is the one that opened the stream;
- membership: the sender is a member of this node's configuration (voters, learners
  and the replicated address map). A node without a configuration yet (it is joining)
  takes any sender of the cluster it was told to join.

What is refused is dropped and counted by the caller (`Refusal` names the reason).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum

from doq.raft.types import Message


class Refusal(StrEnum):
    """Why a message was dropped at the door (the `reason` label of the metric)."""

    CLUSTER = "cluster"  # another cluster's (or no) cluster id
    NOT_MEMBER = "not_member"  # its sender is not in this node's configuration
    WRONG_RECEIVER = "wrong_receiver"  # addressed to another node
    SENDER_MISMATCH = "sender_mismatch"  # its sender is not the stream's


def cluster_matches(own_ids: Collection[str], frame_ids: Sequence[str]) -> bool:
    """True when the frame belongs to this node's cluster (see the module docstring)."""
    own = {i for i in own_ids if i}
    if not own:
        return True
    return any(i in own for i in frame_ids)


def admit(
    node_id: str,
    own_ids: Collection[str],
    members: Collection[str],
    sender: str,
    frame_ids: Sequence[str],
    messages: Sequence[Message],
) -> tuple[list[Message], list[tuple[Message, Refusal]]]:
    """Split `messages` (one frame from `sender`, carrying `frame_ids`) into those that
    may reach the core and those refused, each with its reason. `members` empty: no
    configuration yet (only the cluster is checked)."""
    if not cluster_matches(own_ids, frame_ids):
        return [], [(m, Refusal.CLUSTER) for m in messages]
    ok: list[Message] = []
    refused: list[tuple[Message, Refusal]] = []
    for m in messages:
        if m.to != node_id:
            refused.append((m, Refusal.WRONG_RECEIVER))
        elif m.frm != sender:
            refused.append((m, Refusal.SENDER_MISMATCH))
        elif members and m.frm not in members:
            refused.append((m, Refusal.NOT_MEMBER))
        else:
            ok.append(m)
    return ok, refused
