"""A fair queue's batch pop (`FairIndex.pop_many`, rounds over the rotation) takes
exactly what as many single pops (`FairIndex.pop`) would, and leaves the same index."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from doq.queues.fair import FairIndex, _key


def _index(sizes: list[int], inflight: list[int], limit: int, cursor: int, credit: int) -> FairIndex:
    fi = FairIndex(limit=limit, cursor=f"g{cursor:02d}" if cursor >= 0 else "", credit=credit)
    id_ = 0
    for g, (size, busy) in enumerate(zip(sizes, inflight, strict=False)):
        keys = []
        for j in range(size):
            id_ += 1
            keys.append(_key(j % 3, id_))
        fi.add_many(sorted(keys), f"g{g:02d}")
        if busy and f"g{g:02d}" in fi.groups:
            fi.groups[f"g{g:02d}"].inflight = busy
            fi._refresh(fi.groups[f"g{g:02d}"])  # noqa: SLF001
    return fi


def _state(fi: FairIndex) -> object:
    return (fi.cursor, fi.credit, fi.n_ready, list(fi.active),
            {n: (list(g.ready.islice(0, len(g.ready))), g.inflight, g.active) for n, g in fi.groups.items()})


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=12),
       inflight=st.lists(st.integers(0, 3), max_size=12), limit=st.integers(0, 4),
       cursor=st.integers(-1, 13), credit=st.integers(-1, 0), n=st.integers(0, 80), lease=st.booleans())
def test_pop_many_is_as_many_single_pops(sizes: list[int], inflight: list[int], limit: int, cursor: int,
                                        credit: int, n: int, lease: bool) -> None:
    fast = _index(sizes, inflight, limit, cursor, credit)
    slow = _index(sizes, inflight, limit, cursor, credit)
    got = fast.pop_many(n, lease)
    want = []
    while len(want) < n and (p := slow.pop(lease)) is not None:
        want.append(p[0])
    assert got == want
    assert _state(fast) == _state(slow)


def test_rounds_wrap_around_and_skip_groups_that_leave_the_rotation() -> None:
    fi = _index([1, 3, 2], [0, 0, 0], 0, 0, 0)  # cursor g00: the next turn is g01's
    ids = [k & ((1 << 64) - 1) for k in fi.pop_many(6, True)]
    assert ids == [2, 5, 1, 3, 6, 4]  # g01 g02 g00 | g01 g02 | g01
    assert not fi.active and set(fi.groups) == {"g00", "g01", "g02"}  # in flight: kept


def test_a_batch_pop_reads_the_rotation_only_as_far_as_it_delivers() -> None:
    """With many more active groups than a batch takes, a batch pop looks at about as many
    names of the rotation as it delivers (not the whole rotation per batch: at 50k groups
    that was 100 names per delivery)."""
    fi = FairIndex()
    for g in range(5000):
        fi.add_many([_key(0, 2 * g + 1), _key(0, 2 * g + 2)], f"g{g:05d}")
    seen = 0
    act = fi.active
    islice = act.islice

    def counting(*args: int) -> list[str]:
        nonlocal seen
        out = list(islice(*args))
        seen += len(out)
        return out

    act.islice = counting  # type: ignore[method-assign]
    for _ in range(20):
        assert len(fi.pop_many(100, True)) == 100
    assert seen <= 2 * 20 * 100
    assert fi.cursor == "g01999"


def _unleased_one_by_one(fi: FairIndex, names: list[str]) -> None:
    """The definition: each message out of flight re-evaluates its group (`_refresh`)."""
    for name in names:
        g = fi.groups[name]
        g.inflight -= 1
        fi._refresh(g)  # noqa: SLF001


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=12),
       inflight=st.lists(st.integers(0, 3), max_size=12), limit=st.integers(0, 4),
       n=st.integers(0, 80), pick=st.randoms(use_true_random=False), batch=st.booleans())
def test_unleased_is_a_refresh_of_the_group(sizes: list[int], inflight: list[int], limit: int, n: int,
                                            pick: object, batch: bool) -> None:
    """`unleased` (which skips the group's re-evaluation when it cannot change anything)
    and `unleased_many` leave the index as a `_refresh` after each message would: the
    rotation, the counts, and a group with nothing ready and nothing in flight gone."""
    fast = _index(sizes, inflight, limit, -1, 0)
    slow = _index(sizes, inflight, limit, -1, 0)
    popped = [fast.pop(True) for _ in range(n)]
    for _ in range(n):
        slow.pop(True)
    names = [name for p in popped if p is not None for name in [p[1]]]
    names += [name for name, g in sorted(fast.groups.items()) for _ in range(g.inflight - names.count(name))]
    pick.shuffle(names)  # type: ignore[attr-defined]
    names = names[: len(names) * 3 // 4 + 1] if names else []
    if batch:
        fast.unleased_many(names)
    else:
        for name in names:
            fast.unleased(name)
    _unleased_one_by_one(slow, names)
    assert _state(fast) == _state(slow)
