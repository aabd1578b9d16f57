"""The join-token routes (doq/service/http/enroll.py) in process, over ASGI: on a node
that requires no keys, a token (worth the cluster CA) is created only for a loopback
client; anyone else gets 403 problem+json and no token is proposed. Where keys are
required the client door asks an admin key instead (tests/auth) and the routes let any
address through. The
enrollment itself is faked here (its real path: tests/integration/test_join_token.py)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from doq.service.http.enroll import build_enroll_router
from doq.service.http.problems import install_handlers


class FakeEnrollment:
    ca_cert = b"-----BEGIN CERTIFICATE-----\n...\n"

    def __init__(self) -> None:
        self.created: list[int] = []

    async def create_token(self, ttl_s: int) -> str:
        self.created.append(ttl_s)
        return "doqjt1.fake"

    async def enroll(self, token: str, node_id: str, addrs: Any) -> dict[str, Any]:
        raise AssertionError("not called")


def app_with(enrollment: FakeEnrollment, loopback_only: bool = True) -> FastAPI:
    app = FastAPI()
    install_handlers(app)
    app.router.routes.extend(build_enroll_router(enrollment, loopback_only=loopback_only).routes)  # type: ignore[arg-type]
    return app


async def post(app: FastAPI, client_host: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(client_host, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="https://doq") as c:
        return await c.post("/cluster/join-tokens", json={"ttl_s": 60})


async def test_a_remote_client_cannot_create_a_join_token() -> None:
    e = FakeEnrollment()
    for host in ("192.0.2.7", "2001:db8::1", ""):
        r = await post(app_with(e), host)
        assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["reason"] == "LOOPBACK_ONLY"
    assert e.created == []


async def test_a_loopback_client_gets_a_token_and_the_ca_is_public() -> None:
    e = FakeEnrollment()
    for host in ("127.0.0.1", "::1"):
        r = await post(app_with(e), host)
        assert r.status_code == 200 and r.json() == {"token": "doqjt1.fake"}
    assert e.created == [60, 60]
    transport = httpx.ASGITransport(app=app_with(e), client=("192.0.2.7", 1))
    async with httpx.AsyncClient(transport=transport, base_url="https://doq") as c:
        r = await c.get("/cluster/ca")
    assert r.status_code == 200 and r.content == FakeEnrollment.ca_cert


async def test_where_keys_are_required_the_door_decides_not_the_loopback_rule() -> None:
    """A node that requires keys builds the routes with loopback_only=False: the client
    door (tests/auth) asks an admin key for POST /cluster/join-tokens, from any address."""
    e = FakeEnrollment()
    transport = httpx.ASGITransport(app=app_with(e, loopback_only=False), client=("192.0.2.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="https://doq") as c:
        r = await c.post("/cluster/join-tokens", json={"ttl_s": 60})
    assert r.status_code == 200 and r.json() == {"token": "doqjt1.fake"}
    assert e.created == [60]
