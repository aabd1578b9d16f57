"""The dashboard's server side on a real `doq serve` process: `GET /events` (Server-Sent
Events), browsing messages without taking them (`GET .../messages:peek`), a fair queue's
groups (`GET .../groups`) and the `/ui` page with only local assets. The page itself runs
in a real browser in tests/ui."""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from doq.service.http.ui import UI_DIR
from tests.support.cluster import until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration
Q = "/API/v1/queues"
# Events read before a change must show (one a second): those sent while the test's calls
# ran (slow on a loaded machine) are still in the socket's buffer, older than the change.
EVENTS_TO_WAIT = 120


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(Path(tmp_path_factory.mktemp("dash")) / "data") as n:
        yield n


def call(node: NodeProc, method: str, path: str, body: object = None) -> tuple[int, Any]:
    req = urllib.request.Request(node.http_url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class EventReader:
    """An open `GET /events` stream, read event by event."""

    def __init__(self, node: NodeProc) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=30)
        self.conn.request("GET", "/events", headers={"Accept": "text/event-stream"})
        self.resp = self.conn.getresponse()

    def next(self) -> dict[str, Any]:
        event, data = "", ""
        while True:
            line = self.resp.readline().decode()
            assert line, "the stream ended"
            if line == "\n":
                if event == "snapshot":
                    return json.loads(data)
                event, data = "", ""
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()

    def close(self) -> None:
        self.conn.close()


def test_events_stream_snapshots_with_counts_and_counters(node: NodeProc) -> None:
    call(node, "POST", Q, {"name": "dash-events", "type": "delayed"})
    events = EventReader(node)
    try:
        assert events.resp.status == 200
        assert events.resp.getheader("Content-Type", "").startswith("text/event-stream")
        first = events.next()
        for _ in range(EVENTS_TO_WAIT):  # a busy node is "applying" while a write is in flight
            if first["node"]["ready"] is True:
                break
            first = events.next()
        assert first["node"]["role"] == "leader" and first["node"]["ready"] is True
        assert first["node"]["applied_index"] >= 1 and first["queues_total"] >= 1
        row = next(q for q in first["queues"] if q["name"] == "dash-events")
        assert {k: row[k] for k in ("type", "ready", "enqueued", "delivered", "acked")} == {
            "type": "delayed", "ready": 0, "enqueued": 0, "delivered": 0, "acked": 0}
        call(node, "POST", f"{Q}/dash-events/messages:batch", {"messages": [{"content": str(i)} for i in range(5)]})
        status, got = call(node, "POST", f"{Q}/dash-events/messages:dequeue", {"max_messages": 2})
        assert status == 200 and len(got["messages"]) == 2
        call(node, "POST", f"{Q}/dash-events/messages/{got['messages'][0]['id']}/ack")
        for _ in range(EVENTS_TO_WAIT):  # one event a second: the next ones show the change
            later = events.next()
            row = next(q for q in later["queues"] if q["name"] == "dash-events")
            if row["acked"] == 1:
                break
        assert later["time_ms"] > first["time_ms"]
        assert {k: row[k] for k in ("ready", "in_flight", "total", "enqueued", "delivered", "acked")} == {
            "ready": 3, "in_flight": 1, "total": 4, "enqueued": 5, "delivered": 2, "acked": 1}
    finally:
        events.close()


