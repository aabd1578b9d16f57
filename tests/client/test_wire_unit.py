"""The producer's wire form without a server: stamped dedup ids, batch frames."""

from __future__ import annotations

from doq_proto.v1 import doq_pb2 as pb

from doq_client._ledger import Chunk, Stamper, batch_frame
from doq_client.types import enqueue_request


def test_requests_are_stamped_without_being_changed() -> None:
    mine = enqueue_request("q", b"x" * 300, metadata={"k": "v"}, dedup_id="mine")
    plain = enqueue_request("q", "y", priority=-5)
    wire, safe = Stamper(True).encode([mine, plain, plain])
    assert safe and plain.dedup_id == "" and mine.dedup_id == "mine"  # the caller's objects
    got = [pb.EnqueueRequest.FromString(w) for w in wire]
    assert got[0] == mine  # a caller's dedup id is kept
    assert got[1].content == b"y" and got[1].priority == -5
    ids = [g.dedup_id for g in got[1:]]
    assert all(ids) and len(set(ids)) == 2  # one of the producer's own per message
    other = pb.EnqueueRequest.FromString(Stamper(True).encode([plain])[0][0]).dedup_id
    assert ids[0].split("-")[0] != other.split("-")[0]  # a random prefix per producer
    wire, safe = Stamper(False).encode([mine, plain])
    assert not safe and pb.EnqueueRequest.FromString(wire[1]).dedup_id == ""
    assert Stamper(False).encode([mine]) == ([mine.SerializeToString()], True)


def test_a_batch_frame_carries_the_unanswered_requests() -> None:
    reqs = [enqueue_request("q", b"%d" % i * (50 * i)) for i in range(6)]  # up to 250 bytes
    s = Stamper(True)
    a = Chunk(s.encode(reqs[:4])[0], None, False, True)
    b = Chunk(s.encode(reqs[4:])[0], None, False, True)
    frame = pb.EnqueueBatchRequest.FromString(batch_frame([a, b]))
    assert [m.content for m in frame.messages] == [r.content for r in reqs]
    a.outcomes.append(None)  # type: ignore[arg-type]  # the first one was answered
    frame = pb.EnqueueBatchRequest.FromString(batch_frame([a]))
    assert [m.content for m in frame.messages] == [r.content for r in reqs[1:4]]
