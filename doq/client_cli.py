"""What every client command (`doq backup`, `restore`, `bench`, ...) shares: the `--server`
URL with one default, the `--key` (default `$DOQ_KEY`), `--json` output, and errors that
name the URL they tried.

`--server URL` defaults to `$DOQ_SERVER`, else the default node `http://127.0.0.1:8000`
(what `doq serve` listens on with no flags). A URL without a scheme means `http://`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from doq.config import FlagDefault
from doq.errors import InvalidArgument

DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "DOQ_SERVER"
KEY_ENV = "DOQ_KEY"


def default_server(environ: dict[str, str] | None = None) -> str:
    """`$DOQ_SERVER`, else the default node's URL."""
    env = os.environ if environ is None else environ
    return env.get(SERVER_ENV) or DEFAULT_SERVER


def add_server_argument(p: argparse.ArgumentParser, what: str = "node") -> None:
    """`--server URL` (its help shows the effective default: `$DOQ_SERVER` or the default node;
    `doq.config.given` tells whether it was given)."""
    p.add_argument("--server", metavar="URL", default=FlagDefault(default_server()),
                   help=f"HTTP URL of the {what} (env {SERVER_ENV})")
    add_key_argument(p)


def add_key_argument(p: argparse.ArgumentParser) -> None:
    """`--key KEY` (default `$DOQ_KEY`): the client key every request of the command sends."""
    p.add_argument("--key", metavar="KEY", default=None,
                   help=f"client key sent as 'Authorization: Bearer KEY' (env {KEY_ENV}; "
                        "not needed on a loopback node started without --secure)")


class _KeyHandler(urllib.request.BaseHandler):
    """Adds `Authorization: Bearer KEY` to every urllib request of this process."""

    handler_order = 100

    def __init__(self, key: str) -> None:
        self.value = f"Bearer {key}"

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        if not req.has_header("Authorization"):
            req.add_unredirected_header("Authorization", self.value)
        return req

    https_request = http_request


def use_key(key: str | None) -> None:
    """Make `key` (else `$DOQ_KEY`) this process's client key: every urllib request sends
    it, and `$DOQ_KEY` holds it for the gRPC clients and child processes."""
    key = (key or os.environ.get(KEY_ENV) or "").strip()
    if not key:
        return
    os.environ[KEY_ENV] = key
    urllib.request.install_opener(urllib.request.build_opener(_KeyHandler(key)))


def add_json_argument(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def server_url(value: str) -> str:
    """Normalize a `--server` value to `scheme://host:port[/path]` without a trailing slash.

    Raises InvalidArgument (naming the value) if it is not an http(s) URL.
    """
    raw = value.strip()
    url = raw if "://" in raw else "http://" + raw
    parts = urllib.parse.urlsplit(url)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise InvalidArgument(f"--server must be an http(s) URL such as {DEFAULT_SERVER}, got {value!r}")
    return url.rstrip("/")


def describe_error(url: str, e: BaseException) -> str:
    """One line for a failed request to `url`: the server's problem (status, detail, reason)
    or why it could not be reached; always names the URL."""
    if isinstance(e, urllib.error.HTTPError):
        body = e.read().decode(errors="replace")
        try:
            doc = json.loads(body)
            detail = doc.get("detail") or doc.get("title") or body
            reason = doc.get("reason")
            text = f"HTTP {e.code}: {detail}" + (f" ({reason})" if reason else "")
        except (ValueError, AttributeError):
            text = f"HTTP {e.code}: {body.strip()[:500]}"
        return f"{url}: {text}"
    if isinstance(e, urllib.error.URLError):
        cause: Any = e.reason
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        return f"cannot reach {url}: {why}"
    if isinstance(e, (TimeoutError, socket.timeout)):
        return f"no answer from {url} in time"
    return f"{url}: {e}"


DEFAULT_GRPC_PORT = 10000


def grpc_target(server: str, timeout_s: float = 10.0) -> str:
    """The gRPC HOST:PORT to use for a `--server` value (for gRPC clients such as `doq bench`).

    `grpc://HOST:PORT` is used as given. An http(s) URL is a node's gateway: its `GET /cluster`
    names the members' gRPC addresses (the leader's is used). A node that does not serve
    `/cluster` (a single node) is taken to listen for gRPC on the URL's host at the default
    port. Raises InvalidArgument (naming the URL) if the node cannot be asked.
    """
    if server.strip().startswith("grpc://"):
        target = server.strip().removeprefix("grpc://").rstrip("/")
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgument(f"--server grpc:// needs HOST:PORT, got {server!r}")
        return target
    base = server_url(server)
    url = base + "/cluster"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise InvalidArgument(describe_error(url, e)) from None
        host = urllib.parse.urlsplit(base).hostname or "127.0.0.1"
        return f"[{host}]:{DEFAULT_GRPC_PORT}" if ":" in host else f"{host}:{DEFAULT_GRPC_PORT}"
    except (OSError, ValueError) as e:
        raise InvalidArgument(
            describe_error(url, e) + " (a gRPC address is given as grpc://HOST:PORT)"
        ) from None
    return _leader_grpc_addr(url, doc)


def _leader_grpc_addr(url: str, doc: Any) -> str:
    """The leader's (else the answering node's) gRPC address in a `GET /cluster` answer."""
    members = doc.get("members", []) if isinstance(doc, dict) else []
    by_id = {m.get("node_id"): m for m in members if isinstance(m, dict)}
    for node_id in (doc.get("leader_id"), doc.get("node_id")) if isinstance(doc, dict) else ():
        m = by_id.get(node_id)
        if m is not None:
            addr = m.get("grpc_addr") or (m.get("addrs") or {}).get("grpc_addr")
            if addr:
                return str(addr)
    raise InvalidArgument(f"{url}: no gRPC address of the leader in the answer")


def print_result(ns: argparse.Namespace, human: str, record: dict[str, Any]) -> None:
    """Print a command's result: `human` by default, `record` as JSON with `--json`."""
    print(json.dumps(record) if getattr(ns, "json", False) else human, flush=True)
