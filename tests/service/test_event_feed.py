"""`EventFeed` (the `/events` producer) in process: one snapshot per interval for all
subscribers, a bounded backlog per subscriber, a bounded number of subscribers, and no
producer left running once everyone left."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from doq.auth.authorizer import ANONYMOUS, Principal
from doq.errors import Overloaded, Unavailable
from doq.service.http import ui
from doq.service.http.ui import MAX_SUBSCRIBERS_PER_KEY, SUBSCRIBER_BACKLOG, EventFeed


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


def _key(key_id: str, admin: bool = False) -> Principal:
    return Principal(key_id, (), is_admin=admin)


async def test_one_key_holds_at_most_its_share_of_streams() -> None:
    """A key with read access cannot take every slot: past `MAX_SUBSCRIBERS_PER_KEY` its
    streams are refused (Overloaded: 429), another key and an admin still get one, and a
    closed stream gives its key the slot back. A node without keys (no principal, or the
    anonymous one) has only the node's bound."""
    feed = EventFeed(lambda only: {}, interval_s=10)
    mine = [feed.stream(None, _key("k1")) for _ in range(MAX_SUBSCRIBERS_PER_KEY)]
    for s in mine:
        await s.__anext__()
    with pytest.raises(Overloaded) as e:
        await feed.stream(None, _key("k1")).__anext__()
    assert e.value.reason == "TOO_MANY_STREAMS_PER_KEY"
    others = [feed.stream(None, _key("k2")), feed.stream(None, _key("adm", admin=True))]
    for s in others:
        await s.__anext__()
    await mine.pop().aclose()
    mine.append(feed.stream(None, _key("k1")))
    await mine[-1].__anext__()  # its slot back
    anonymous = [feed.stream(None, who) for who in [None, ANONYMOUS] * MAX_SUBSCRIBERS_PER_KEY]
    for s in anonymous:
        await s.__anext__()
    for s in [*mine, *others, *anonymous]:
        await s.aclose()
    assert feed.subscribers == 0 and feed._per_key == {}


async def test_the_last_slots_are_kept_for_admin_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many keys with read access together take at most MAX_SUBSCRIBERS - ADMIN_RESERVED
    streams (then 503): an admin's dashboard still opens."""
    monkeypatch.setattr(ui, "MAX_SUBSCRIBERS", 6)
    monkeypatch.setattr(ui, "ADMIN_RESERVED", 2)
    monkeypatch.setattr(ui, "MAX_SUBSCRIBERS_PER_KEY", 1)
    feed = EventFeed(lambda only: {}, interval_s=10)
    readers = [feed.stream(None, _key(f"k{i}")) for i in range(4)]
    for s in readers:
        await s.__anext__()
    with pytest.raises(Unavailable) as e:
        await feed.stream(None, _key("k9")).__anext__()
    assert e.value.reason == "TOO_MANY_STREAMS"
    admins = [feed.stream(None, _key("adm", admin=True)), feed.stream(None, _key("adm2", admin=True))]
    for s in admins:
        await s.__anext__()
    with pytest.raises(Unavailable):  # the node's own bound holds for admins too
        await feed.stream(None, _key("adm3", admin=True)).__anext__()
    for s in [*readers, *admins]:
        await s.aclose()
