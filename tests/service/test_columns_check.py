"""The columnar batch's fast check (`doq.service.limits.columns_pass`) passes a batch only if
every one of its messages passes `check_item` (what the per-message check would say), and
passes the batches producers send: plain short groups, dedup ids and 64-bit priorities."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from doq.errors import DoqError
from doq.queues import commands as c
from doq.service.limits import Limits, check_item, columns_pass

LIMITS = Limits(max_message_bytes=64, max_group_bytes=16, max_dedup_id_bytes=12)

labels = st.one_of(
    st.text(max_size=3),  # short: within every bound whatever the characters
    st.text(alphabet=st.characters(codec="utf-8"), min_size=3, max_size=18),  # around the bounds
    st.sampled_from(["a\x00b", "\ud800", "\udfff", "é" * 7, "é" * 8, "x" * 16, "x" * 17, "😀" * 4]),
    st.just(b"bytes"), st.none(),  # not text: only the per-message check says what fails
)
priorities = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, -(2**63) - 1, True, 1.5]))


def _all_pass(contents: list[Any], groups: list[Any], prios: list[Any], dids: list[Any]) -> bool:
    for i, content in enumerate(contents):
        item = c.EnqueueItem(content, groups[i] if groups else "", prios[i] if prios else 0, {},
                             dids[i] if dids else "")
        try:
            check_item(item, LIMITS)
        except (DoqError, AttributeError, TypeError):  # a value of another type: refused either way
            return False
    return True


@settings(max_examples=400, deadline=None)
@example([[b"x" * 64], [], [], []])
@example([[b"x" * 65], [], [], []])  # a content over the limit
@example([[b"a", b"b"], ["g", "a\x00b"], [], []])  # a NUL in one group
@example([[b"a", b"b"], ["\ud800", "g"], [], []])  # a lone surrogate
@example([[b"a"], [], [], ["\udfff"]])
@example([[b"a"], [], [], ["😀" * 3]])  # 12 bytes: the bound
@example([[b"a"], [], [], ["😀" * 4]])  # 16 bytes in 4 chars: over it
@example([[b"a"], ["é" * 8], [], []])  # 16 bytes: within the bound, but longer than 4 bytes a char can tell
@example([[b"a"], [], [True], []])  # a bool is no priority the fast path takes
@example([[b"a", b"b"], [], [2**63 - 1, -(2**63)], []])
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.binary(max_size=70), min_size=n, max_size=n),
    st.just([]) | st.lists(labels, min_size=n, max_size=n),
    st.just([]) | st.lists(priorities, min_size=n, max_size=n),
    st.just([]) | st.lists(labels, min_size=n, max_size=n))).map(list))
def test_a_batch_passes_the_columns_check_only_if_each_message_passes(cols: list[list[Any]]) -> None:
    contents, groups, prios, dids = cols
    every = _all_pass(contents, groups, prios, dids)
    if columns_pass(contents, groups, prios, dids, LIMITS):
        assert every
    short = all(type(x) is str and len(x) * 4 <= 12 for x in groups + dids)
    exact = all(type(p) is int for p in prios)
    if every and short and exact:  # what producers send takes the fast path
        assert columns_pass(contents, groups, prios, dids, LIMITS)
