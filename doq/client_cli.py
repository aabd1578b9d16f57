"""What every client command (`doq backup`, `restore`, `bench`, ...) shares: the `--server`
URL with one default, the `--key` (default `$DOQ_KEY`), `--json` output, and errors that
name the URL they tried.

`--server URL` defaults to `$DOQ_SERVER`, else the default node `http://127.0.0.1:8000`
(what `doq serve` listens on with no flags). A URL without a scheme means `http://`.
`--ca-file FILE` (default `$DOQ_CA_FILE`) verifies a secure node's certificate with that
CA (its `ca.crt`): every HTTPS request of the command then uses it (`use_ca_file`), and
gRPC goes over TLS when it is given or the URL is https.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from doq.errors import InvalidArgument
from doq.flags import FlagDefault

DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "DOQ_SERVER"
CA_FILE_ENV = "DOQ_CA_FILE"
CONNECT_TIMEOUT_ENV = "DOQ_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 10.0
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
    p.add_argument("--ca-file", metavar="FILE", default=os.environ.get(CA_FILE_ENV) or None,
                   help=f"CA certificate (PEM) that verifies a secure node, e.g. its tls/ca.crt (env {CA_FILE_ENV})")
    _add_connect_timeout_argument(p)
    add_key_argument(p)


def use_ca_file(ca_file: str | None) -> None:
    """Make every urllib HTTPS request of this process verify servers with `ca_file`
    (a CLI process: one command, one CA). Raises InvalidArgument if it does not load."""
    if not ca_file:
        return
    import ssl

    try:
        _Opener.ssl_context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgument(f"--ca-file {ca_file}: {e}") from None
    _Opener.install()


def grpc_uses_tls(server: str, ca_file: str | None) -> bool:
    """gRPC over TLS for this `--server`: with a CA file, or an https URL."""
    return bool(ca_file) or server.strip().lower().startswith("https://")


def _add_connect_timeout_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect-timeout", metavar="SECONDS", type=float,
                   default=float(os.environ.get(CONNECT_TIMEOUT_ENV) or DEFAULT_CONNECT_TIMEOUT_S),
                   help=f"give up connecting to the server after this long (env {CONNECT_TIMEOUT_ENV}); "
                        "the answer itself may take longer")


class _ConnectTimeout:
    """Connections whose connect is bounded by `connect_timeout_s`, then `timeout` (the
    request's own) for the answer."""

    connect_timeout_s = DEFAULT_CONNECT_TIMEOUT_S

    def connect(self) -> None:
        conn: Any = self
        conn.sock = socket.create_connection((conn.host, conn.port), min(conn.timeout or 1e9, self.connect_timeout_s),
                                             conn.source_address)
        conn.sock.settimeout(conn.timeout)
        if isinstance(conn, http.client.HTTPSConnection):
            conn.sock = getattr(conn, "_context").wrap_socket(conn.sock, server_hostname=conn.host)  # noqa: B009


class _HTTPConnection(_ConnectTimeout, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_ConnectTimeout, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


def use_connect_timeout(seconds: float) -> None:
    """Bound every connect of this process's `urllib` requests by `seconds` (the client
    commands call it with `--connect-timeout`): a dead address fails with a message that
    says so instead of waiting for the whole request timeout."""
    if seconds <= 0:
        raise InvalidArgument(f"--connect-timeout must be positive, got {seconds:g}")
    _ConnectTimeout.connect_timeout_s = seconds
    _Opener.install()


class _Opener:
    """The one `urllib` opener of a CLI process: connects bounded by `--connect-timeout`,
    HTTPS verified with `--ca-file` when given (else the system's CAs)."""

    ssl_context: Any = None
    key = ""

    @classmethod
    def install(cls) -> None:
        https = _HTTPSHandler(context=cls.ssl_context) if cls.ssl_context is not None else _HTTPSHandler()
        handlers: list[Any] = [_HTTPHandler, https, KeySafeRedirect]
        if cls.key:
            handlers.append(_KeyHandler(cls.key))
        urllib.request.install_opener(urllib.request.build_opener(*handlers))


def add_key_argument(p: argparse.ArgumentParser) -> None:
    """`--key KEY` (default `$DOQ_KEY`): the client key every request of the command sends."""
    p.add_argument("--key", metavar="KEY", default=None,
                   help=f"client key sent as 'Authorization: Bearer KEY' (env {KEY_ENV}; "
                        "not needed on a loopback node started without --secure)")


def _loopback(host: str) -> bool:
    """localhost or a loopback IP (127.0.0.0/8, ::1); as `doq.tls.mode.is_loopback`, which
    this layer may not import."""
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyInClear(InvalidArgument):
    """The client key would go over plain http to a host that is not loopback."""


def check_key_transport(url: str) -> None:
    """Raise `KeyInClear` if a request to `url` may not carry the client key: plain
    `http://` to a host that is not loopback (anyone on the path would read the key).
    https, and http to localhost/127.0.0.0/8/::1 (a loopback dev node), are fine."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "http" and not _loopback(host):
        port = f":{parts.port}" if parts.port else ""
        raise KeyInClear(
            f"refusing to send the client key (--key / ${KEY_ENV}) in clear to http://{host}{port}: "
            f"use https://{host}{port} (with --ca-file, the cluster's tls/ca.crt), or unset the key",
            reason="KEY_IN_CLEAR")


def same_origin(a: str, b: str) -> bool:
    """Do two URLs have the same scheme, host and port (the default port filled in)?"""
    pa, pb = urllib.parse.urlsplit(a), urllib.parse.urlsplit(b)
    default = {"http": 80, "https": 443}

    def port(p: urllib.parse.SplitResult) -> int | None:
        return p.port or default.get(p.scheme)

    return (pa.scheme, (pa.hostname or "").lower(), port(pa)) == (pb.scheme, (pb.hostname or "").lower(), port(pb))


class KeySafeRedirect(urllib.request.HTTPRedirectHandler):
    """Follows a redirect, but one to another origin (scheme, host or port) carries no
    `Authorization` header: the key stays with the server it was meant for."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and (getattr(req, "doq_keyless", False) or not same_origin(req.full_url, new.full_url)):
            new.remove_header("Authorization")
            new.doq_keyless = True  # type: ignore[attr-defined]  # _KeyHandler adds no key to it
        return new


class _KeyHandler(urllib.request.BaseHandler):
    """Adds `Authorization: Bearer KEY` to every urllib request of this process, but never
    over plain http to a host that is not loopback (`check_key_transport` refuses the
    request) and never on a redirect to another origin (`KeySafeRedirect`)."""

    handler_order = 100

    def __init__(self, key: str) -> None:
        self.value = f"Bearer {key}"

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        if getattr(req, "doq_keyless", False):
            return req
        if not req.has_header("Authorization"):
            check_key_transport(req.full_url)
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
    _Opener.key = key
    _Opener.install()


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


def wrong_protocol(url: str, e: BaseException) -> str | None:
    """If `e` shows that `url` answered something other than HTTP/1.1 (a gRPC port answers
    HTTP/2 frames, a Raft peer port one line of its own), one line that says so and which
    port to use instead; else None."""
    if not isinstance(e, http.client.BadStatusLine):
        return None
    line = str(e.line if hasattr(e, "line") else e)
    if line.startswith("\x00\x00"):  # an HTTP/2 frame (a SETTINGS frame opens every answer)
        return (f"{url} answered in HTTP/2: that is a gRPC port (a node's --grpc-addr, default port "
                f"10000), not its HTTP gateway (--http-addr, default port 8000)")
    if line.startswith("doq-raft:"):  # doq.node.transport.NOT_A_PEER_LINE
        return (f"{url} is a node's Raft peer port (--raft-addr, default port 9000), not its HTTP "
                f"gateway (--http-addr, default port 8000)")
    return f"{url} did not answer in HTTP/1.1 (is this a doq node's --http-addr?)"


def describe_error(url: str, e: BaseException) -> str:
    """One line for a failed request to `url`: the server's problem (status, detail, reason),
    why it could not be reached, or that it speaks another protocol; always names the URL."""
    if (other := wrong_protocol(url, e)) is not None:
        return other
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
        if isinstance(cause, (TimeoutError, socket.timeout)):
            return (f"cannot reach {url}: no connection within {_ConnectTimeout.connect_timeout_s:g} s "
                    "(--connect-timeout): is the node up, and the address right?")
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
