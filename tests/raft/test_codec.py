"""Round trips and determinism of doq.raft.codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doq.raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
    codec,
)

ids = st.text(min_size=1, max_size=8)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
small = st.integers(min_value=0, max_value=10**6)
entries = st.builds(Entry, u64, u64, st.sampled_from(list(EntryType)), st.binary(max_size=64))
conf_states = st.builds(
    ConfState, st.lists(ids, max_size=5).map(tuple), st.lists(ids, max_size=3).map(tuple)
)
metas = st.builds(SnapshotMeta, u64, u64, conf_states)
messages = st.builds(
    Message,
    type=st.sampled_from(list(MessageType)),
    to=ids,
    frm=ids,
    term=u64,
    log_term=small,
    index=u64,
    entries=st.lists(entries, max_size=4).map(tuple),
    commit=small,
    reject=st.booleans(),
    reject_hint=small,
    context=st.binary(max_size=16),
    snapshot=st.none() | metas,
    data=st.binary(max_size=32),
    offset=small,
    done=st.booleans(),
)


@given(messages)
def test_message_round_trip(m: Message) -> None:
    b = codec.encode_message(m)
    assert codec.decode_message(b) == m
    assert codec.encode_message(codec.decode_message(b)) == b  # deterministic


@given(entries)
def test_entry_round_trip(e: Entry) -> None:
    assert codec.decode_entry(codec.encode_entry(e)) == e


@given(u64, st.one_of(st.just(""), ids), u64)
def test_hard_state_round_trip(term: int, vote: str, commit: int) -> None:
    hs = HardState(term, vote, commit)
    assert codec.decode_hard_state(codec.encode_hard_state(hs)) == hs


@given(st.sampled_from(list(ConfChangeType)), ids, st.binary(max_size=64))
def test_conf_change_round_trip(t: ConfChangeType, nid: str, context: bytes) -> None:
    cc = ConfChange(t, nid, context)
    assert codec.decode_conf_change(codec.encode_conf_change(cc)) == cc


def test_conf_change_without_context_keeps_its_encoding() -> None:
    assert codec.encode_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4")) == b"\xc1\x01\x02n4"


@given(metas, st.binary(max_size=64))
def test_snapshot_round_trip(meta: SnapshotMeta, data: bytes) -> None:
    s = Snapshot(meta, data)
    assert codec.decode_snapshot(codec.encode_snapshot(s)) == s


def test_encoding_is_compact() -> None:
    m = Message(MessageType.HEARTBEAT, to="n2", frm="n1", term=7, commit=42)
    assert len(codec.encode_message(m)) < 24


@pytest.mark.parametrize(
    "blob", [b"", b"\x00", codec.encode_entry(Entry(1, 2))[:-1], codec.encode_entry(Entry(1, 2)) + b"x"]
)
def test_garbage_is_rejected(blob: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode_entry(blob)
