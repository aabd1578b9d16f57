"""The gateway on a real `doq serve` process (127.0.0.1): metrics, health, long poll,
batch endpoints, refused requests (never a 5xx, never a change), backup versions.

The adapter's mapping is covered in depth in process (test_gateway_unit.py);
these tests check the same promises end to end, with the real node, LMDB and uvicorn.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from doq.service.http_gateway import body_limits
from tests.support.cluster import until
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

Q = "/API/v1/queues"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(Path(tmp_path_factory.mktemp("real")) / "data") as n:
        yield n


def call(node: NodeProc, method: str, path: str, body: object = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(node.http_url + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def ok(node: NodeProc, method: str, path: str, body: object = None) -> Any:
    status, _, raw = call(node, method, path, body)
    assert 200 <= status < 300, (status, raw)
    return json.loads(raw) if raw else None


def problem(resp: tuple[int, dict[str, str], bytes], status: int, reason: str) -> dict[str, Any]:
    got, headers, raw = resp
    assert got == status, raw
    assert headers["content-type"] == "application/problem+json"
    doc = json.loads(raw)
    assert doc["status"] == status and doc["reason"] == reason and doc["detail"], doc
    return doc  # type: ignore[no-any-return]


def stats(node: NodeProc, queue: str) -> dict[str, int]:
    return ok(node, "GET", f"{Q}/{queue}")["stats"]  # type: ignore[no-any-return]


def metrics(node: NodeProc) -> dict[str, float]:
    """Samples of the /metrics page by `name{labels}` (label order as printed)."""
    status, headers, raw = call(node, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_health(node: NodeProc) -> None:
    assert ok(node, "GET", "/livez") == {"status": "ok", "reasons": []}
    assert ok(node, "GET", "/readyz") == {"ready": True, "leader": True, "leader_hint": "node-1", "reasons": [],
                                          "alarms": []}


def test_metrics_count_real_traffic(node: NodeProc) -> None:
    ok(node, "POST", Q, {"name": "metrics_q"})
    before = metrics(node)
    ok(node, "POST", f"{Q}/metrics_q/messages", {"content": "a"})
    ok(node, "POST", f"{Q}/metrics_q/messages:batch", {"messages": [{"content": "b"}, {"content": "c"}]})
    leased = ok(node, "GET", f"{Q}/metrics_q/messages")  # leased: in flight
    ok(node, "GET", f"{Q}/metrics_q/messages?ack=true")  # delivered and removed
    ok(node, "POST", f"{Q}/metrics_q/messages/{leased['id']}/ack")
    # the node answers once a command is applied (and counted), before its LMDB commit:
    # the commit histograms (`observe_commit`) observe it after, so wait for them; the
    # LMDB commits are batched (`--hold-commit-ms`): at least one within 100 ms
    def committed() -> dict[str, float] | None:
        m = metrics(node)
        return m if all(m.get(k, 0.0) - before.get(k, 0.0) >= n for k, n in (
            ("doq_commands_applied_total", 5), ("doq_commit_seconds_count", 5),
            ("doq_fsync_seconds_count", 1))) else None

    after: dict[str, float] = until("the five commands' commits observed", committed, timeout_s=60)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta('doq_messages_enqueued_total{transport="http"}') == 3
    assert delta('doq_messages_dequeued_total{transport="http"}') == 2
    assert delta('doq_messages_acked_total{transport="http"}') == 2  # ack=true counts as an ack
    # every command above was committed through the node: commit and fsync latencies observed
    assert delta("doq_batches_committed_total") >= 1 and delta("doq_commands_applied_total") >= 5
    for hist in ("doq_commit_seconds", "doq_fsync_seconds"):
        assert delta(f"{hist}_count") >= 1, hist
        assert after[f"{hist}_sum"] > 0 and after[f'{hist}_bucket{{le="+Inf"}}'] == after[f"{hist}_count"]
    assert after['doq_queue_messages{queue="metrics_q",state="ready"}'] == 1
    assert after['doq_queue_messages{queue="metrics_q",state="in_flight"}'] == 0
    assert after['doq_queue_messages{queue="metrics_q",state="delayed"}'] == 0
    assert after['doq_queue_messages{queue="metrics_q",state="dead"}'] == 0
    assert after["doq_queues"] >= 1 and after["doq_node_is_leader"] == 1
    ok(node, "DELETE", f"{Q}/metrics_q")
    assert not any('queue="metrics_q"' in k for k in metrics(node))


def test_long_poll_dequeue(node: NodeProc) -> None:
    ok(node, "POST", Q, {"name": "poll_q"})
    # nothing to deliver: 204 No Content once wait_ms is over
    status, _, raw = call(node, "GET", f"{Q}/poll_q/messages?ack=true&wait_ms=50")
    assert (status, raw) == (204, b"")
    got: list[tuple[int, bytes]] = []
    poller = threading.Thread(
        target=lambda: got.append(call(node, "GET", f"{Q}/poll_q/messages?ack=true&wait_ms=30000")[::2]))
    poller.start()
    time.sleep(1.0)
    assert poller.is_alive() and not got, "the long poll answered before anything was enqueued"
    sent = ok(node, "POST", f"{Q}/poll_q/messages", {"content": "wake up"})
    poller.join(30)
    assert not poller.is_alive()
    status, raw = got[0]
    msg = json.loads(raw)
    assert status == 200 and msg["id"] == sent["id"] and msg["content"] == "wake up"
    # the batch form: {"messages": []} when nothing comes
    assert ok(node, "POST", f"{Q}/poll_q/messages:dequeue", {"wait_ms": 50, "max_messages": 5}) == {"messages": []}


def test_batch_enqueue_all_or_nothing_and_batch_ack(node: NodeProc) -> None:
    ok(node, "POST", Q, {"name": "batch_q"})
    good = [{"content": f"m{i}", "priority": i} for i in range(3)]
    for bad, status, reason in [
        ({"content": "!!", "content_encoding": "base64"}, 400, "INVALID_CONTENT"),
        ({"content": "x" * (1024 * 1024 + 1)}, 413, "MESSAGE_TOO_LARGE"),
        ({"content": "a", "priority": "1"}, 400, "INVALID_REQUEST"),
        ({"content": "a", "colour": "red"}, 400, "INVALID_REQUEST"),
    ]:
        doc = problem(call(node, "POST", f"{Q}/batch_q/messages:batch", {"messages": [*good, bad]}), status, reason)
        assert doc["errors"][0]["loc"][:3] == ["body", "messages", 3], doc
        assert stats(node, "batch_q")["total"] == 0
    res = ok(node, "POST", f"{Q}/batch_q/messages:batch", {"messages": good})["results"]
    ids = [r["id"] for r in res]
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 3
    got = ok(node, "POST", f"{Q}/batch_q/messages:dequeue", {"max_messages": 2})["messages"]
    assert [m["id"] for m in got] == ids[:2]
    leases = [m["lease_id"] for m in got]
    res = ok(node, "POST", f"{Q}/batch_q/messages:ack", {"ids": [*ids[:2], ids[2]], "lease_ids": [*leases, "1"]})["results"]
    assert [(r["id"], r["success"]) for r in res] == [(ids[0], True), (ids[1], True), (ids[2], False)]
    assert res[2]["error"]["reason"] == "STALE_LEASE" and res[2]["error"]["status"] == 409  # never delivered
    assert stats(node, "batch_q") == {"ready": 1, "delayed": 0, "in_flight": 0, "dead": 0, "total": 1}
    problem(call(node, "POST", f"{Q}/nope/messages:batch", {"messages": good}), 404, "QUEUE_NOT_FOUND")


def _raw_post(node: NodeProc, path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, dict[str, Any]]:
    """Send headers and `chunks` (no more: the server answers before the body is complete,
    so nothing unread is left to reset the connection), then read the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=60)
    try:
        conn.putrequest("POST", path)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        for c in chunks:
            conn.send(c)
        r = conn.getresponse()
        assert r.getheader("Content-Type") == "application/problem+json"
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_refused_requests_change_nothing(node: NodeProc) -> None:
    ok(node, "POST", Q, {"name": "refuse_q"})
    ok(node, "POST", f"{Q}/refuse_q/messages", {"content": "keep"})
    before = stats(node, "refuse_q")
    path = f"{Q}/refuse_q/messages"
    problem(call(node, "POST", path, raw=b'{"content": "a",'), 400, "MALFORMED_JSON")
    problem(call(node, "POST", path, raw=b'{"content": 5}'), 400, "INVALID_REQUEST")
    problem(call(node, "POST", path, raw=b'{"content": "a", "colour": "red"}'), 400, "INVALID_REQUEST")
    problem(call(node, "POST", path, raw=b'{"content": "a", "priority": 9223372036854775808}'), 400, "INVALID_REQUEST")
    problem(call(node, "POST", path, raw=b'{"content": "\\ud800"}'), 400, "MALFORMED_JSON")  # lone surrogate
    problem(call(node, "POST", path, raw=b""), 400, "MISSING_BODY")
    problem(call(node, "POST", path, raw=b'{"content": "a"}', headers={"Content-Type": "text/plain"}),
            415, "UNSUPPORTED_MEDIA_TYPE")
    problem(call(node, "PUT", f"{Q}/refuse_q/messages/abc/priority", {"priority": 1}), 400, "INVALID_ID")
    problem(call(node, "GET", f"{Q}/refuse_q/messages?wait_ms=1e3"), 400, "INVALID_REQUEST")
    problem(call(node, "PATCH", f"{Q}/refuse_q", {}), 405, "METHOD_NOT_ALLOWED")
    problem(call(node, "GET", "/API/v1/nothing"), 404, "NOT_FOUND")
    # oversized bodies: refused by Content-Length before the body is read, and while a
    # chunked body streams in, as soon as it crosses the limit
    single, _ = body_limits(1024 * 1024)
    status, doc = _raw_post(node, path, {"Content-Type": "application/json", "Content-Length": str(single + 1)}, [])
    assert (status, doc["reason"]) == (413, "BODY_TOO_LARGE")
    chunk = b"x" * 65536
    frames = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (single // len(chunk) + 1)  # no final 0-chunk
    status, doc = _raw_post(node, path, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, frames)
    assert (status, doc["reason"]) == (413, "BODY_TOO_LARGE")
    assert stats(node, "refuse_q") == before
    assert ok(node, "GET", "/livez") == {"status": "ok", "reasons": []}


def test_backup_versions_chain(node: NodeProc) -> None:
    def backup(since: int) -> tuple[int, bytes]:
        status, headers, raw = call(node, "POST", "/db/backup", {"since": since})
        assert status == 200 and headers["content-type"] == "application/octet-stream", raw[:300]
        assert re.fullmatch(r"[0-9]+", headers["x-last-version"])
        return int(headers["x-last-version"]), raw

    ok(node, "POST", Q, {"name": "backup_q"})
    last, full = backup(0)
    assert full.startswith(b"DOQBAK1\n") and last >= 1
    ok(node, "POST", f"{Q}/backup_q/messages", {"content": "after the full backup"})
    last2, inc = backup(last + 1)
    assert inc.startswith(b"DOQBAK1\n") and last2 > last
    problem(call(node, "POST", "/db/backup", {"since": -1}), 400, "INVALID_REQUEST")
    problem(call(node, "POST", "/db/backup", {"since": "0"}), 400, "INVALID_REQUEST")
