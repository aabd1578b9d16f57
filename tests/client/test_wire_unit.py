"""The producer's wire form without a server: stamped dedup ids, batch frames."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from doq_proto.v1 import doq_pb2 as pb
from hypothesis import given, settings
from hypothesis import strategies as st

from doq_client._ledger import Chunk, Frame, Stamper, batch_frame
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


def _col(queue: str, *bodies: bytes, **columns: Any) -> Chunk:
    return Chunk(None, None, len(bodies) == 1, True, queue=queue, contents=list(bodies),
                 dedup_ids=[f"d-{b.decode()}" for b in bodies], **columns)


def test_frames_take_chunks_of_one_queue_within_the_bounds() -> None:
    from collections import deque

    from doq_client._ledger import take_frame

    s = Stamper(True)
    wire = Chunk(s.encode([enqueue_request("a", b"w"), enqueue_request("b", b"w")])[0], None, False, True)
    out = deque([_col("a", b"1"), _col("a", b"2", b"3"), _col("b", b"4"), wire, _col("b", b"5"),
                 _col("b", b"6" * 50), _col("b", b"7")])
    chunks, size = take_frame(out, 10, 1 << 20)
    assert size == 3 and [c.contents for c in chunks] == [[b"1"], [b"2", b"3"]]  # queue a only
    chunks, size = take_frame(out, 10, 1 << 20)
    assert size == 1 and chunks[0].queue == "b"  # a wire chunk ends it
    chunks, size = take_frame(out, 10, 1 << 20)
    assert chunks == [wire] and size == 2  # a wire chunk goes alone
    chunks, size = take_frame(out, 10, 40)
    assert [c.contents for c in chunks] == [[b"5"]]  # the next would pass max_bytes
    chunks, size = take_frame(out, 1, 1 << 20)
    assert [c.contents for c in chunks] == [[b"6" * 50]]  # at least one chunk, even if large


def test_a_columns_frame_round_trips_every_column() -> None:
    from doq_client._ledger import columns_frame

    plain = _col("q", b"a", b"b")
    rich = _col("q", b"c", groups=["g"], priorities=[5], metadata=[{"k": "v"}], delays_ms=[10])
    data, frame = columns_frame([plain, rich])
    cols = pb.EnqueueBatchRequest.FromString(data).columns
    assert cols.queue_name == "q" and list(cols.contents) == [b"a", b"b", b"c"]
    assert list(cols.dedup_ids) == ["d-a", "d-b", "d-c"]
    assert list(cols.groups) == ["", "", "g"] and list(cols.priorities) == [0, 0, 5]
    assert [dict(m.entries) for m in cols.metadata] == [{}, {}, {"k": "v"}]
    assert list(cols.delays_ms) == [0, 0, 10]
    assert frame.size == 3 and frame.groups == ["", "", "g"] and frame.priorities == [0, 0, 5]
    plain.outcomes.append(None)  # type: ignore[arg-type]  # answered before a failover
    data, frame = columns_frame([plain])
    cols = pb.EnqueueBatchRequest.FromString(data).columns
    assert list(cols.contents) == [b"b"] and not cols.groups and frame.size == 1


_FIELDS = {"groups": ("", st.sampled_from(["", "g", "tenant-7"])),
           "priorities": (0, st.integers(-(2**63), 2**63 - 1)),
           "metadata": ({}, st.sampled_from([{}, {"k": "v"}])),
           "delays_ms": (0, st.integers(0, 10**6))}


@st.composite
def _chunks(draw: Any) -> list[tuple[Chunk, dict[str, list[Any]]]]:
    """Chunks of one queue, each with its own optional columns and 0..n-1 messages answered."""
    out = []
    for j in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 4))
        bodies = [b"%d-%d" % (j, i) for i in range(n)]
        full: dict[str, list[Any]] = {}
        given_cols: dict[str, list[Any]] = {}
        for name, (default, values) in _FIELDS.items():
            if draw(st.booleans()):
                given_cols[name] = full[name] = draw(st.lists(values, min_size=n, max_size=n))
            else:
                full[name] = [default] * n
        if n == 1 and not ({"metadata", "delays_ms"} & given_cols.keys()) and draw(st.booleans()):
            c = Chunk.one("q", bodies[0], f"d-{j}", full["groups"][0], full["priorities"][0])
        else:
            c = _col("q", *bodies, **given_cols)
            c.dedup_ids = [f"d-{j}"] if n == 1 else c.dedup_ids
        answered = draw(st.integers(0, n - 1))
        c.outcomes.extend([None] * answered)  # type: ignore[list-item]
        full["contents"], full["dedup_ids"] = list(c.contents), list(c.dedup_ids)
        out.append((c, {k: v[answered:] for k, v in full.items()}))
    return out


@settings(max_examples=300, deadline=None)
@given(_chunks())
def test_a_frame_of_many_chunks_carries_each_unanswered_message_with_its_fields(
        chunks: list[tuple[Chunk, dict[str, list[Any]]]]) -> None:
    """Gathered column by column (chained when nothing was answered, chunk by chunk when
    something was or a chunk lacks a column), every message keeps its own fields."""
    from doq_client._ledger import columns_frame

    data, frame = columns_frame([c for c, _ in chunks])
    cols = pb.EnqueueBatchRequest.FromString(data).columns
    want = {k: [v for _, w in chunks for v in w[k]] for k in ("contents", "dedup_ids", *_FIELDS)}
    n = len(want["contents"])
    assert list(cols.contents) == want["contents"] and frame.size == n
    assert list(cols.dedup_ids) == want["dedup_ids"]
    assert list(cols.groups or [""] * n) == want["groups"]
    assert list(cols.priorities or [0] * n) == want["priorities"]
    assert ([dict(m.entries) for m in cols.metadata] or [{}] * n) == want["metadata"]
    assert list(cols.delays_ms or [0] * n) == want["delays_ms"]
    assert list(frame.groups or [""] * n) == want["groups"]
    assert list(frame.priorities or [0] * n) == want["priorities"]


def test_a_keyed_message_chunk_leaves_nothing_for_the_cyclic_gc() -> None:
    """A producer's keyed message holds its group and priority in tuples of str and int,
    which the collector stops tracking: thousands in flight add nothing to its passes."""
    c = Chunk.one("q", b"x", "d-1", "tenant", 5)
    gc.collect()
    assert c.groups == ("tenant",) and c.priorities == (5,)
    assert not gc.is_tracked(c.groups) and not gc.is_tracked(c.priorities)
    assert not gc.is_tracked(c.contents) and not gc.is_tracked(c.dedup_ids)
    plain = Chunk.one("q", b"x", "d-2")
    assert plain.groups is None and plain.priorities is None


def test_column_answers_become_outcomes_in_order() -> None:
    from doq_client import TooLarge
    from doq_client._ledger import Frame, Ledger
    from doq_client.types import EnqueueResult

    done: list[Chunk] = []
    ledger = Ledger(done.append)
    a, b = _col("q", b"1", b"2"), _col("q", b"3", groups=["g"], priorities=[2])
    ledger.sent([a, b], Frame(3, True, ["", "", "g"], [0, 0, 2]))
    resp = pb.EnqueueBatchResponse(ids=[7, 0, 5], duplicates=[2], deliver_at_ms=[0, 0, 99],
                                   error_positions=[1],
                                   errors=[pb.Error(code=8, reason="MESSAGE_TOO_LARGE", message="big")])
    ledger.on_batch(resp)
    assert done == [a, b]
    assert a.outcomes[0] == EnqueueResult(7) and isinstance(a.outcomes[1], TooLarge)
    assert b.outcomes == [EnqueueResult(5, True, "g", 2, 99)]


@pytest.mark.parametrize(("groups", "prios"), [(None, None), (["", "g", "h"], None), (None, [0, -4, 9]),
                                               (["", "g", "h"], [0, -4, 9])])
@pytest.mark.parametrize(("dups", "deliver"), [([], []), ([0, 2], []), ([], [0, 5, 0]), ([1], [1, 2, 3])])
def test_column_answers_without_errors_carry_each_messages_fields(
        groups: list[str] | None, prios: list[int] | None, dups: list[int], deliver: list[int]) -> None:
    from doq_client._ledger import _column_outcomes
    from doq_client.types import EnqueueResult

    frame = Frame(3, True, groups, prios)
    resp = pb.EnqueueBatchResponse(ids=[4, 5, 6], duplicates=dups, deliver_at_ms=deliver)
    want = [EnqueueResult(i, pos in dups, groups[pos] if groups else "", prios[pos] if prios else 0,
                          deliver[pos] if deliver else 0) for pos, i in enumerate([4, 5, 6])]
    got = _column_outcomes(resp, frame)
    assert got == want and [repr(r) for r in got] == [repr(r) for r in want]


def test_plain_results_equal_the_dataclass() -> None:
    from doq_client._ledger import plain_result
    from doq_client.types import EnqueueResult

    for i in (1, 2**64 - 1):
        r = plain_result(i)
        assert r == EnqueueResult(i) and hash(r) == hash(EnqueueResult(i)) and repr(r) == repr(EnqueueResult(i))
        with pytest.raises(AttributeError):
            r.id = 3  # type: ignore[misc]  # still frozen


@pytest.mark.parametrize(("group", "priority"), [
    ("g", 0), ("", 7), ("grp", -(2**63)), ("", 2**63 - 1), ("g\x00", 3),  # the columns, as they are
    ("é", 1), ("😀", 0),  # not ASCII: through `enqueue_request`
])
def test_a_message_with_a_group_or_priority_makes_the_frame_a_request_would(group: str, priority: int) -> None:
    """`_message` puts an ASCII group and an int64 priority straight into the columns; the
    frame is the one `enqueue_request` + the columns form of requests makes (same columns,
    same dedup ids), as for every other value."""
    from doq_client._ledger import columns_frame
    from doq_client._producer_core import ProducerCore

    fast, slow = ProducerCore(8, 1000, True, 1 << 20), ProducerCore(8, 1000, True, 1 << 20)
    slow._stamper = fast._stamper = Stamper(True)  # one sequence of dedup ids
    got = [fast._message("q", b"x", group, priority, None, "", 0), fast._message("q", "y", "", 0, None, "d", 0)]
    fast._stamper._seq = iter(range(1, 3))  # type: ignore[assignment]  # the same ids again
    want = [slow._requests_chunk([enqueue_request("q", b"x", group=group, priority=priority)], True),
            slow._requests_chunk([enqueue_request("q", "y", dedup_id="d")], True)]
    assert columns_frame(got) == columns_frame(want)
    assert [c.n for c in got] == [1, 1] and all(c.single and c.safe for c in got)


@pytest.mark.parametrize("priority", [2**63, -(2**63) - 1])
def test_a_priority_beyond_int64_is_refused_before_anything_is_kept(priority: int) -> None:
    from doq_client import InvalidArgument
    from doq_client._producer_core import ProducerCore

    with pytest.raises(InvalidArgument) as ei:
        ProducerCore(8, 1000, True, 1 << 20)._message("q", b"x", "g", priority, None, "", 0)
    assert ei.value.reason == "INVALID_PRIORITY"
