"""The audit trail of admin actions: one structured log line and one counter per action.

Every admin action the authorization table marks (`Rule.audit`: queue.create/update/
delete/purge/redrive/redrive_cancel, key.create/revoke, member.add/remove, join_token.create, leader.transfer,
backup, restore) is logged by the node that serves it (a follower that relays a call to the
leader leaves it to the leader) on the logger `doq.audit` at INFO, also when `--log-level`
is higher, as one JSON object:

    {"audit": "queue.delete", "key": "3f2a9c1b7d4e", "target": "orders", "result": "ok",
     "ts_ms": 1764150000123, "node": "node-1"}

`key` is the key's id (never its secret; "anonymous" on an open node without a key;
"jointoken:<token id>" for an enrollment's member add, `doq.service.enrollment`),
`result` "ok" or the refusal's reason / status name. Counted in
`doq_audit_events_total{action,result}` ("ok" or "error", so the label set stays small).
"""

from __future__ import annotations

import json
import logging
import time

from prometheus_client import Counter

log = logging.getLogger("doq.audit")
log.setLevel(logging.INFO)  # logged whatever --log-level says (it sets the root logger's level)
AUDIT_EVENTS = Counter("doq_audit_events_total", "Admin actions served by this node", ["action", "result"])
ANONYMOUS = "anonymous"


def record(action: str, key_id: str, target: str, result: str, node_id: str = "") -> None:
    """Log and count one admin action (`result`: "ok", or why it failed)."""
    AUDIT_EVENTS.labels(action, "ok" if result == "ok" else "error").inc()
    log.info("%s", json.dumps({"audit": action, "key": key_id or ANONYMOUS, "target": target[:200],
                               "result": result, "ts_ms": int(time.time() * 1000), "node": node_id},
                              separators=(",", ":")))
