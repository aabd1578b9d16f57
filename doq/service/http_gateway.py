"""HTTP/JSON gateway (placeholder: health only; the full gateway replaces this module)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from doq.service.api import QueueService


def create_app(api: QueueService) -> FastAPI:
    app = FastAPI(title="doq")

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ok = api.node.is_leader
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    return app
