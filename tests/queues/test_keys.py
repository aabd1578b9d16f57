"""Key layout: no queue name can collide with another's keys; ids sort within a queue."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from doq.queues import keys as K

names = st.text(min_size=1, max_size=12)
ids = st.integers(1, 2**64 - 1)


@given(names, names, ids, ids)
def test_message_keys_collide_only_for_the_same_message(a: str, b: str, i: int, j: int) -> None:
    assert (K.message_key(a, i) == K.message_key(b, j)) == (a == b and i == j)


@given(names, names, st.text(max_size=12), st.text(max_size=12))
def test_dedup_keys_collide_only_for_the_same_id(a: str, b: str, x: str, y: str) -> None:
    assert (K.dedup_key(a, x) == K.dedup_key(b, y)) == (a == b and x == y)


@given(names, names, ids, st.text(max_size=12))
def test_kinds_never_collide_and_names_do_not_prefix_each_other(a: str, b: str, i: int, d: str) -> None:
    keys = {K.queue_key(a), K.message_key(a, i), K.dedup_key(a, d), K.META_KEY}
    assert len(keys) == 4
    if a != b:  # "a" + "b..." cannot reach into the key range of queue "ab..."
        assert not K.message_key(b, i).startswith(K.name_prefix(K.MESSAGE, a))
        assert not K.dedup_key(b, d).startswith(K.name_prefix(K.DEDUP, a))


def test_the_classic_concatenation_case() -> None:
    assert not K.dedup_key("a", "b").startswith(K.name_prefix(K.DEDUP, "ab"))
    assert K.dedup_key("a", "bc") != K.dedup_key("ab", "c")


@given(names, st.lists(ids, min_size=2, max_size=20, unique=True))
def test_message_keys_sort_by_id_within_a_queue(name: str, xs: list[int]) -> None:
    keys = [K.message_key(name, i) for i in xs]
    assert [K.message_id(K.split_name(k)[2]) for k in sorted(keys)] == sorted(xs)
    assert all(K.split_name(k)[1] == name for k in keys)


def test_a_key_shorter_than_its_name_says_is_refused_naming_it() -> None:
    key = K.message_key("queue", 7)[:5]  # the name's length, then only two of its bytes
    with pytest.raises(ValueError, match=f"^{re.escape(f'malformed key {key!r}')}$"):
        K.split_name(key)