def test_events_give_the_age_of_each_queues_oldest_message_in_any_state(node: NodeProc) -> None:
    """`oldest_age_ms` is the snapshot's time less the enqueue time of the queue's oldest
    message, whether it is ready, delayed or in flight; null when the queue is empty."""
    call(node, "POST", Q, {"name": "dash-age", "type": "delayed"})
    ids = []
    for body in ({"content": "a", "delay_ms": 600_000}, {"content": "b"}, {"content": "c"}):
        status, got = call(node, "POST", f"{Q}/dash-age/messages", body)
        assert status in (200, 201), got
        ids.append(got["id"])
    enqueued = {i: call(node, "GET", f"{Q}/dash-age/messages/{i}")[1]["enqueued_at_ms"] for i in ids}
    events = EventReader(node)

    def row_when(cond: Any) -> tuple[dict[str, Any], int]:
        for _ in range(EVENTS_TO_WAIT):  # one event a second: the next ones show a change
            snap = events.next()
            row = next(q for q in snap["queues"] if q["name"] == "dash-age")
            if cond(row):
                return row, snap["time_ms"]
        raise AssertionError(f"no snapshot with the expected row: {row}")

    try:
        row, t = row_when(lambda r: r["total"] == 3)
        assert row["oldest_age_ms"] == t - enqueued[ids[0]] >= 0  # the delayed one
        assert call(node, "DELETE", f"{Q}/dash-age/messages/{ids[0]}")[0] == 200
        status, got = call(node, "POST", f"{Q}/dash-age/messages:dequeue", {"max_messages": 1})
        assert status == 200 and [m["id"] for m in got["messages"]] == [ids[1]]
        row, t = row_when(lambda r: r["total"] == 2 and r["in_flight"] == 1)
        assert row["oldest_age_ms"] == t - enqueued[ids[1]]  # in flight, still the oldest
        assert call(node, "POST", f"{Q}/dash-age/messages/{ids[1]}/ack")[0] == 200
        row, t = row_when(lambda r: r["total"] == 1)
        assert row["oldest_age_ms"] == t - enqueued[ids[2]]
        with urllib.request.urlopen(node.http_url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        age = re.search(r'^doq_queue_oldest_message_age_seconds\{queue="dash-age"\} (\S+)$', text, re.M)
        assert age is not None and float(age.group(1)) >= (t - enqueued[ids[2]]) / 1000
        assert "# TYPE doq_queue_groups_throttled gauge" in text  # wired (series only while throttled)
        assert "# TYPE doq_storage_used_bytes gauge" in text
        call(node, "POST", f"{Q}/dash-age/purge")
        row, _ = row_when(lambda r: r["total"] == 0)
        assert row["oldest_age_ms"] is None
    finally:
        events.close()


def test_peek_lists_in_delivery_order_pages_and_takes_nothing(node: NodeProc) -> None:
    call(node, "POST", Q, {"name": "dash-peek", "type": "delayed"})
    prios = [5, 1, 3, 1, 9, 0]
    ids = [call(node, "POST", f"{Q}/dash-peek/messages", {"content": f"p{p}", "priority": p})[1]["id"] for p in prios]
    call(node, "POST", f"{Q}/dash-peek/messages", {"content": "later", "delay_ms": 600_000})
    order = [ids[5], ids[1], ids[3], ids[2], ids[0], ids[4]]

    status, page = call(node, "GET", f"{Q}/dash-peek/messages:peek?limit=4")
    assert status == 200 and [m["id"] for m in page["messages"]] == order[:4] and page["next_offset"] == 4
    assert all(m["attempts"] == 0 and m["state"] == "ready" and m["lease_id"] == "0" for m in page["messages"])
    status, page = call(node, "GET", f"{Q}/dash-peek/messages:peek?limit=4&offset=4")
    assert [m["id"] for m in page["messages"]] == order[4:] and page["next_offset"] is None
    status, page = call(node, "GET", f"{Q}/dash-peek/messages:peek?state=delayed")
    assert [m["content"] for m in page["messages"]] == ["later"]

    stats = call(node, "GET", f"{Q}/dash-peek")[1]["stats"]
    assert (stats["ready"], stats["in_flight"]) == (6, 0)  # peeking leased nothing
    status, got = call(node, "POST", f"{Q}/dash-peek/messages:dequeue", {"max_messages": 6, "ack": True})
    assert [m["id"] for m in got["messages"]] == order and all(m["attempts"] == 1 for m in got["messages"])


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "offset=-1", "offset=10000&limit=1", "state=gone"])
def test_peek_refuses_bad_pages(node: NodeProc, query: str) -> None:
    call(node, "POST", Q, {"name": "dash-bad", "type": "delayed"})
    status, doc = call(node, "GET", f"{Q}/dash-bad/messages:peek?{query}")
    assert status == 400 and doc["status"] == 400


