"""The `/cluster` HTTP API from the outside: its JSON form, a small client, and joining.

Stdlib only (urllib), blocking: `doq cluster` calls it directly; a node calls
`join_cluster` in a thread (`asyncio.to_thread`) while it starts.

JSON form of a `ClusterStatus` (`GET /cluster`, and the answer of `POST /cluster/join`):
`{"node_id", "role", "leader_id", "term", "commit_index", "applied_index", "members":
[{"node_id", "role", "leader", "raft_addr", "grpc_addr", "http_addr"}, ...]}`.
A 503 answer of a node that is not the leader carries the leader's HTTP address
(HOST:PORT) in the `X-Doq-Leader` header when the node knows it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from doq.errors import DoqError
from doq.node.cluster import ClusterStatus, MemberAddrs, NodeIdentity
from doq.node.cluster_wire import (
    LEADER_HEADER,
    identity_from_json,
    leader_http_addr,
    status_from_json,
    status_to_json,
)

log = logging.getLogger(__name__)
__all__ = ["LEADER_HEADER", "ClusterError", "leader_http_addr", "status_from_json", "status_to_json"]


def get_identity(server: str, timeout_s: float = 3.0) -> NodeIdentity:
    """`GET /cluster/identity` of one node; raises `ClusterError` (status 0: unreachable)."""
    answer = request_json(server, "GET", "/cluster/identity", timeout_s=timeout_s, send_key=False)  # open
    try:
        return identity_from_json(answer.body)
    except ValueError as e:
        raise ClusterError(0, "BAD_ANSWER", f"{server}: {e}") from None


def base_url(server: str, scheme: str = "http") -> str:
    """`{scheme}://HOST:PORT` for a bare HOST:PORT, a URL as given (no trailing slash)."""
    server = server.strip().rstrip("/")
    return server if "://" in server else f"{scheme}://{server}"


class ClusterError(Exception):
    """An answer other than success: `status` (0: unreachable), the problem's `reason`
    and `detail`, and `leader` (the leader's HTTP address, if the answer named it)."""

    def __init__(self, status: int, reason: str, detail: str, leader: str = "") -> None:
        super().__init__(f"{detail} ({status} {reason})" if status else detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.leader = leader

    @property
    def retryable(self) -> bool:
        return self.status in (0, 429, 503, 504)


class KeyInClearError(ClusterError):
    """The request would carry the client key in clear (plain http to a host that is not
    loopback): refused before anything is sent, not retryable."""

    @property
    def retryable(self) -> bool:
        return False


@dataclass
class Answer:
    status: int
    body: Any


def request_json(server: str, method: str, path: str, body: Any = None, timeout_s: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, *, send_key: bool = True) -> Answer:
    """One HTTP request; a 2xx answer is returned (JSON-decoded body, None if empty),
    anything else raises `ClusterError` (status 0 when the server cannot be reached).
    With `ssl_context`, a bare HOST:PORT means https and the server is verified with it.
    With `send_key`, `$DOQ_KEY` goes along, but never in clear to a host that is not
    loopback (`KeyInClearError`, before anything is sent) nor to a redirect's target."""
    from doq.client_cli import check_key_transport

    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    url = base_url(server, "https" if ssl_context else "http") + path
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    if not send_key:
        req.doq_keyless = True  # type: ignore[attr-defined]  # the CLI's key handler adds none either
    if send_key and (key := os.environ.get("DOQ_KEY", "").strip()):  # the client key (a joining node's too)
        try:
            check_key_transport(url)  # never in clear to a host that is not loopback
        except DoqError as e:
            raise KeyInClearError(0, e.reason, e.message) from None
        req.add_unredirected_header("Authorization", f"Bearer {key}")  # not to a redirect's target
    try:
        with _opener(ssl_context).open(req, timeout=timeout_s) as resp:
            raw = resp.read()
            return Answer(resp.status, json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        with e:
            raw = e.read()
            leader = e.headers.get(LEADER_HEADER, "") if e.headers else ""
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ClusterError(e.code, "HTTP_ERROR", raw.decode(errors="replace")[:200] or str(e.reason),
                               leader) from None
        return _raise_problem(e.code, doc, leader)
    except http.client.HTTPException as e:  # not HTTP/1.1: e.g. a gRPC port
        from doq.client_cli import describe_error

        raise ClusterError(0, "NOT_HTTP", describe_error(base_url(server), e)) from None
    except (OSError, ValueError) as e:  # URLError, refused, timeout, bad JSON in a 2xx
        from doq.client_cli import describe_error

        detail = describe_error(base_url(server), e) if isinstance(e, OSError) else f"{base_url(server)}: {e}"
        raise ClusterError(0, "UNREACHABLE", detail) from None


def _opener(ssl_context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """This process's opener (the CLI's, with its connect timeout and CA) or one verifying
    with `ssl_context`; either follows a redirect to another origin without the key."""
    from doq.client_cli import KeySafeRedirect

    if ssl_context is None:
        installed = urllib.request._opener  # type: ignore[attr-defined]  # the CLI's (use_key, use_ca_file)
        if installed is not None:
            return installed  # type: ignore[no-any-return]
        return urllib.request.build_opener(KeySafeRedirect)
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=ssl_context), KeySafeRedirect)


def _raise_problem(status: int, doc: dict[str, Any], leader: str) -> Any:
    hint = str(doc.get("leader_hint") or "")
    if not leader and _is_host_port(hint):
        leader = hint
    raise ClusterError(status, str(doc.get("reason", "")), str(doc.get("detail", "")), leader)


def _is_host_port(s: str) -> bool:
    host, sep, port = s.rpartition(":")
    return bool(sep and host and port.isdigit())


# -- the client calls behind `doq cluster` ---------------------------------------------


def get_status(server: str, timeout_s: float = 10.0) -> ClusterStatus:
    return status_from_json(request_json(server, "GET", "/cluster", timeout_s=timeout_s).body)


def remove_member(server: str, node_id: str, timeout_s: float = 30.0) -> None:
    from urllib.parse import quote

    request_json(server, "DELETE", f"/cluster/members/{quote(node_id, safe='')}", timeout_s=timeout_s)


def transfer_leader(server: str, target: str | None = None, timeout_s: float = 30.0) -> str:
    """Ask for a leadership transfer; returns the new leader's id."""
    body = {"target": target} if target else {}
    return str(request_json(server, "POST", "/cluster/transfer-leader", body, timeout_s=timeout_s).body["leader_id"])


# -- joining -----------------------------------------------------------------------------


def join_cluster(
    join_addrs: Sequence[str],
    node_id: str,
    addrs: MemberAddrs,
    *,
    timeout_s: float = 60.0,
    request_timeout_s: float = 10.0,
    backoff_initial_s: float = 0.1,
    backoff_max_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    empty: bool = False,
    cluster_id: str = "",
    ssl_context: ssl.SSLContext | None = None,
) -> ClusterStatus:
    """Ask an existing cluster to add this node (`POST /cluster/join`) and return the
    cluster's status after the add, so the new node learns its peers.

    `join_addrs` are HTTP addresses (HOST:PORT or URLs) of any members. Each round tries
    them in order; a 503 that names the leader (`X-Doq-Leader`, or a HOST:PORT
    `leader_hint`) is followed at once. Unreachable nodes and retryable answers (429,
    503, 504) are retried in rounds with jittered exponential backoff until `timeout_s`
    has passed; then, or on any other error (e.g. 409: the id is taken with other
    addresses, 409 CLUSTER_MISMATCH), raises `ClusterError`. Blocking: call it in a thread
    from async code.

    The request carries this node's store id (`addrs.store_id`), whether its store is
    `empty`, and the `cluster_id` it means to join ("" if any): the leader replaces a known
    member that comes back with another store, and refuses another cluster's joiner. The
    answer's cluster id must be `cluster_id` too (a joiner never joins another cluster).
    With `ssl_context` (a secure node), bare addresses mean https, verified with it.
    """
    if not join_addrs:
        raise ValueError("join_cluster needs at least one address")
    rng = rng or random.Random()
    body: dict[str, Any] = {"node_id": node_id, "raft_addr": addrs.raft_addr, "grpc_addr": addrs.grpc_addr,
                            "http_addr": addrs.http_addr}
    if addrs.store_id:
        body["store_id"] = addrs.store_id
    if empty:
        body["empty"] = True
    if cluster_id:
        body["cluster_id"] = cluster_id
    deadline = time.monotonic() + timeout_s
    attempt = 0
    last: ClusterError | None = None
    while True:
        tried: set[str] = set()
        scheme = "https" if ssl_context else "http"
        todo = [base_url(a, scheme) for a in join_addrs]
        while todo:
            server = todo.pop(0)
            if server in tried:
                continue
            tried.add(server)
            try:
                answer = request_json(server, "POST", "/cluster/join", body, timeout_s=request_timeout_s,
                                      ssl_context=ssl_context)
                status = status_from_json(answer.body)
                if cluster_id and status.cluster_id != cluster_id:
                    raise ClusterError(409, "CLUSTER_MISMATCH", f"{server} answered for cluster "
                                       f"{status.cluster_id or '(no id)'}, not {cluster_id}")
                log.info("joined the cluster through %s (leader %s)", server, status.leader_id or "?")
                return status
            except ClusterError as e:
                if not e.retryable:
                    raise
                last = e
                log.info("join through %s: %s", server, e)
                if e.leader:
                    todo.insert(0, base_url(e.leader, scheme))
            except ValueError as e:  # a 2xx that is not a status: not a doq node
                raise ClusterError(0, "BAD_ANSWER", f"{server}: {e}") from None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            assert last is not None
            raise ClusterError(last.status, last.reason, f"could not join the cluster in {timeout_s:g}s "
                               f"through {', '.join(join_addrs)}: {last.detail}", last.leader)
        delay = min(backoff_max_s, backoff_initial_s * 2 ** min(attempt, 16)) * rng.uniform(0.5, 1.0)
        attempt += 1
        sleep(min(delay, remaining))
