"""Bad bytes are refused with a DecodeError that says what is wrong (the message reaches the
node's log when a stored entry or a peer's message does not decode)."""

from __future__ import annotations

import pytest

from doq.raft import ConfChange, ConfChangeType, Entry, codec


def test_a_length_beyond_the_end_is_truncated_bytes() -> None:
    good = codec.encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, "node-1"))
    with pytest.raises(codec.DecodeError, match="^truncated bytes$"):
        codec.decode_conf_change(good[:-1])


def test_bytes_after_the_value_are_trailing_bytes() -> None:
    good = codec.encode_entry(Entry(1, 2, data=b"x"))
    assert codec.decode_entry(good) == Entry(1, 2, data=b"x")
    with pytest.raises(codec.DecodeError, match="^trailing bytes$"):
        codec.decode_entry(good + b"\x00")


def test_a_conf_change_of_an_unknown_type_is_refused_naming_the_type() -> None:
    good = bytearray(codec.encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, "n")))
    good[1] = 0x63  # the type: 99 is no ConfChangeType
    with pytest.raises(codec.DecodeError, match="99"):
        codec.decode_conf_change(bytes(good))


def test_a_varint_cut_short_is_truncated_varint() -> None:
    good = codec.encode_entry(Entry(300, 2))  # the term takes two bytes, the first one 0x80 | ...
    with pytest.raises(codec.DecodeError, match="^truncated varint$"):
        codec.decode_entry(good[:2])


def test_the_wrong_format_tag_names_the_tag_expected() -> None:
    entry = codec.encode_entry(Entry(1, 2))
    with pytest.raises(codec.DecodeError, match="^expected tag 0xc1$"):
        codec.decode_conf_change(entry)
    with pytest.raises(codec.DecodeError, match="^expected tag 0xe1$"):
        codec.decode_entry(b"")


def test_a_negative_integer_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="^negative integer$"):
        codec.encode_entry(Entry(-1, 2))
