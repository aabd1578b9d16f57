"""The one authorization table: every RPC and every HTTP route, the scope it needs, where
its queue name comes from, and the admin action it audits.

Both doors read only this table (`doq.auth.grpc_door`, `doq.service.http.auth_door`); a test walks
the proto's service descriptors and the OpenAPI document and fails on any RPC or route
that is missing here. Something not in the table is refused to every key but `admin`
(fail closed) on the doq service and the HTTP gateway.

A `Rule`'s `scopes` are alternatives (a key needs one of them, for the call's queue when
the rule names one); `admin` grants every rule. `OPEN`: no key needed (health, the API
documents). `ANY_KEY`: any valid key (a client's view of the cluster).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    scopes: tuple[str, ...]  # () with open=True: no key; ("*",): any valid key
    queue: str = ""  # gRPC: the request field; HTTP: the path parameter ("" = none)
    audit: str = ""  # the admin action logged and counted (`doq.auth.audit`), "" = none
    open: bool = False
    first_request_only: bool = False  # a stream whose first request names the queue for the call

    @property
    def any_key(self) -> bool:
        return self.scopes == ("*",)


OPEN = Rule((), open=True)
ANY_KEY = Rule(("*",))
READ = ("produce", "consume", "metrics")


def _admin(audit: str = "", queue: str = "") -> Rule:
    return Rule(("admin",), queue=queue, audit=audit)


DOQ_SERVICE = "/doq.v1.DOQ/"
BATCH_QUEUES = "messages[].queue_name,columns.queue_name"
"""The queues of an EnqueueBatchRequest: each message's, and the columns'."""

GRPC_RULES: dict[str, Rule] = {DOQ_SERVICE + name: rule for name, rule in {
    "CreateQueue": _admin("queue.create", "name"),
    "UpdateQueue": _admin("queue.update", "name"),
    "DeleteQueue": _admin("queue.delete", "name"),
    "PurgeQueue": _admin("queue.purge", "name"),
    "GetQueue": Rule(READ, "name"),
    "ListQueues": Rule(READ),
    "Enqueue": Rule(("produce",), "queue_name"),
    "EnqueueBatch": Rule(("produce",), BATCH_QUEUES),
    "EnqueueStream": Rule(("produce",), "queue_name"),
    "EnqueueBatchStream": Rule(("produce",), BATCH_QUEUES),
    "Dequeue": Rule(("consume",), "queue_name"),
    "DequeueStream": Rule(("consume",), "queue_name", first_request_only=True),
    "DequeueBatchStream": Rule(("consume",), "queue_name", first_request_only=True),
    "Get": Rule(("consume",), "queue_name"),
    "Peek": Rule(("consume",), "queue_name"),  # reads message contents, as GET ...messages:peek
    "Delete": Rule(("consume",), "queue_name"),
    "Ack": Rule(("consume",), "queue_name"),
    "AckBatch": Rule(("consume",), "queue_name"),
    "Nack": Rule(("consume",), "queue_name"),
    "Touch": Rule(("consume",), "queue_name"),
    "UpdatePriority": Rule(("produce",), "queue_name"),
    "SetGroupPolicy": _admin("queue.update", "queue_name"),  # a fair queue group's weight / rate
    "ListGroups": Rule(READ, "queue_name"),  # counts and policies only, like GetQueue
    "ListServers": ANY_KEY,
    "CreateKey": _admin("key.create"),
    "ListKeys": _admin(),
    "RevokeKey": _admin("key.revoke"),
    "StartRedrive": _admin("queue.redrive", "queue_name"),
    "CancelRedrive": _admin("queue.redrive_cancel", "queue_name"),
    "GetRedrive": Rule(READ, "queue_name"),
}.items()}
"""doq.v1.DOQ methods (full names). Other services (grpc.health.v1, reflection) are open."""

_Q = "/API/v1/queues/{name}"
_M = _Q + "/messages/{id}"
HTTP_RULES: dict[tuple[str, str], Rule] = {
    ("POST", "/API/v1/queues"): _admin("queue.create"),
    ("GET", "/API/v1/queues"): Rule(READ),
    ("GET", _Q): Rule(READ, "name"),
    ("PUT", _Q): _admin("queue.update", "name"),
    ("DELETE", _Q): _admin("queue.delete", "name"),
    ("POST", _Q + "/purge"): _admin("queue.purge", "name"),
    ("POST", _Q + "/messages"): Rule(("produce",), "name"),
    ("POST", _Q + "/messages:batch"): Rule(("produce",), "name"),
    ("GET", _Q + "/messages"): Rule(("consume",), "name"),
    ("GET", _Q + "/messages:peek"): Rule(("consume",), "name"),  # reads message contents
    ("GET", _Q + "/groups"): Rule(READ, "name"),  # counts only, like GET queue
    ("GET", _Q + "/history"): Rule(READ, "name"),  # counters over time, like GET queue
    ("POST", _Q + "/redrive"): _admin("queue.redrive", "name"),
    ("DELETE", _Q + "/redrive"): _admin("queue.redrive_cancel", "name"),
    ("GET", _Q + "/redrive"): Rule(READ, "name"),  # progress counts only, like GET queue
    ("PUT", _Q + "/groups/{group}"): _admin("queue.update", "name"),  # a group's weight / rate
    ("DELETE", _Q + "/groups/{group}"): _admin("queue.update", "name"),
    ("POST", _Q + "/messages:dequeue"): Rule(("consume",), "name"),
    ("POST", _Q + "/messages:ack"): Rule(("consume",), "name"),
    ("GET", _M): Rule(("consume",), "name"),
    ("DELETE", _M): Rule(("consume",), "name"),
    ("POST", _M + "/ack"): Rule(("consume",), "name"),
    ("POST", _M + "/nack"): Rule(("consume",), "name"),
    ("POST", _M + "/touch"): Rule(("consume",), "name"),
    ("PUT", _M + "/priority"): Rule(("produce",), "name"),
    ("GET", "/livez"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/metrics"): Rule(("metrics",)),
    ("POST", "/db/backup"): Rule(("backup",), audit="backup"),
    ("GET", "/db/digest"): Rule(("backup",)),
    ("POST", "/db/restore"): Rule(("restore",), audit="restore"),
    ("GET", "/cluster"): ANY_KEY,
    # the store's identity (node, store and cluster ids; no secret): a Kubernetes start
    # probe reads it before any key exists (doq.k8s_start)
    ("GET", "/cluster/identity"): OPEN,
    ("POST", "/cluster/join"): _admin("member.add"),
    ("DELETE", "/cluster/members/{node_id}"): _admin("member.remove"),
    ("POST", "/cluster/transfer-leader"): _admin("leader.transfer"),
    # join tokens (a secure node's): a token is worth the cluster CA; the CA certificate is
    # public; an enrollment is authenticated by the join token it spends (doq.tls.enrollment)
    ("POST", "/cluster/join-tokens"): _admin("join_token.create"),
    ("GET", "/cluster/ca"): OPEN,
    ("POST", "/cluster/enroll"): OPEN,
    # certificates (a secure node's; doq.service.http.tls_routes): certificates are public,
    # changing what a node serves or trusts is an admin action
    ("GET", "/cluster/tls"): ANY_KEY,
    ("POST", "/cluster/tls/renew"): _admin("tls.renew"),
    ("POST", "/cluster/tls/sign"): _admin("tls.sign"),
    ("PUT", "/cluster/tls/trust"): _admin("tls.trust"),
    ("POST", "/cluster/tls/ca/begin"): _admin("tls.ca_begin"),
    ("POST", "/cluster/tls/ca/promote"): _admin("tls.ca_promote"),
    ("POST", "/cluster/tls/reload"): _admin("tls.reload"),
    ("POST", "/API/v1/keys"): _admin("key.create"),
    ("GET", "/API/v1/keys"): _admin(),
    ("DELETE", "/API/v1/keys/{key_id}"): _admin("key.revoke"),
    # the API documents and Swagger UI's offline assets: no data, and the schema is public
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/redoc"): OPEN,
    # the dashboard: the page is static (no data, nothing of the node); its data comes from
    # /events, which needs a key that may read the node's state (docs/security.md)
    ("GET", "/ui"): OPEN,
    ("GET", "/events"): Rule(READ),
}
"""(method, path template) of the HTTP gateway. HEAD is checked as GET."""

OPEN_PATH_PREFIXES = ("/static/",)
"""Paths served as files (Swagger UI's assets): open."""

UNLISTED = _admin()
"""What a doq.v1.DOQ method or an HTTP route missing from the tables needs: admin."""
