"""Follower forwarding between two real uvicorn servers on 127.0.0.1: what is forwarded
(writes, dequeues) and what is served locally (reads, backups, on the leader, no leader,
already forwarded), what the client gets back (status, headers, streamed bodies,
X-Doq-Leader), and a 503 when the leader does not answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from doq.node.cluster import ClusterStatus, Member, MemberAddrs
from doq.service.http.forward import FORWARDED_HEADER, LeaderForwardMiddleware, must_lead
from tests.cluster.support import serving
from tests.support.proc import free_port


def echo_app(name: str) -> Any:
    """Answers every request with what it received (201 for POST); /stream streams 3 chunks."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"one,", b"two,", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        doc = {
            "served_by": name, "method": scope["method"], "raw_path": scope["raw_path"].decode(),
            "query": scope["query_string"].decode(), "body_len": len(body),
            "body_sha": hashlib.sha256(body).hexdigest(),
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
        }
        out = json.dumps(doc).encode()
        await send({"type": "http.response.start", "status": 201 if scope["method"] == "POST" else 200,
                    "headers": [(b"content-type", b"application/json"), (b"x-last-version", b"7"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    return app


class FollowerNode:
    """A follower's view: the leader is `leader_id` at `leader_http`."""

    def __init__(self, node_id: str, leader_id: str, leader_http: str, is_leader: bool = False) -> None:
        self.node_id = node_id
        self.is_leader = is_leader
        self.leader_id = leader_id
        self.leader_http = leader_http

    def cluster_status(self) -> ClusterStatus:
        members = [Member("node-1", MemberAddrs("r:1", "g:1", self.leader_http), "voter"),
                   Member("node-2", MemberAddrs("r:2", "g:2", "127.0.0.1:1"), "voter")]
        return ClusterStatus(self.node_id, self.leader_id, 2, 10, 10,
                             "leader" if self.is_leader else "follower", members)


@asynccontextmanager
async def pair(node: FollowerNode | None = None) -> AsyncIterator[tuple[httpx.AsyncClient, str, FollowerNode]]:
    """A leader (plain echo app) and a follower (echo app behind the middleware); yields a
    client on the follower, the leader's address and the follower's node."""
    async with serving(echo_app("leader")) as leader_addr:
        node = node or FollowerNode("node-2", "node-1", leader_addr)
        node.leader_http = node.leader_http or leader_addr
        follower = LeaderForwardMiddleware(echo_app("follower"), node)
        async with serving(follower) as addr, httpx.AsyncClient(base_url=f"http://{addr}", timeout=30) as c:
            yield c, leader_addr, node


@pytest.mark.parametrize(("method", "path", "leader"), [
    ("POST", "/API/v1/queues", True),
    ("DELETE", "/API/v1/queues/q", True),
    ("PUT", "/API/v1/queues/q/messages/5/priority", True),
    ("POST", "/API/v1/queues/q/messages:dequeue", True),
    ("GET", "/API/v1/queues/q/messages", True),
    ("POST", "/db/restore", True),
    ("POST", "/cluster/join", True),
    ("GET", "/API/v1/queues/q", False),
    ("GET", "/API/v1/queues/q/messages/5", False),
    ("GET", "/API/v1/queues", False),
    ("POST", "/db/backup", False),
    ("GET", "/cluster", False),
    ("GET", "/readyz", False),
])
def test_must_lead(method: str, path: str, leader: bool) -> None:
    assert must_lead(method, path) is leader


async def test_a_write_is_forwarded_and_the_answer_relayed() -> None:
    async with pair() as (c, leader_addr, _):
        body = json.dumps({"content": "x" * 5_000_000}).encode()  # beyond one read of the socket
        r = await c.post("/API/v1/queues/q%2Fodd/messages?x=1&y=%20", content=body,
                         headers={"content-type": "application/json", "x-custom": "kept"})
        assert r.status_code == 201
        assert r.headers["x-doq-leader"] == leader_addr and r.headers["x-last-version"] == "7"
        doc = r.json()
        assert doc["served_by"] == "leader"
        assert doc["raw_path"] == "/API/v1/queues/q%2Fodd/messages" and doc["query"] == "x=1&y=%20"
        assert doc["body_len"] == len(body) and doc["body_sha"] == hashlib.sha256(body).hexdigest()
        assert doc["headers"]["x-custom"] == "kept" and doc["headers"]["content-type"] == "application/json"
        assert doc["headers"][FORWARDED_HEADER.lower()] == "node-2"
        assert doc["headers"]["host"] == leader_addr


async def test_chunked_request_and_streamed_response() -> None:
    async with pair() as (c, leader_addr, _):
        async def parts() -> AsyncIterator[bytes]:
            for i in range(5):
                yield bytes([65 + i]) * 100_000

        r = await c.post("/API/v1/queues/q/messages", content=parts())  # no content-length: chunked
        assert r.json()["served_by"] == "leader" and r.json()["body_len"] == 500_000
        r = await c.post("/stream")
        assert r.status_code == 200 and r.text == "one,two,three" and r.headers["x-doq-leader"] == leader_addr


async def test_a_dequeue_is_forwarded_and_a_read_is_not() -> None:
    async with pair() as (c, _, _):
        assert (await c.get("/API/v1/queues/q/messages", params={"ack": "true"})).json()["served_by"] == "leader"
        r = await c.get("/API/v1/queues/q")
        assert r.json()["served_by"] == "follower" and "x-doq-leader" not in r.headers
        assert (await c.post("/db/backup", json={"since": 0})).json()["served_by"] == "follower"


async def test_served_locally_on_the_leader_without_a_leader_and_when_already_forwarded() -> None:
    async with pair() as (c, _, node):
        node.is_leader = True
        assert (await c.post("/API/v1/queues")).json()["served_by"] == "follower"
        node.is_leader, node.leader_id = False, ""
        assert (await c.post("/API/v1/queues")).json()["served_by"] == "follower"
        node.leader_id = "node-1"
        r = await c.post("/API/v1/queues", headers={FORWARDED_HEADER: "node-3"})  # no second hop
        assert r.json()["served_by"] == "follower"
        assert (await c.post("/API/v1/queues")).json()["served_by"] == "leader"


async def test_unreachable_leader_is_a_retryable_503() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with pair(FollowerNode("node-2", "node-1", dead)) as (c, _, _):
        r = await c.post("/API/v1/queues", json={"name": "q"})
        assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
        doc = r.json()
        assert doc["reason"] == "LEADER_UNREACHABLE" and doc["retryable"] is True and doc["leader_hint"] == "node-1"
        assert r.headers["x-doq-leader"] == dead and r.headers["retry-after"] == "1"
        assert dead in doc["detail"]  # which leader did not answer: the operator's first question


async def test_concurrent_forwards() -> None:
    async with pair() as (c, _, _):
        rs = await asyncio.gather(*(c.post(f"/API/v1/queues/q{i}/messages", content=b"m" * i) for i in range(50)))
        assert [r.json()["body_len"] for r in rs] == list(range(50))
        assert {r.json()["served_by"] for r in rs} == {"leader"}


async def test_a_client_that_abandons_a_forwarded_long_poll_is_seen_gone_by_the_leader() -> None:
    """The leader's poll must end when the client leaves (else it takes a message for nobody)."""
    seen: dict[str, str] = {}
    arrived = asyncio.Event()

    async def leader_app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass  # the request body
        arrived.set()
        try:
            seen["leader"] = (await asyncio.wait_for(receive(), 60))["type"]
        except TimeoutError:
            seen["leader"] = "still connected"
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def follower_app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a dequeue on a follower must be forwarded")

    async with serving(leader_app) as leader:
        node = FollowerNode("node-2", "node-1", leader)
        async with serving(LeaderForwardMiddleware(follower_app, node)) as follower:
            host, port = follower.split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /API/v1/queues/jobs/messages?ack=true&wait_ms=20000 HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(arrived.wait(), 60)  # forwarded (not a fixed sleep: a loaded machine)
            writer.close()  # the client gives up
            for _ in range(600):
                if "leader" in seen:
                    break
                await asyncio.sleep(0.1)
    assert seen.get("leader") == "http.disconnect"
