"""The client door on a real secure three-node cluster (`doq serve --secure` processes on
127.0.0.1, real LMDB, real gRPC and HTTP over TLS verified with the cluster CA; the
members join with join tokens; nothing faked).

Generated from the node's own OpenAPI document and the proto's service descriptors, so a
route or RPC added later cannot be forgotten: every one must be in the authorization
table (`doq.auth.table`), and every one that needs a key refuses a call without one
(401 / UNAUTHENTICATED), with a key of the wrong scope or queue prefix (403 /
PERMISSION_DENIED), and with a key revoked through another member than the one asked.
Health endpoints answer without a key. Also: keys created and revoked with `doq keys`,
the admin key file, audit lines, and no secret in logs, metrics, `/cluster`, errors or a
backup.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from doq.auth.table import BATCH_QUEUES, GRPC_RULES, HTTP_RULES, OPEN_PATH_PREFIXES, Rule
from tests.support.cluster import until
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

NON_ADMIN = ("produce", "consume", "backup", "restore", "metrics")
PARAMS = {"name": "q", "id": "1", "node_id": "node-9", "key_id": "abc123", "group": "g"}
SERVICE = pb.DESCRIPTOR.services_by_name["DOQ"]


def http(node: NodeProc, method: str, path: str, key: str | None = None, body: Any = None,
         raw: bool = False) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(node.http_url + path, data=data, method=method, headers=headers)
    try:
        with node.urlopen(req, timeout=60) as r:
            content = r.read()
            return r.status, content if raw else (json.loads(content) if content else None), dict(r.headers)
    except urllib.error.HTTPError as e:
        content = e.read()
        try:
            doc = json.loads(content)
        except ValueError:
            doc = content
        return e.code, doc, dict(e.headers)


def ok(node: NodeProc, method: str, path: str, key: str, body: Any = None) -> Any:
    status, doc, _ = http(node, method, path, key, body)
    assert 200 <= status < 300, (method, path, status, doc)
    return doc


class Cluster:
    def __init__(self, nodes: list[NodeProc], admin: str) -> None:
        self.nodes = nodes
        self.admin = admin
        self.keys: dict[str, str] = {}  # name -> token

    def key(self, name: str, *scopes: str) -> str:
        doc = ok(self.nodes[0], "POST", "/API/v1/keys", self.admin, {"scopes": list(scopes)})
        self.keys[name] = doc["key"]
        return str(doc["key"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("secure")
    nodes = [NodeProc(data, node_id=f"node-{i}", extra_args=["--secure"]) for i in (1, 2, 3)]
    try:
        nodes[0].start()
        key_file = data / "admin.key"
        until("the admin key file", key_file.exists)
        admin = key_file.read_text().strip()
        for n in nodes[1:]:  # each enrolls with a join token (created with the admin key)
            token = ok(nodes[0], "POST", "/cluster/join-tokens", admin, {"ttl_s": 600})["token"]
            n.extra_args += ["--join", f"127.0.0.1:{nodes[0].http_port}"]
            n.env["DOQ_JOIN_TOKEN"] = token
            n.start(timeout_s=90)

        def voters() -> bool:
            status, doc, _ = http(nodes[0], "GET", "/cluster", admin)
            return status == 200 and sorted(m["node_id"] for m in doc["members"] if m["role"] == "voter") == [
                "node-1", "node-2", "node-3"]

        until("three voters", voters, 90)
        c = Cluster(nodes, admin)
        ok(nodes[0], "POST", "/API/v1/queues", admin, {"name": "q", "type": "delayed"})
        c.key("backup_restore", "backup", "restore")
        c.key("data", "produce", "consume", "metrics")
        c.key("prefix", "produce:zz", "consume:zz")
        c.key("revoked", "admin")
        yield c
    finally:
        for n in nodes:
            n.kill9()


# -- the table covers everything ------------------------------------------------------------
def _operations(node: NodeProc) -> list[tuple[str, str]]:
    status, doc, _ = http(node, "GET", "/openapi.json")
    assert status == 200
    return [(m.upper(), p) for p, item in doc["paths"].items() for m in item]


def _path(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], template)


def test_every_route_and_rpc_is_in_the_authorization_table(cluster: Cluster) -> None:
    ops = _operations(cluster.nodes[1])
    assert len(ops) > 20 and ("POST", "/cluster/join") in ops and ("POST", "/API/v1/keys") in ops
    missing = [op for op in ops if op not in HTTP_RULES]
    assert not missing, f"routes missing from doq.auth.table.HTTP_RULES: {missing}"
    rpcs = [f"/doq.v1.DOQ/{m.name}" for m in SERVICE.methods]
    assert not [r for r in rpcs if r not in GRPC_RULES], "RPCs missing from doq.auth.table.GRPC_RULES"
    assert not set(GRPC_RULES) - set(rpcs), "rules for RPCs that do not exist"


def _wrong_key(c: Cluster, rule: Rule) -> str:
    return c.keys["data"] if set(rule.scopes) & {"backup", "restore"} else c.keys["backup_restore"]


def test_every_http_route_refuses_no_key_a_wrong_key_and_a_wrong_prefix(cluster: Cluster) -> None:
    asked = cluster.nodes[2]  # a follower or the leader: the check is the same on every member
    checked = 0
    for method, template in _operations(asked):
        rule, path = HTTP_RULES[(method, template)], _path(template)
        if rule.open:
            status, _, _ = http(asked, method, path, raw=True)
            assert status not in (401, 403), (method, template)
            continue
        status, doc, headers = http(asked, method, path, body={})
        assert (status, doc["reason"]) == (401, "KEY_REQUIRED"), (method, template, status, doc)
        assert headers.get("www-authenticate", headers.get("WWW-Authenticate")) == "Bearer"
        status, doc, _ = http(asked, method, path, "doq_000000000000_not-a-key", body={})
        assert (status, doc["reason"]) == (401, "INVALID_KEY"), (method, template)
        if not rule.any_key:
            status, doc, _ = http(asked, method, path, _wrong_key(cluster, rule), body={})
            assert (status, doc["reason"]) == (403, "SCOPE_REQUIRED"), (method, template, status, doc)
        if rule.queue and set(rule.scopes) <= {"produce", "consume", "metrics"}:
            status, doc, _ = http(asked, method, path, cluster.keys["prefix"], body={})
            assert status == 403, (method, template, status, doc)
        checked += 1
    assert checked > 20
    for path in ("/livez", "/readyz", "/openapi.json", "/docs", "/redoc", "/ui", "/cluster/identity", "/cluster/ca"):
        assert http(asked, "GET", path, raw=True)[0] == 200, path
    assert OPEN_PATH_PREFIXES == ("/static/",)


def _request(method: Any, queue: str = "q") -> Any:
    cls = message_factory.GetMessageClass(method.input_type)
    req = cls()
    rule = GRPC_RULES[f"/doq.v1.DOQ/{method.name}"]
    if rule.queue == BATCH_QUEUES:
        req.columns.queue_name = queue
        req.columns.contents.append(b"x")
    elif rule.queue:
        setattr(req, rule.queue, queue)
    return req


def _grpc_code(channel: grpc.Channel, method: Any, key: str | None) -> grpc.StatusCode:
    full = f"/doq.v1.DOQ/{method.name}"
    md = [("authorization", f"Bearer {key}")] if key else []
    req = _request(method)
    ser = type(req).SerializeToString
    de = message_factory.GetMessageClass(method.output_type).FromString
    try:
        if method.client_streaming:
            call = channel.stream_stream(full, request_serializer=ser, response_deserializer=de)
            for _ in call(iter([req]), metadata=md, timeout=30):
                pass
        elif method.server_streaming:
            for _ in channel.unary_stream(full, request_serializer=ser, response_deserializer=de)(
                    req, metadata=md, timeout=30):
                pass
        else:
            channel.unary_unary(full, request_serializer=ser, response_deserializer=de)(req, metadata=md, timeout=30)
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_every_rpc_refuses_no_key_a_wrong_key_and_a_wrong_prefix(cluster: Cluster) -> None:
    with cluster.nodes[1].grpc_channel() as ch:
        for method in SERVICE.methods:
            rule = GRPC_RULES[f"/doq.v1.DOQ/{method.name}"]
            assert _grpc_code(ch, method, None) == grpc.StatusCode.UNAUTHENTICATED, method.name
            assert _grpc_code(ch, method, "doq_000000000000_x") == grpc.StatusCode.UNAUTHENTICATED, method.name
            if not rule.any_key:
                assert _grpc_code(ch, method, _wrong_key(cluster, rule)) == grpc.StatusCode.PERMISSION_DENIED, \
                    method.name
            if rule.queue and set(rule.scopes) <= {"produce", "consume", "metrics"}:
                assert _grpc_code(ch, method, cluster.keys["prefix"]) == grpc.StatusCode.PERMISSION_DENIED, \
                    method.name
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="doq.v1.DOQ"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_key_revoked_through_one_member_is_refused_by_another(cluster: Cluster) -> None:
    revoked = cluster.keys["revoked"]
    asked, revoker = cluster.nodes[2], cluster.nodes[1]
    assert http(asked, "GET", "/API/v1/queues", revoked)[0] == 200
    key_id = revoked.split("_")[1]
    ok(revoker, "DELETE", f"/API/v1/keys/{key_id}", cluster.admin)
    until("the revocation applied on node-3", lambda: http(asked, "GET", "/API/v1/queues", revoked)[0] == 401)
    for method, template in _operations(asked):
        if not HTTP_RULES[(method, template)].open:
            status, doc, _ = http(asked, method, _path(template), revoked, body={})
            assert (status, doc["reason"]) == (401, "INVALID_KEY"), (method, template)
    with asked.grpc_channel() as ch:
        for method in SERVICE.methods:
            assert _grpc_code(ch, method, revoked) == grpc.StatusCode.UNAUTHENTICATED, method.name


def test_scoped_keys_do_their_work_and_the_prefix_limits_the_queue(cluster: Cluster) -> None:
    from doq_client import DoqClient, PermissionDenied

    n = cluster.nodes[2]
    ok(n, "POST", "/API/v1/queues", cluster.admin, {"name": "orders.eu", "type": "delayed"})
    prod = cluster.key("prod_orders", "produce:orders.")
    cons = cluster.key("cons_orders", "consume:orders.")
    targets = ",".join(x.grpc_addr for x in cluster.nodes)
    ca = str(cluster.nodes[0].ca_file)
    with DoqClient(targets, key=prod, ca_file=ca) as c:
        p = c.producer()
        ids = [p.enqueue("orders.eu", b"m%d" % i).result().id for i in range(10)]
        p.close()
        with pytest.raises(PermissionDenied):
            c.enqueue("q", b"x")
        with pytest.raises(PermissionDenied):
            c.dequeue("orders.eu")
    with DoqClient(targets, key=cons, ca_file=ca) as c:
        got = []
        with c.consumer("orders.eu", prefetch=4) as consumer:
            for m in consumer:
                consumer.ack(m)
                got.append(m.id)
                if len(got) == 10:
                    break
        assert sorted(got) == sorted(ids)
        until("the acks applied", lambda: c.get_queue("orders.eu").stats.total == 0)
        with pytest.raises(PermissionDenied):
            c.create_queue("orders.us")
    # the seed's HTTP ack (no lease) under a key that may consume the queue
    ok(n, "POST", "/API/v1/queues/orders.eu/messages", prod, {"content": "seed"})
    m = ok(n, "GET", "/API/v1/queues/orders.eu/messages", cons)
    ok(n, "POST", f"/API/v1/queues/orders.eu/messages/{m['id']}/ack", cons)


def test_doq_keys_commands_create_list_and_revoke(cluster: Cluster) -> None:
    env = {**os.environ, "DOQ_KEY": cluster.admin, "DOQ_SERVER": cluster.nodes[1].http_url,
           "DOQ_CA_FILE": str(cluster.nodes[1].ca_file)}

    def doq(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "doq", "keys", *args], capture_output=True, text=True,
                             env=env, timeout=60, check=True)
        return out.stdout

    created = json.loads(doq("create", "--scope", "produce:a.", "--scope", "metrics", "--json"))
    assert set(created) == {"id", "key", "scopes"} and created["scopes"] == ["produce:a.", "metrics"]
    listed = json.loads(doq("list", "--json"))["keys"]
    assert created["id"] in [k["id"] for k in listed]
    assert created["key"] not in json.dumps(listed)
    assert created["id"] in doq("list")
    doq("revoke", created["id"])
    assert created["id"] not in [k["id"] for k in json.loads(doq("list", "--json"))["keys"]]
    refused = subprocess.run([sys.executable, "-m", "doq", "keys", "list", "--key", created["key"]],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
    assert refused.returncode == 1 and "401" in refused.stderr


def test_admin_key_file_is_0600_and_audit_lines_name_the_key_id_only(cluster: Cluster) -> None:
    n = cluster.nodes[0]
    key_file = n.data_dir / "admin.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text() == cluster.admin + "\n"
    status, _, _ = http(cluster.nodes[1], "POST", "/API/v1/queues/q/purge", cluster.admin)
    assert status == 200
    admin_id = cluster.admin.split("_")[1]

    def audit_line() -> dict[str, Any] | None:
        for node in cluster.nodes:
            for line in node.log().splitlines():
                if '"audit":"queue.purge"' in line:
                    return dict(json.loads(line[line.index("{"):]))
        return None

    line = until("the purge's audit line", audit_line)
    assert line["key"] == admin_id and line["target"] == "q" and line["result"] == "ok"
    status, doc, _ = http(n, "GET", "/metrics", cluster.keys["data"], raw=True)
    assert re.search(rb'doq_audit_events_total\{action="key.create",result="ok"\} [1-9]', doc)


def test_no_secret_in_logs_metrics_cluster_errors_or_backups(cluster: Cluster, tmp_path: Path) -> None:
    n = cluster.nodes[0]
    backup_key = cluster.keys["backup_restore"]
    status, body, headers = http(n, "POST", "/db/backup", backup_key, {"since": 0}, raw=True)
    assert status == 200 and body
    texts = {
        "metrics": http(n, "GET", "/metrics", cluster.keys["data"], raw=True)[1].decode(),
        "cluster": json.dumps(http(n, "GET", "/cluster", cluster.keys["data"])[1]),
        "error": json.dumps(http(n, "GET", "/API/v1/keys", cluster.keys["data"])[1]),
        "backup headers": json.dumps(headers),
        "keys list": json.dumps(http(n, "GET", "/API/v1/keys", cluster.admin)[1]),
    }
    for node in cluster.nodes:
        texts[f"{node.node_id} log"] = node.log()
    # node-1's stdout is a file, not a terminal: the admin key is not printed at all
    assert "admin.key (mode 0600; not printed" in cluster.nodes[0].log()
    for name, token in [("admin", cluster.admin), *cluster.keys.items()]:
        secret = token.split("_", 2)[2]
        digest = hashlib.sha256(token.encode()).digest()
        for where, text in texts.items():
            assert secret not in text and digest.hex() not in text, (name, where)
        assert secret.encode() not in body and digest not in body, (name, "backup file")


def test_the_admin_key_is_made_once_and_kept_over_restarts(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, extra_args=["--secure"])
    try:
        node.start()
        key_file = tmp_path / "admin.key"
        until("the admin key file", key_file.exists)
        admin = key_file.read_text().strip()
        until("the admin key works", lambda: http(node, "GET", "/API/v1/keys", admin)[0] == 200)
        node.terminate()
        node.start()
        assert key_file.read_text().strip() == admin
        assert [k["scopes"] for k in ok(node, "GET", "/API/v1/keys", admin)["keys"]] == [["admin"]]
        assert node.log().count("admin key") == 1  # printed on the first start only
    finally:
        node.kill9()


def test_a_loopback_node_runs_the_seeds_curl_without_a_key(tmp_path: Path) -> None:
    node = NodeProc(tmp_path)
    try:
        node.start()
        assert http(node, "POST", "/API/v1/queues", body={"name": "user_indexing_queue", "type": "delayed"})[0] == 201
        assert not (tmp_path / "admin.key").exists()
        # without keys every caller may do everything: deleting an in-flight message needs no lease
        base = "/API/v1/queues/user_indexing_queue/messages"
        assert http(node, "POST", base, body={"content": "x"})[0] == 201
        held = http(node, "GET", base)[1]
        assert http(node, "DELETE", f"{base}/{held['id']}")[0] == 200
    finally:
        node.kill9()


async def test_the_async_client_takes_its_key_from_the_argument_or_doq_key(cluster: Cluster,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from doq_client import AsyncDoqClient, PermissionDenied, Unauthenticated

    targets = ",".join(x.grpc_addr for x in cluster.nodes)
    ca = str(cluster.nodes[0].ca_file)
    ok(cluster.nodes[0], "POST", "/API/v1/queues", cluster.admin, {"name": "jobs.a", "type": "delayed"})
    key = cluster.key("jobs", "produce:jobs.", "consume:jobs.")
    async with AsyncDoqClient(targets, ca_file=ca) as c:
        with pytest.raises(Unauthenticated):
            await c.list_queues()
    monkeypatch.setenv("DOQ_KEY", key)
    async with AsyncDoqClient(targets, ca_file=ca) as c:
        r = await c.enqueue("jobs.a", b"x")
        [m] = await c.dequeue("jobs.a")
        assert m.id == r.id
        await c.ack("jobs.a", m.id, lease_id=m.lease_id)
        with pytest.raises(PermissionDenied):
            await c.enqueue("q", b"x")
        with pytest.raises(PermissionDenied):
            await c.create_key(["admin"])
    async with AsyncDoqClient(targets, key=cluster.admin, ca_file=ca) as c:
        created = await c.create_key(["metrics"])
        assert created["key"].startswith("doq_") and created["scopes"] == ["metrics"]
        assert created["id"] in [k["id"] for k in await c.list_keys()]
        await c.revoke_key(created["id"])


# -- a prefix key lists only its queues --------------------------------------------------------
MINE, OTHER = "zz.mine", "secret-other"
PREFIX_SCOPES = {"produce", "consume"}
NOT_LISTINGS = {("POST", "/cluster/enroll")}  # spends a join token; answers the CA, never a queue


def _first_event(node: NodeProc, key: str) -> str:
    """The data of the first `snapshot` event of `GET /events` (the stream is then closed)."""
    req = urllib.request.Request(node.http_url + "/events", headers={"Authorization": f"Bearer {key}"})
    with node.urlopen(req, timeout=60) as r:
        assert r.status == 200
        for raw in r:
            line = raw.decode()
            if line.startswith("data:"):
                return line[5:].strip()
    raise AssertionError("no snapshot event")


def _listing_routes(node: NodeProc) -> list[tuple[str, str]]:
    """Every route a prefix key may call that names no queue in its path: where a queue
    name of another prefix could leak. All are GETs (a new non-GET one fails here)."""
    out = []
    for method, template in _operations(node):
        rule = HTTP_RULES[(method, template)]
        if rule.queue or "{" in template or (method, template) in NOT_LISTINGS:
            continue
        if rule.open or rule.any_key or set(rule.scopes) & PREFIX_SCOPES:
            assert method == "GET", f"a route a prefix key may call without a queue: {method} {template}"
            out.append((method, template))
    return out


def test_a_prefix_key_sees_only_its_queues_on_every_listing(cluster: Cluster) -> None:
    for name in (MINE, OTHER):
        status, doc, _ = http(cluster.nodes[0], "POST", "/API/v1/queues", cluster.admin, {"name": name, "type": "delayed"})
        assert status in (201, 409), doc
    prefix, data = cluster.keys["prefix"], cluster.keys["data"]  # produce:zz + consume:zz; unlimited
    routes = _listing_routes(cluster.nodes[0])
    assert {("GET", "/API/v1/queues"), ("GET", "/events"), ("GET", "/cluster")} <= set(routes)
    for node in cluster.nodes:  # the leader and both followers
        until(f"both queues on {node.node_id}", lambda node=node: OTHER in json.dumps(ok(node, "GET", "/API/v1/queues", data)))
        for method, template in routes:
            body = _first_event(node, prefix) if template == "/events" else http(node, method, template, prefix, raw=True)[1]
            text = body if isinstance(body, str) else body.decode(errors="replace")
            assert OTHER not in text, (node.node_id, method, template)
        listed = [q["name"] for q in ok(node, "GET", "/API/v1/queues", prefix)["queues"]]
        assert MINE in listed and all(n.startswith("zz") for n in listed), listed
        event = json.loads(_first_event(node, prefix))
        assert [q["name"] for q in event["queues"]] == [n for n in sorted(listed)] and event["queues_total"] == len(listed)
        # a key without prefix sees every queue, in both
        assert OTHER in _first_event(node, data)
        # a queue of another prefix: 403, as before
        assert http(node, "GET", f"/API/v1/queues/{OTHER}", prefix)[0] == 403
        assert http(node, "GET", f"/API/v1/queues/{OTHER}/groups", prefix)[0] == 403
    rpcs = [m for m in SERVICE.methods
            if not GRPC_RULES[f"/doq.v1.DOQ/{m.name}"].queue
            and (GRPC_RULES[f"/doq.v1.DOQ/{m.name}"].any_key
                 or set(GRPC_RULES[f"/doq.v1.DOQ/{m.name}"].scopes) & PREFIX_SCOPES)]
    assert {m.name for m in rpcs} == {"ListQueues", "ListServers"}, [m.name for m in rpcs]
    for node in cluster.nodes:
        with node.grpc_channel() as ch:
            for method in rpcs:
                full = f"/doq.v1.DOQ/{method.name}"
                de = message_factory.GetMessageClass(method.output_type).FromString
                call = ch.unary_unary(full, request_serializer=lambda r: r.SerializeToString(), response_deserializer=de)
                answer = call(_request(method), metadata=[("authorization", f"Bearer {prefix}")], timeout=30)
                assert OTHER.encode() not in answer.SerializeToString(), (node.node_id, method.name)
            listq = ch.unary_unary("/doq.v1.DOQ/ListQueues", request_serializer=pb.ListQueuesRequest.SerializeToString,
                                   response_deserializer=pb.ListQueuesResponse.FromString)
            mine = [q.name for q in listq(pb.ListQueuesRequest(), metadata=[("authorization", f"Bearer {prefix}")]).queues]
            assert MINE in mine and all(n.startswith("zz") for n in mine), mine
            every = [q.name for q in listq(pb.ListQueuesRequest(), metadata=[("authorization", f"Bearer {data}")]).queues]
            assert OTHER in every and MINE in every
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary("/doq.v1.DOQ/GetQueue", request_serializer=pb.GetQueueRequest.SerializeToString,
                               response_deserializer=pb.GetQueueResponse.FromString)(
                    pb.GetQueueRequest(name=OTHER), metadata=[("authorization", f"Bearer {prefix}")])
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_delete_of_an_in_flight_message_needs_its_lease_or_an_admin_key(cluster: Cluster) -> None:
    n, q = cluster.nodes[1], "zz.del"
    ok(n, "POST", "/API/v1/queues", cluster.admin, {"name": q, "type": "delayed"})
    key = cluster.keys["prefix"]  # produce:zz + consume:zz
    base = f"/API/v1/queues/{q}/messages"
    for i in range(4):
        ok(n, "POST", base, key, {"content": f"m{i}"})
    held = ok(n, "GET", base, key)  # leased
    lease = int(held["lease_id"])
    for path, want in ((f"{base}/{held['id']}", "MESSAGE_IN_FLIGHT"),
                       (f"{base}/{held['id']}?lease_id={lease ^ 1}", "STALE_LEASE")):
        status, doc, _ = http(n, "DELETE", path, key)
        assert (status, doc["reason"]) == (409, want), (path, status, doc)
    assert http(n, "DELETE", f"{base}/{held['id']}?lease_id=x", key)[0] == 400
    with n.grpc_channel() as ch:
        delete = ch.unary_unary("/doq.v1.DOQ/Delete", request_serializer=pb.DeleteRequest.SerializeToString,
                                response_deserializer=pb.DeleteResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            delete(pb.DeleteRequest(queue_name=q, id=int(held["id"])), metadata=[("authorization", f"Bearer {key}")])
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ok(n, "GET", f"{base}/{held['id']}", key)["state"] == "in_flight"  # untouched
        delete(pb.DeleteRequest(queue_name=q, id=int(held["id"]), lease_id=lease),
               metadata=[("authorization", f"Bearer {key}")])  # the holder
    assert http(n, "GET", f"{base}/{held['id']}", key)[0] == 404
    ready = ok(n, "GET", f"{base}:peek", key)["messages"][0]
    ok(n, "DELETE", f"{base}/{ready['id']}", key)  # not in flight: no one holds it
    other = ok(n, "GET", base, key)
    ok(n, "DELETE", f"{base}/{other['id']}", cluster.admin)  # an admin deletes any
    assert http(n, "GET", f"{base}/{other['id']}", key)[0] == 404
