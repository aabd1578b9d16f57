"""Message conversion: the in-place batch form and the single form carry every field (the
defaults left unset read back as defaults)."""

from __future__ import annotations

import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq.queues.model import MessageState, MessageView
from doq.service.convert import add_messages, message_to_pb

FULL = MessageView(12345, "q", "g", 3, 2, 99, 1_700_000_000_000, 1_699_999_000_000,
                   MessageState.IN_FLIGHT, 777, "d-1", {"a": "b"}, b"x" * 10)
PLAIN = MessageView(1, "q", "", 0, 1, 0, 0, 5, MessageState.READY, 0, "", {}, b"")


def _every_field(m: MessageView) -> pb.Message:
    return pb.Message(id=m.id, queue_name=m.queue_name, content=m.content, group=m.group,
                      priority=m.priority, metadata=m.metadata, attempts=m.attempts,
                      deliver_at_ms=m.deliver_at_ms, lease_expires_at_ms=m.lease_expires_at_ms,
                      enqueued_at_ms=m.enqueued_at_ms, state=m.state.value, lease_id=m.lease_id,
                      dedup_id=m.dedup_id)


@pytest.mark.parametrize("m", [FULL, PLAIN])
def test_single_and_batch_forms_carry_every_field(m: MessageView) -> None:
    assert message_to_pb(m) == _every_field(m)
    frame = pb.MessageBatch()
    add_messages(frame.messages, [m, PLAIN, m])
    assert list(frame.messages) == [_every_field(m), _every_field(PLAIN), _every_field(m)]
