"""HTTP gateway load generator: bounded, loopback, keep-alive, N concurrent connections.

    python bench/http_bench.py [--url http://127.0.0.1:8000] --workload enqueue|dequeue|livez|bare
                                  [--connections 32] [--count 20000] [--runs 3] [--payload 100]
                                  [--data-dir-parent /dev/shm]
    (from a checkout: python bench/http_bench.py ...)

Each connection sends one request at a time (no pipelining) over a raw asyncio HTTP/1.1
stream with keep-alive and reads the full response (Content-Length); any non-2xx answer
is an error. Without --url a fresh `doq serve` is started on free ports in a temp dir and
stopped afterwards. `dequeue` first fills the queue over HTTP (batch enqueue), then runs
`GET .../messages?ack=true` (one durable command per request). `livez` measures the
gateway's per-request floor (no command). `bare` starts a bare uvicorn (httptools, uvloop)
app answering a trivial JSON POST and loads it the same way: the ceiling to compare with.
`--data-dir-parent /dev/shm` puts the started node's data on tmpfs (fsync costs nothing):
not a durable figure, but it separates CPU effects from a noisy disk in A/B comparisons.
Prints one JSON line per run, with the 1-minute load average before and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from importlib.util import find_spec
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.ports import free_port


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
            break
    if length:
        await reader.readexactly(length)
    return status


async def _worker(host: str, port: int, reqs: list[bytes], counter: list[int], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for req in reqs:
            status = await _one(reader, writer, req)
            if 200 <= status < 300:
                counter[0] += 1
            else:
                errors[0] += 1
    finally:
        writer.close()


def _request(method: str, host: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n"
    if body or method in ("POST", "PUT"):
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def run_once(url: str, workload: str, connections: int, count: int, payload: int, queue: str) -> dict[str, object]:
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    hosthdr = f"{host}:{port}"
    content = "x" * payload
    if workload == "enqueue":
        body = json.dumps({"content": content, "group": "default", "priority": 60}).encode()
        req = _request("POST", hosthdr, f"/API/v1/queues/{queue}/messages", body)
    elif workload == "bare":
        body = json.dumps({"content": content, "group": "default", "priority": 60}).encode()
        req = _request("POST", hosthdr, "/", body)
    elif workload == "dequeue":
        req = _request("GET", hosthdr, f"/API/v1/queues/{queue}/messages?ack=true")
    else:
        req = _request("GET", hosthdr, "/livez")
    per = [count // connections + (1 if i < count % connections else 0) for i in range(connections)]
    ok, errs = [0], [0]
    t0 = time.perf_counter()
    await asyncio.gather(*(_worker(host, port, [req] * n, ok, errs) for n in per))
    dt = time.perf_counter() - t0
    return {"workload": workload, "connections": connections, "requests": count, "ok": ok[0],
            "errors": errs[0], "seconds": round(dt, 3), "req_per_s": round(count / dt)}


def _load1() -> float:
    return round(os.getloadavg()[0], 2)


def _http(url: str, method: str, path: str, doc: object | None = None) -> tuple[int, bytes]:
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _fill(url: str, queue: str, count: int, payload: int) -> None:
    msg = {"content": "x" * payload, "group": "default", "priority": 60}
    left = count
    while left:
        n = min(left, 5000)
        status, body = _http(url, "POST", f"/API/v1/queues/{queue}/messages:batch", {"messages": [msg] * n})
        if status != 200:
            raise SystemExit(f"fill failed: {status} {body[:300]!r}")
        left -= n


BARE_APP = """
import uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"16")]})
    await send({"type": "http.response.body", "body": b'{"success":true}'})
uvicorn.run(app, host="127.0.0.1", port=%d, http="httptools", loop="uvloop", log_level="warning",
            access_log=False, lifespan="off")
"""


def _start_bare() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", BARE_APP % port], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("bare uvicorn did not start")


def _import_roots() -> list[str]:
    """The directories this process imports doq and doq_proto from (the child uses the same)."""
    roots: list[str] = []
    for name in ("doq", "doq_proto"):
        spec = find_spec(name)
        if spec is not None and spec.origin:
            root = str(Path(spec.origin).resolve().parents[1])
            if root not in roots:
                roots.append(root)
    return roots


def _start_node(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    http_port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (*_import_roots(), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "doq", "serve", "--data-dir", tmp,
         "--grpc-addr", f"127.0.0.1:{free_port()}", "--http-addr", f"127.0.0.1:{http_port}",
         "--raft-addr", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if _http(url, "GET", "/readyz")[0] == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("doq serve did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running node's HTTP URL (default: start one)")
    ap.add_argument("--workload", choices=["enqueue", "dequeue", "livez", "bare"], default="enqueue")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--count", type=int, default=20000, help="requests per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--payload", type=int, default=100, help="content bytes")
    ap.add_argument("--data-dir-parent", default=None,
                    help="where the started node's temp data dir goes (e.g. /dev/shm: not durable)")
    ns = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="doq-http-bench-", dir=ns.data_dir_parent) as tmp:
        proc: subprocess.Popen[bytes] | None
        if ns.workload == "bare":
            proc, url = _start_bare()
        elif ns.url:
            proc, url = None, ns.url.rstrip("/")
        else:
            proc, url = _start_node(tmp)
        try:
            queue = f"httpbench-{os.getpid()}"
            if ns.workload != "bare":
                status, body = _http(url, "POST", "/API/v1/queues", {"name": queue, "type": "delayed"})
                if status not in (200, 201, 409):
                    raise SystemExit(f"create queue failed: {status} {body[:300]!r}")
            for _ in range(ns.runs):
                if ns.workload == "dequeue":
                    _fill(url, queue, ns.count, ns.payload)
                load_before = _load1()
                res = asyncio.run(run_once(url, ns.workload, ns.connections, ns.count, ns.payload, queue))
                res["load1"] = [load_before, _load1()]
                print(json.dumps(res), flush=True)
            if ns.workload != "bare":
                _http(url, "DELETE", f"/API/v1/queues/{queue}")
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
