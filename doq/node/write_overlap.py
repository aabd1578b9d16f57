"""What a node sends while its writer thread persists a Ready.

The driver (`doq.node.raft_node`) never steps the core during a write, but a write can
outlast the election timeout (a large purge, a slow fsync), and a leader gains by
replicating while it persists. Three functions decide what may leave meanwhile; each only
READS the core (its term, role, leader, peers' progress) and returns the messages to send:

- `split_early`: a leader's appends and heartbeats leave before its Ready is durable
  (Raft thesis 10.2.1), never anything that acknowledges or grants;
- `heartbeats_while_writing`: a busy leader still sends a heartbeat every tick;
- `heartbeat_acks`: a busy follower answers its leader's heartbeats at once.

All three act only in the node's durable term (`durable_term`, the hard state's term when
the write began; 0 when no write runs): what they send acknowledges nothing the write
would make durable. docs/raft.md, "Threads" and "One Ready, in order", says why each is
safe; `tests/node/test_raft_ticks.py` and the send-time durability check of
`tests/node/raftnet.py` fail without them or with a wrong one.
"""

from __future__ import annotations

from doq.raft.core import RaftCore
from doq.raft.types import HardState, Message, MessageType, Ready, Role

EARLY = frozenset((MessageType.APP, MessageType.HEARTBEAT))
"""The message types a leader may send before its Ready is durable."""


def split_early(core: RaftCore, rd: Ready, durable: HardState,
                durable_last_index: int) -> tuple[list[Message], list[Message]]:
    """Split a Ready's messages into (sent before its write, sent after).

    A leader replicates its new entries in parallel with persisting them: its appends and
    heartbeats leave before the write, so a follower persists while the leader does. Safe
    because the leader counts its own copy in the quorum only once it is durable: the core
    counts it at append, but the followers' answers are stepped only after this write ends
    (the core is never stepped during a write). A message whose commit index is past this
    node's durable log (`durable_last_index`) waits for the write (a leader that is its
    only voter commits at append). Only in the leader's durable term and vote (`durable`:
    the stored hard state), and not in the Ready that makes it leader (it takes requests
    from when that Ready is done: its followers must not name it leader before); such a
    Ready sends everything after the write. Never anything that acknowledges or grants
    (answers, votes, TimeoutNow): those wait for the write."""
    hs = rd.hard_state
    if (core.role != Role.LEADER or not rd.messages or rd.soft_state is not None
            or (hs is not None and (hs.term != durable.term or hs.vote != durable.vote))):
        return [], rd.messages
    early: list[Message] = []
    late: list[Message] = []
    for m in rd.messages:
        ok = m.type in EARLY and m.term == durable.term and m.commit <= durable_last_index
        (early if ok else late).append(m)
    return early, late


def heartbeats_while_writing(core: RaftCore | None, durable_term: int, node_id: str) -> list[Message]:
    """A leader whose writer is busy still sends a heartbeat every tick, as the core's
    own (commit index capped by each peer's match; no read context), so followers do not
    start an election meanwhile. Only in its durable term; [] otherwise."""
    if core is None or core.role != Role.LEADER or core.term != durable_term:
        return []
    committed = core.log.committed
    return [Message(MessageType.HEARTBEAT, to=pid, frm=node_id, term=core.term,
                    commit=min(pr.match, committed))
            for pid, pr in core.prs.items() if pid != node_id]


def heartbeat_acks(core: RaftCore | None, durable_term: int, node_id: str,
                   msgs: list[Message]) -> list[Message]:
    """During a write, answer the current leader's heartbeats among `msgs` as the core
    will when it steps them after the write (it then takes their commit index and answers
    again: a duplicate answer is harmless). Without this, a leader whose followers are all
    busy writing hears from no quorum and steps down. Only in the follower's durable term
    and to its known leader; [] otherwise."""
    if core is None or core.role != Role.FOLLOWER or core.term != durable_term or not core.lead:
        return []
    return [Message(MessageType.HEARTBEAT_RESP, to=m.frm, frm=node_id, term=m.term, context=m.context)
            for m in msgs
            if m.type == MessageType.HEARTBEAT and m.term == core.term and m.frm == core.lead]
