"""Pages of the queue list (`doq.service.paging`): every queue exactly once across pages,
bounded pages, tokens that survive creations and deletions between pages, bad tokens and
sizes refused."""

from __future__ import annotations

import pytest

from doq.errors import InvalidArgument
from doq.queues.model import QueueInfo, QueueSettings, QueueStats, QueueType
from doq.service.paging import MAX_QUEUES_PAGE, page


def _q(name: str) -> QueueInfo:
    return QueueInfo(name, QueueType.DELAYED, QueueSettings(), QueueStats(0, 0, 0, 0))


def _all(queues: list[QueueInfo], size: int) -> list[str]:
    out: list[str] = []
    token = ""
    while True:
        got, token = page(queues, token, size)
        assert len(got) <= size
        out += [q.name for q in got]
        if not token:
            return out


def test_pages_cover_every_queue_once_in_order() -> None:
    queues = [_q(f"q{i:04d}") for i in range(2500)]
    for size in (1, 7, 1000):
        assert _all(queues, size) == [q.name for q in queues]
    first, token = page(queues, "", 0)  # 0: the default, the largest page
    assert len(first) == MAX_QUEUES_PAGE and token
    assert page(queues[:3], "", 3) == (queues[:3], "")  # an exact fit has no next page
    assert page([], "", 0) == ([], "")


def test_a_token_names_a_place_not_a_position() -> None:
    queues = [_q(n) for n in ("a", "b", "c", "d")]
    got, token = page(queues, "", 2)
    assert [q.name for q in got] == ["a", "b"]
    changed = [_q(n) for n in ("0", "a", "c", "d")]  # "0" created, "b" deleted between pages
    assert [q.name for q in page(changed, token, 2)[0]] == ["c", "d"]


def test_any_queue_name_is_a_place_to_start_after() -> None:
    queues = [_q(n) for n in ("a", "b", "c")]
    assert page(queues, "aa", 5) == (queues[1:], "")  # "aa" is no queue: the page starts after it
    assert page(queues, "zzz", 5) == ([], "")


@pytest.mark.parametrize("token", ["%%%", "not a name", "-x", "a" * 201, "q\x00"])
def test_a_token_that_is_not_a_queue_name_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        page([_q("a")], token, 0)
    assert e.value.reason == "INVALID_PAGE_TOKEN"


@pytest.mark.parametrize("size", [-1, MAX_QUEUES_PAGE + 1])
def test_a_page_size_beyond_the_bound_is_refused(size: int) -> None:
    with pytest.raises(InvalidArgument) as e:
        page([_q("a")], "", size)
    assert e.value.reason == "INVALID_MAX_RESULTS"
