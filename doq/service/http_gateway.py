"""HTTP/JSON gateway over the `QueueService` facade (FastAPI, served by uvicorn in the node's loop).

Paths follow the seed (`/API/v1/queues/...`, `/db/backup`, `/db/restore`); the OpenAPI
document is at `/openapi.json`, Swagger UI at `/docs` and ReDoc at `/redoc`, the dashboard
at `/ui` with its live stream `/events`, all offline.
Errors are `application/problem+json` with the status from `doq.errors.STATUS_TABLE`.
See docs/http.md.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from doq.auth.authorizer import Authorizer
from doq.service.http.auth_door import install_audit, install_auth
from doq.service.http.bodylimit import BodyLimitMiddleware
from doq.service.http.browser_guard import BrowserGuard
from doq.service.http.cluster import build_cluster_router
from doq.service.http.docs import install_docs
from doq.service.http.forward import install_leader_forwarding
from doq.service.http.groups import build_groups_router
from doq.service.http.keys import build_keys_router
from doq.service.http.ops import build_ops_router
from doq.service.http.problems import install_handlers
from doq.service.http.redrive import build_redrive_router
from doq.service.http.routes import build_router
from doq.service.http.ui import build_ui_router
from doq.service.limits import Limits
from doq.service.rate_history import RateHistory

if TYPE_CHECKING:
    from doq.service.api import QueueService
    from doq.service.enrollment import Enrollment
    from doq.service.tls_admin import TlsAdmin

RESTORE_PATH = "/db/restore"

DESCRIPTION = """\
doq: a durable, replicated queue. Every change answers only after it is fsynced (and
replicated to a majority).

* Message `content` is a JSON **string**: UTF-8 text (a JSON document is sent as a string,
  e.g. `"{\\"user_id\\": 1}"`), or base64 with `"content_encoding": "base64"`.
* Message ids are unsigned 64-bit integers, sent as **strings** (`"id": "123"`); requests
  accept a string or an integer.
* Dequeue (`GET .../messages`) answers **204 No Content** when nothing is deliverable.
* Errors are `application/problem+json` with a stable `reason`, `retryable` and `leader_hint`.
"""


def body_limits(max_message_bytes: int) -> tuple[int, int]:
    """(single-message body limit, batch body limit) for a max message size (`Limits.body_limits`)."""
    return Limits(max_message_bytes=max_message_bytes).body_limits()


# Tried first when matching a request (routes are tried in order; no two paths overlap,
# so the order changes only the cost of matching, not which route answers).
HOT_ROUTES = ("enqueue", "dequeue", "ack", "enqueue_batch", "dequeue_batch", "ack_batch")
# FastAPI >= 0.16x checks per request whether OpenTelemetry is configured (environment
# look-ups on every request). doq exports Prometheus metrics; switch it off where offered.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {}
)


def create_app(api: QueueService, authorizer: Authorizer | None = None, *, loopback_http: bool = False,
               forward_ssl: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
               enrollment: Enrollment | None = None, history: RateHistory | None = None,
               tls_admin: TlsAdmin | None = None) -> FastAPI:
    """The gateway application for one service facade: `authorizer` checks client keys
    (default: keys not required, a presented key checked; see doq.auth), `forward_ssl` is
    how a follower reaches its leader over HTTPS, and `enrollment` serves the join-token
    routes on a secure node, `tls_admin` its certificate routes; `history` (the node's `RateHistory`) answers
    `GET /API/v1/queues/{name}/history`. A node that requires no keys refuses browsers of other sites
    (`doq.service.http.browser_guard`; `loopback_http`: its HTTP address is loopback, so
    only loopback Host names are answered)."""
    if authorizer is None:
        authorizer = Authorizer(api.node.state.keys, required=False)
    app = FastAPI(
        **_NO_TELEMETRY,
        title="doq",
        version="1.0.0",
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        openapi_tags=[
            {"name": "queues", "description": "Create, inspect, update, purge and delete queues."},
            {"name": "messages", "description": "Enqueue, dequeue, ack, nack, touch, re-prioritise."},
            {"name": "backup", "description": "Full and incremental backups, online restore."},
            {"name": "health", "description": "Liveness, readiness and Prometheus metrics."},
            {"name": "cluster", "description": "Members, leadership, joining and removing nodes."},
            {"name": "keys", "description": "Client keys and their scopes (admin)."},
        ],
    )
    install_handlers(app)
    # Routes are added flat (not as included sub-routers): one route match per request.
    for router in (build_router(api), build_ops_router(api), build_cluster_router(api),
                   build_keys_router(api.node), build_ui_router(api, history=history),
                   build_redrive_router(api), build_groups_router(api)):
        app.router.routes.extend(router.routes)
    if enrollment is not None:
        from doq.service.http.enroll import build_enroll_router

        app.router.routes.extend(build_enroll_router(enrollment, loopback_only=not authorizer.required).routes)
    if tls_admin is not None:  # a secure node's certificate routes (doq.service.http.tls_routes)
        from doq.service.http.tls_routes import build_tls_router

        app.router.routes.extend(build_tls_router(tls_admin).routes)
    install_docs(app)
    # The document lists paths in declaration order; requests try the hot routes first.
    app.state.openapi_routes = list(app.router.routes)
    hot = {name: i for i, name in enumerate(HOT_ROUTES)}
    app.router.routes.sort(key=lambda r: hot.get(getattr(r, "name", ""), len(hot)))
    install_audit(app, authorizer, api.node.node_id)  # inside the forwarding: this node's own actions
    install_leader_forwarding(app, api.node, forward_ssl)  # inside the body limit: added before it
    install_auth(app, authorizer)  # outside the forwarding: a follower checks, the leader again
    if not authorizer.required:  # no keys: keep browsers of other sites out (doq.service.http.browser_guard)
        app.add_middleware(BrowserGuard, loopback_http=loopback_http)
    single, batch = api.limits.body_limits()
    app.add_middleware(
        BodyLimitMiddleware,
        limit_for=lambda path: batch if path.endswith((":batch", ":ack")) else single,
        streamed={RESTORE_PATH: api.limits.max_restore_bytes},
    )
    return app
