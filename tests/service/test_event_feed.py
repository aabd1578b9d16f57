"""`EventFeed` (the `/events` producer) in process: one snapshot per interval for all
subscribers, a bounded backlog per subscriber, a bounded number of subscribers, and no
producer left running once everyone left."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from doq.errors import Unavailable
from doq.service.http import ui
from doq.service.http.ui import SUBSCRIBER_BACKLOG, EventFeed


def decode(event: bytes) -> dict[str, Any]:
    data = [line[5:].strip() for line in event.decode().splitlines() if line.startswith("data:")]
    return json.loads("".join(data))


async def test_every_subscriber_gets_the_same_snapshots_built_once_per_interval() -> None:
    builds = 0

    def build(only: object = None) -> dict[str, Any]:
        nonlocal builds
        builds += 1
        return {"n": builds}

    feed = EventFeed(build, interval_s=0.01)
    a, b = feed.stream(), feed.stream()
    first_a, first_b = await a.__anext__(), await b.__anext__()  # each subscriber's own first snapshot
    assert decode(first_a) == {"n": 1} and decode(first_b) == {"n": 2}
    got_a = [decode(await a.__anext__()) for _ in range(3)]
    got_b = [decode(await b.__anext__()) for _ in range(3)]
    assert got_a == got_b  # the same documents: built once, handed to both
    await a.aclose()
    await b.aclose()
    assert feed.subscribers == 0


async def test_a_subscriber_that_does_not_read_holds_a_bounded_backlog() -> None:
    feed = EventFeed(lambda only: {"x": 1}, interval_s=0.001)
    slow = feed.stream()
    await slow.__anext__()
    await asyncio.sleep(0.2)  # ~200 intervals while it reads nothing
    assert feed._subscribers and max(q.qsize() for q in feed._subscribers) <= SUBSCRIBER_BACKLOG
    await slow.aclose()
    await asyncio.sleep(0.01)
    assert feed.subscribers == 0 and (feed._task is None or feed._task.done())


async def test_too_many_subscribers_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui, "MAX_SUBSCRIBERS", 2)
    feed = EventFeed(lambda only: {}, interval_s=10)
    open_ = [feed.stream(), feed.stream()]
    for s in open_:
        await s.__anext__()
    with pytest.raises(Unavailable):
        await feed.stream().__anext__()
    for s in open_:
        await s.aclose()
    await feed.stream().__anext__()  # room again
