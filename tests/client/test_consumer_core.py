"""The consumers' shared rules (`doq_client._consumer_core.ConsumerBase`, pure: no stream,
no lock) on their own: which acks go in the stream and which by unary calls, and when the
sender is woken. The consumers over a real node: test_streams, test_coalescing,
test_failover_*."""

from __future__ import annotations

import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq_client import InvalidArgument
from doq_client._consumer_core import ConsumerBase
from doq_client.types import Message


class Core(ConsumerBase):
    def __init__(self, prefetch: int = 8) -> None:
        super().__init__("q", prefetch=prefetch, ack=False, batched=True, max_batch=500,
                         visibility_timeout_ms=0, close_grace_s=1.0)
        self.wakes = 0

    def _wakeup(self) -> None:
        self.wakes += 1

    def handed(self, *ids: int) -> list[Message]:
        """Messages of the current stream, as `next()` hands them out."""
        if self._tag is None:
            self._tag = object()
        return [Message(pb.Message(id=i, lease_id=100 + i), self._tag) for i in ids]


@pytest.mark.parametrize("one_at_a_time", [True, False])
def test_acks_of_the_current_stream_go_in_it_and_those_of_an_earlier_one_by_unary_calls(
    one_at_a_time: bool,
) -> None:
    core = Core()
    [old] = core.handed(1)
    core._restart()  # the stream failed: the next one has another tag
    [new] = core.handed(2)
    assert old.stream_tag is not new.stream_tag
    if one_at_a_time:
        assert core._add_ack((new,)) is None
        late = core._add_ack((old,))
    else:
        late = core._add_ack((new, old))
    assert (core._pending.acks, core._pending.lease_ids) == ([2], [102])
    assert late is not None and (late.acks, late.lease_ids) == ([1], [101])


def test_a_message_handed_out_by_another_consumer_is_acked_by_a_unary_call() -> None:
    mine, theirs = Core(), Core()
    [m] = theirs.handed(5)
    mine.handed(6)
    late = mine._add_ack((m,))
    assert not mine._pending and late is not None and late.acks == [5]


def test_the_first_ack_wakes_the_sender_and_a_batch_of_acks_makes_it_urgent() -> None:
    core = Core(prefetch=8)  # a batch: 8 // 4 = 2 acks
    a, b, c = core.handed(1, 2, 3)
    core._add_ack((a,))
    assert core.wakes == 1 and not core._urgent  # starts the interval
    core._add_ack((b,))
    assert core.wakes == 2 and core._urgent  # a batch: send now
    core._took()
    assert not core._pending and not core._urgent
    core._add_ack((c,))
    assert core.wakes == 3 and not core._urgent


def test_a_bare_id_is_acked_with_any_lease_and_a_bad_one_refuses_the_whole_call() -> None:
    core = Core()
    [m] = core.handed(1)
    assert core._add_ack((7,)) is None
    assert (core._pending.acks, core._pending.lease_ids) == ([7], [0])
    with pytest.raises(InvalidArgument):
        core._add_ack((m, -1))
    assert core._pending.acks == [7]  # nothing of the refused call was queued


def test_an_ack_true_consumer_refuses_acks_and_a_closed_one_too() -> None:
    auto = ConsumerBase("q", prefetch=1, ack=True, batched=True, max_batch=1,
                        visibility_timeout_ms=0, close_grace_s=1.0)
    with pytest.raises(ValueError, match="acks each message"):
        auto._add_ack((1,))
    core = Core()
    [m] = core.handed(1)
    core._closing = core._half_closed = True
    with pytest.raises(ValueError, match="closed"):
        core._add_ack((m,))
