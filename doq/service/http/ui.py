"""The dashboard: `/ui` (one page, its assets under `/static/ui/`, nothing from outside)
and `GET /events`, the Server-Sent Events stream it reads.

`/events` sends one `snapshot` event per `interval_ms` (default 1000): this node's view
(role, leader, term, commit and applied indexes) and every queue's counts and cumulative
counters (`QueueCounters`: rates are their differences between two events). It reads the
node's published view (no Raft round trip, nothing proposed): a page left open costs one
JSON document per interval for all its viewers together (`EventFeed` builds each document
once and hands it to every subscriber), plus one per subscriber whose key is limited to
queue-name prefixes: it sees only its queues (names, counts and `queues_total`). A subscriber that does not keep up loses old
events, never grows the node's memory: each holds at most `SUBSCRIBER_BACKLOG` events.

Streams are bounded (`EventFeed.stream`): at most `MAX_SUBSCRIBERS` per node (more: 503
`TOO_MANY_STREAMS`), at most `MAX_SUBSCRIBERS_PER_KEY` per key (more: 429
`TOO_MANY_STREAMS_PER_KEY`), and the last `ADMIN_RESERVED` slots are for admin keys, so
keys with read access cannot, together or alone, keep an admin out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from starlette.responses import HTMLResponse, Response, StreamingResponse

from doq.auth.authorizer import Principal, current_principal, visible_queue
from doq.errors import Overloaded, Unavailable
from doq.queues.model import QueueInfo
from doq.service.http.bodies import errors, operation_id
from doq.service.http.models import RateHistoryModel
from doq.service.http.routes import QueueName
from doq.service.limits import check_queue_name
from doq.service.rate_history import RateHistory

if TYPE_CHECKING:
    from doq.service.api import QueueService

UI_DIR = Path(__file__).resolve().parent.parent / "static" / "ui"
MAX_SUBSCRIBERS = 64  # open `/events` streams per node
MAX_SUBSCRIBERS_PER_KEY = 8  # open `/events` streams of one key (a node without keys: no such bound)
ADMIN_RESERVED = 8  # of MAX_SUBSCRIBERS, slots only streams of admin keys (or of a node without keys) take
SUBSCRIBER_BACKLOG = 4  # events a slow subscriber may have pending; older ones are dropped
MAX_EVENT_QUEUES = 1000  # queues per event (by name); `queues_total` tells how many there are
KEEPALIVE_S = 15.0
Only = Callable[[str], bool] | None
"""The queue names a subscriber may see (None: every queue)."""


def queue_row(q: QueueInfo, oldest_age_ms: int | None = None) -> dict[str, Any]:
    """A queue's row of a snapshot; `oldest_age_ms`: how long its oldest message has been
    in it (None: it holds none)."""
    s, n = q.stats, q.counters
    return {
        "name": q.name, "type": q.type.value, "ready": s.ready, "delayed": s.delayed,
        "in_flight": s.in_flight, "dead": s.dead, "total": s.total,
        "enqueued": n.enqueued, "delivered": n.delivered, "acked": n.acked,
        "oldest_age_ms": oldest_age_ms,
    }


class EventFeed:
    """One producer per interval for every `/events` subscriber of a node.

    The producer task runs while someone listens: every `interval_s` it builds one snapshot
    (`build`) and puts it in each subscriber's bounded queue (dropping that subscriber's
    oldest event when full)."""

    def __init__(self, build: Callable[[Only], dict[str, Any]], interval_s: float = 1.0) -> None:
        self._build = build
        self._interval_s = interval_s
        self._subscribers: dict[asyncio.Queue[bytes], Only] = {}
        self._per_key: dict[str, int] = {}  # open streams of each key (by key id)
        self._task: asyncio.Task[None] | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def encode(self, only: Only = None) -> bytes:
        """The next snapshot (of the queues `only` lets through; None: all) as one SSE event."""
        return b"event: snapshot\ndata: " + json.dumps(self._build(only), separators=(",", ":")).encode() + b"\n\n"

    def _admit(self, who: Principal | None) -> str:
        """Take a slot for a stream of `who` (None or anonymous: a node without keys); the
        key id that holds it ("": none). Raises Unavailable (node full) or Overloaded (the
        key's own share full)."""
        key_id = "" if who is None or who.anonymous else who.key_id
        limit = MAX_SUBSCRIBERS if who is None or who.is_admin else MAX_SUBSCRIBERS - ADMIN_RESERVED
        if len(self._subscribers) >= limit:
            raise Unavailable(f"too many open event streams on this node (at most {MAX_SUBSCRIBERS}, "
                              f"the last {ADMIN_RESERVED} for admin keys)", reason="TOO_MANY_STREAMS")
        if key_id:
            held = self._per_key.get(key_id, 0)
            if held >= MAX_SUBSCRIBERS_PER_KEY:
                raise Overloaded(f"key {key_id} holds {held} open event streams on this node, the most one key "
                                 f"may: close one first", reason="TOO_MANY_STREAMS_PER_KEY")
            self._per_key[key_id] = held + 1
        return key_id

    def _release(self, key_id: str) -> None:
        if key_id:
            held = self._per_key.pop(key_id) - 1
            if held:
                self._per_key[key_id] = held

    async def stream(self, only: Only = None, who: Principal | None = None) -> AsyncIterator[bytes]:
        """The SSE bytes of one subscriber `who` (None: no key checked): a snapshot at once,
        then one per interval; it sees only the queues `only` lets through (None: all).
        Refused at the first step when the node or `who`'s key holds its most streams
        (see the module docstring)."""
        key_id = self._admit(who)
        q: asyncio.Queue[bytes] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        try:
            self._subscribers[q] = only
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._produce(), name="doq-events")
            yield b"retry: 2000\n\n" + self.encode(only)
            while True:
                try:
                    yield await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"
        finally:
            self._subscribers.pop(q, None)
            self._release(key_id)

    async def _produce(self) -> None:
        while self._subscribers:
            await asyncio.sleep(self._interval_s)
            if not self._subscribers:
                break
            shared: bytes | None = None  # the unfiltered event, built once for all who see everything
            for q, only in list(self._subscribers.items()):
                if only is None:
                    if shared is None:
                        shared = self.encode()
                    event = shared
                else:
                    event = self.encode(only)  # a prefix key's own view
                if q.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        q.get_nowait()
                q.put_nowait(event)


