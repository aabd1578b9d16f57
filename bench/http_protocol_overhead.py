"""The per-request cost of doq's bounded HTTP protocol (doq/service/http/protocol.py) next
to uvicorn's httptools protocol it extends: `python bench/http_protocol_overhead.py`.
In process, uvloop, a trivial ASGI app, one keep-alive connection with a fake transport;
best of 15 runs of 5000 GET requests each (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doq.service.http.protocol import BoundedHttpProtocol  # noqa: E402

REQUEST = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _run(cls: type[HttpToolsProtocol], n: int) -> float:
    cfg = Config(_app, http=cls, lifespan="off", log_level="error")
    cfg.load()
    p = cls(config=cfg, server_state=ServerState(), app_state={})
    p.connection_made(_Transport())
    t0 = time.perf_counter()
    for _ in range(n):
        p.data_received(REQUEST)
        await asyncio.sleep(0)  # the app's task answers
        await asyncio.sleep(0)
    return (time.perf_counter() - t0) / n * 1e6


async def _main() -> None:
    plain, bounded = [], []
    for _ in range(15):
        plain.append(await _run(HttpToolsProtocol, 5000))
        bounded.append(await _run(BoundedHttpProtocol, 5000))
    print(f"best of 15 x 5000 requests: httptools {min(plain):.1f} us/request, "
          f"bounded {min(bounded):.1f} us/request")


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(_main())
