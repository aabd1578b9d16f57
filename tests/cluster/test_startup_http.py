"""The responder that holds a joining node's HTTP address (doq/service/startup_http.py),
on a real socket on 127.0.0.1, asked with urllib as probes and the seed ask it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from doq.cluster_client import get_identity
from doq.node.cluster import NodeIdentity
from doq.ports import free_port
from doq.service.startup_http import StartupResponder


def _get(port: int, path: str) -> tuple[int, str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], json.loads(e.read())


async def test_a_joining_node_answers_its_identity_is_live_and_not_ready() -> None:
    import asyncio

    ident = NodeIdentity("doq-1", "c" * 32, "", empty=True)
    port = free_port()
    responder = await StartupResponder(ident, "joining").start("127.0.0.1", port)
    try:
        got = await asyncio.to_thread(get_identity, f"127.0.0.1:{port}")
        assert got == ident
        assert await asyncio.to_thread(_get, port, "/livez") == (200, "application/json", {"status": "ok", "reasons": []})
        status, _, body = await asyncio.to_thread(_get, port, "/readyz")
        assert status == 503 and body == {"ready": False, "leader": False, "leader_hint": "", "reasons": ["joining"]}
        status, ctype, body = await asyncio.to_thread(_get, port, "/API/v1/queues")
        assert (status, ctype) == (503, "application/problem+json")
        assert isinstance(body, dict) and body["reason"] == "STARTING"
    finally:
        await responder.stop()
    # the address is free again for the gateway
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
    server.close()
    await server.wait_closed()