def build_ui_router(api: QueueService, interval_s: float = 1.0, history: RateHistory | None = None) -> APIRouter:
    """`GET /ui` (the dashboard page), `GET /events` (its live stream) and
    `GET /API/v1/queues/{name}/history` (the node's `history` of a queue's counters; empty
    without one)."""
    r = APIRouter(generate_unique_id_function=operation_id)
    node = api.node

    def snapshot(only: Only) -> dict[str, Any]:
        status = node.cluster_status()
        queues = node.state.list_queues()
        if only is not None:  # a key limited to queue prefixes sees only its queues
            queues = [q for q in queues if only(q.name)]
        total = len(queues)
        queues = queues[:MAX_EVENT_QUEUES]
        now_ms = time.time_ns() // 1_000_000
        oldest = node.state.oldest_enqueued_ms(q.name for q in queues if q.stats.total)
        return {
            "time_ms": now_ms,
            "node": {"node_id": status.node_id, "role": status.role, "leader_id": status.leader_id,
                     "term": status.term, "commit_index": status.commit_index,
                     "applied_index": status.applied_index, "ready": node.is_ready()},
            "queues_total": total,
            "queues": [queue_row(q, max(0, now_ms - oldest[q.name]) if q.name in oldest else None)
                       for q in queues],
        }

    feed = EventFeed(snapshot, interval_s)
    r.event_feed = feed  # type: ignore[attr-defined]  # tests and metrics look at it

    @r.get("/ui", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse((UI_DIR / "index.html").read_text(), headers={"Cache-Control": "no-cache"})

    @r.get(
        "/events", tags=["health"], summary="Live snapshots (Server-Sent Events)",
        response_class=Response,
        responses={
            200: {"description": "A `text/event-stream`: one `snapshot` event at once and one per second.",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
            **errors(400, 429, 503),
        },
    )
    async def events() -> StreamingResponse:
        """Server-Sent Events: each `snapshot` event's data is one JSON object, `{"time_ms",
        "node": {node_id, role, leader_id, term, commit_index, applied_index, ready},
        "queues_total", "queues": [{name, type, ready, delayed, in_flight, dead, total,
        enqueued, delivered, acked, oldest_age_ms}]}` (at most 1000 queues, by name;
        `oldest_age_ms`: how long the queue's oldest message, in any state, has been in it,
        null when it holds none). `enqueued`,
        `delivered` and `acked` count since the node started: a rate is the difference of
        two events divided by the time between them. The dashboard at `/ui` reads it."""
        who = current_principal.get()
        stream = feed.stream(visible_queue(who), who)
        first = await stream.__anext__()  # refused here (503, 429) rather than mid-stream

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for chunk in stream:
                yield chunk

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @r.get(
        "/API/v1/queues/{name}/history", tags=["queues"], summary="A queue's counters over the last minutes",
        response_model=RateHistoryModel,
        responses={200: {"description": "The queue's samples, oldest first."}, **errors(400, 404)},
    )
    async def queue_history(name: QueueName) -> dict[str, Any]:
        """Samples of the queue's cumulative counters (enqueued, delivered, acked), one every
        5 s over the last 10 minutes, taken by this node since it started: a rate is the
        difference of two samples divided by the time between them (the dashboard's chart).
        Counters count what this node applied, so every node's rates are the cluster's."""
        check_queue_name(name)
        node.state.get_queue(name)  # NotFound (404) for a queue that does not exist
        return {"interval_ms": int((history.interval_s if history else 0) * 1000),
                "samples": [dataclasses.asdict(s) for s in history.samples(name)] if history else []}

    return r
