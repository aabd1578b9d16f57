"""CommandBatch codec: exact round trip, determinism, rejection of malformed bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.queues import commands as c
from doq.queues.codec import decode_batch, encode_batch
from doq.queues.model import QueueSettings

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)
settings_st = st.builds(QueueSettings, u64, u32, text, u32, u64)
item_st = st.builds(c.EnqueueItem, st.binary(max_size=40), text, i64,
                    st.dictionaries(text, text, max_size=3), text, u64)


@st.composite
def columns_st(draw: st.DrawFn) -> c.EnqueueColumns:
    n = draw(st.integers(0, 4))

    def col(elems: st.SearchStrategy[object]) -> list[object]:
        return draw(st.just([]) | st.lists(elems, min_size=n, max_size=n))

    return c.EnqueueColumns(
        draw(text), draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n)), col(text),
        col(i64), col(st.dictionaries(text, text, max_size=3)), col(text), col(u64))  # type: ignore[arg-type]


command_st = st.one_of(
    columns_st(),
    st.builds(c.CreateQueue, text, st.sampled_from(["delayed", "fair", "x"]), settings_st, st.just(0) | u64),
    st.builds(c.UpdateQueue, text, settings_st),
    st.builds(c.DeleteQueue, text),
    st.builds(c.PurgeQueue, text),
    st.builds(c.Enqueue, text, st.lists(item_st, max_size=4)),
    st.builds(c.Dequeue, text, u32, st.booleans(), u64, st.just(0) | u64),  # seed 0: the old tag
    st.builds(c.Ack, text, st.lists(u64, max_size=4), st.lists(u64, max_size=4)),
    st.builds(c.Nack, text, u64, u64, u64, st.none() | i64, st.booleans()),
    st.builds(c.Touch, text, u64, u64, u64),
    st.builds(c.UpdatePriority, text, u64, i64),
    st.builds(c.DeleteMessage, text, u64),
    st.builds(c.DeleteMessage, text, u64, u64, st.booleans()),
    st.just(c.Tick()),
    st.builds(c.RestoreChunk, st.binary(max_size=16), u32, st.binary(max_size=64)),
    st.builds(c.RestoreCommit, st.binary(max_size=16), u32, u64, u64, text),
    st.builds(c.RestoreAbort, st.binary(max_size=16)),
)
batch_st = st.builds(c.CommandBatch, u64, st.lists(command_st, max_size=6))


ONE_OF_EACH = c.CommandBatch(7, [
    c.EnqueueColumns("q", [b"a", b"b"], ["g", "h"], [1, -2], [{"k": "v"}, {}], ["d1", "d2"], [0, 5]),
    c.CreateQueue("q", "fair", QueueSettings(1, 2, "dlq", 3, 4), 9), c.UpdateQueue("q", QueueSettings()),
    c.DeleteQueue("q"), c.PurgeQueue("q"), c.Enqueue("q", [c.EnqueueItem(b"x", "g", -1, {"a": "b"}, "d", 3)]),
    c.Dequeue("q", 3, True, 500, 0), c.Dequeue("q", 3, False, 500, 77), c.Ack("q", [1, 2], [3, 4]),
    c.Nack("q", 1, 2, 3, None, False), c.Nack("q", 1, 2, 3, -4, True), c.Touch("q", 1, 2, 3),
    c.UpdatePriority("q", 1, -5), c.DeleteMessage("q", 1), c.DeleteMessage("q", 1, 2, True), c.Tick(),
    c.RestoreChunk(b"r" * 16, 1, b"data"), c.RestoreCommit(b"r" * 16, 2, 3, 4, "sha"),
    c.RestoreAbort(b"r" * 16),
])


@settings(max_examples=300)
@example(ONE_OF_EACH)  # every command, whatever the example budget
@given(batch_st)
def test_round_trip(batch: c.CommandBatch) -> None:
    data = encode_batch(batch)
    assert decode_batch(data) == batch
    assert encode_batch(decode_batch(data)) == data


def test_a_column_of_another_length_is_not_encoded() -> None:
    bad = c.EnqueueColumns("q", [b"a", b"b"], priorities=[1])
    with pytest.raises(ValueError):
        encode_batch(c.CommandBatch(1, [bad]))


def test_columns_share_one_blob_of_contents() -> None:
    cmd = c.EnqueueColumns("q", [b"ab", b"", b"cde"])
    data = encode_batch(c.CommandBatch(1, [cmd]))
    assert b"abcde" in data
    assert decode_batch(data).commands == [cmd]


def test_metadata_order_does_not_change_the_bytes() -> None:
    a = c.CommandBatch(1, [c.Enqueue("q", [c.EnqueueItem(b"x", metadata={"a": "1", "b": "2"})])])
    b = c.CommandBatch(1, [c.Enqueue("q", [c.EnqueueItem(b"x", metadata={"b": "2", "a": "1"})])])
    assert encode_batch(a) == encode_batch(b)


@pytest.mark.parametrize("data", [b"", b"\x02" + bytes(12), b"\x01" + bytes(8) + b"\x01\x00\x00\x00\x63"])
def test_malformed_bytes_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_batch(data)


def test_truncation_and_trailing_bytes_are_rejected() -> None:
    data = encode_batch(c.CommandBatch(5, [c.Enqueue("q", [c.EnqueueItem(b"hello")]), c.Tick()]))
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            decode_batch(data[:cut])
    with pytest.raises(ValueError, match="^trailing bytes after command batch$"):
        decode_batch(data + b"\x00")


def _nack_entry(tag: int, priority: int | None) -> bytes:
    """A one-nack entry as the layout fixes it (the bytes written before releases existed, for tag 8)."""
    name = b"jobs"
    return (struct.pack("<BQI", 1, 77, 1) + bytes([tag]) + struct.pack("<I", len(name)) + name
            + struct.pack("<QQQBq", 5, 9, 250, priority is not None, priority or 0))


def test_nack_entries_written_without_release_still_decode() -> None:
    assert decode_batch(_nack_entry(8, -3)) == c.CommandBatch(77, [c.Nack("jobs", 5, 9, 250, -3)])
    assert decode_batch(_nack_entry(8, None)).commands[0] == c.Nack("jobs", 5, 9, 250, None, release=False)
    assert encode_batch(c.CommandBatch(77, [c.Nack("jobs", 5, 9, 250, -3)])) == _nack_entry(8, -3)


def test_release_has_its_own_tag() -> None:
    release = c.CommandBatch(77, [c.Nack("jobs", 5, 9, 250, None, release=True)])
    assert encode_batch(release) == _nack_entry(13, None)
    assert decode_batch(_nack_entry(13, None)) == release


same_len_strs = st.integers(0, 3).flatmap(lambda ln: st.lists(
    st.text(alphabet=st.sampled_from(["a", "0", "-", "\x1d", "\x00", "é", "\U0001f600"]), min_size=ln,
            max_size=ln), min_size=2, max_size=6))


@settings(max_examples=300)
@given(st.one_of(same_len_strs, st.lists(text, min_size=2, max_size=5),
                 st.integers(1, 140).map(lambda ln: [f"{i:0{ln}d}"[-ln:] for i in range(3)])))
def test_string_columns_in_bulk_are_the_per_string_bytes(strs: list[str]) -> None:
    """A column of strings (dedup ids, groups) written and read in bulk when they are ASCII
    of one length: the same bytes as one `u32 length + utf-8` each, and back."""
    cmd = c.EnqueueColumns("q", [b"x"] * len(strs), groups=list(strs), dedup_ids=list(strs))
    batch = c.CommandBatch(1, [cmd])
    data = encode_batch(batch)
    one_by_one = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in strs)
    assert data.endswith(one_by_one + one_by_one)
    assert decode_batch(data) == batch


def test_a_producers_dedup_ids_take_the_bulk_path() -> None:
    from doq.queues import codec

    ids = [f"0123456789abcdef-{s:012x}" for s in range(1000)]
    out: list[bytes] = []
    codec._strs(out, ids)
    assert len(out) == 1
    r = codec._Reader(out[0])
    assert r.strs(len(ids)) == ids and r.pos == len(out[0])
    sep = "\x1d\x00\x00\x00"  # the length prefix of a 29-character string, as text
    with_sep = ["a" * 10 + sep + "b" * 15, sep + "c" * 25, "d" * 29]  # the separator inside strings
    out = []
    codec._strs(out, with_sep)
    assert len(out) == 1 and codec._Reader(out[0]).strs(3) == with_sep


def test_a_create_without_a_queue_limit_keeps_its_old_bytes() -> None:
    """Entries written before `max_queues` existed decode the same; a limited create has its
    own tag, so an older reader refuses it rather than dropping the limit."""
    plain = encode_batch(c.CommandBatch(5, [c.CreateQueue("q", "delayed", QueueSettings())]))
    assert plain[13] == 1  # the tag after the header
    limited = encode_batch(c.CommandBatch(5, [c.CreateQueue("q", "delayed", QueueSettings(), 7)]))
    assert limited[13] == 30 and limited[14:-8] == plain[14:]
    assert decode_batch(limited).commands == [c.CreateQueue("q", "delayed", QueueSettings(), 7)]