def test_peek_and_groups_of_an_unknown_queue_are_404(node: NodeProc) -> None:
    assert call(node, "GET", f"{Q}/dash-nope/messages:peek")[0] == 404
    assert call(node, "GET", f"{Q}/dash-nope/groups")[0] == 404


def test_the_node_keeps_a_history_of_each_queues_counters(node: NodeProc) -> None:
    """Sampled every 5 s by the node itself, whether or not a page is open."""
    call(node, "POST", Q, {"name": "dash-hist", "type": "delayed"})
    call(node, "POST", f"{Q}/dash-hist/messages:batch", {"messages": [{"content": "x"}] * 7})

    def sampled() -> Any:
        status, doc = call(node, "GET", f"{Q}/dash-hist/history")
        assert status == 200 and doc["interval_ms"] == 5000
        return doc if any(s["enqueued"] == 7 for s in doc["samples"]) else None

    doc = until("a sample after the enqueues", sampled, timeout_s=60)
    times = [s["time_ms"] for s in doc["samples"]]
    assert times == sorted(times) and set(doc["samples"][-1]) == {"time_ms", "enqueued", "delivered", "acked"}
    assert call(node, "GET", f"{Q}/dash-nope/history")[0] == 404
    assert call(node, "GET", f"{Q}/bad%20name/history")[0] == 400


def test_groups_of_a_fair_queue(node: NodeProc) -> None:
    call(node, "POST", Q, {"name": "dash-fair", "type": "fair"})
    for g in ["b", "a", "a", "c", "a"]:
        call(node, "POST", f"{Q}/dash-fair/messages", {"content": g, "group": g})
    call(node, "POST", f"{Q}/dash-fair/messages:dequeue", {"max_messages": 2})  # a, then b
    status, doc = call(node, "GET", f"{Q}/dash-fair/groups")
    assert status == 200 and doc["total"] == 3 and doc["next_offset"] is None
    policy = {"weight": 1, "max_per_second": 0, "throttled": False, "overridden": False}  # the defaults
    assert doc["groups"] == [{"group": "a", "ready": 2, "in_flight": 1, **policy},
                             {"group": "b", "ready": 0, "in_flight": 1, **policy},
                             {"group": "c", "ready": 1, "in_flight": 0, **policy}]
    status, doc = call(node, "GET", f"{Q}/dash-fair/groups?limit=1&offset=1")
    assert [g["group"] for g in doc["groups"]] == ["b"] and doc["next_offset"] == 2
    _, peek = call(node, "GET", f"{Q}/dash-fair/messages:peek")
    assert [m["group"] for m in peek["messages"]] == ["c", "a", "a"]  # the rotation goes on after b
    call(node, "POST", Q, {"name": "dash-plain", "type": "delayed"})
    assert call(node, "GET", f"{Q}/dash-plain/groups")[1]["groups"] == []


def test_the_page_and_its_assets_are_served_locally(node: NodeProc) -> None:
    with urllib.request.urlopen(node.http_url + "/ui", timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        html = r.read().decode()
    assets = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert assets and all(a.startswith("/static/") for a in assets), assets
    for asset in assets:
        with urllib.request.urlopen(node.http_url + asset, timeout=30) as r:
            assert r.status == 200
    for f in UI_DIR.iterdir():  # nothing from outside: no absolute URL but the SVG namespace
        text = f.read_text()
        assert not re.findall(r"https?://(?!www\.w3\.org/2000/svg)", text), f.name
