"""The number of queues is bounded, and what grows with it is paged or capped, on a real
`doq serve` process (HTTP and gRPC on 127.0.0.1): `--max-queues` refuses one queue more
(429 / RESOURCE_EXHAUSTED `QUEUE_LIMIT_REACHED`, nothing created) until one is deleted;
`GET /API/v1/queues` and gRPC `ListQueues` answer pages of at most 1000 (the plain GET
too), which the Python client and `doq queues list` follow to the last; `/metrics` has
series of their own for at most 100 queues, the rest summed under `queue="_other"`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.service.metrics import MAX_QUEUE_SERIES
from doq.service.paging import MAX_QUEUES_PAGE
from doq_client import DoqClient
from tests.support.cluster import cluster_view, http_call, leader, node_procs, running_cluster
from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

LIMIT = MAX_QUEUES_PAGE + 5  # more than a page, more than the metrics' series
NAMES = [f"q{i:05d}" for i in range(LIMIT)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(tmp_path_factory.mktemp("qbounds") / "data",
                      extra_args=["--max-queues", str(LIMIT)]) as n:
        with n.grpc_channel() as ch:
            stub = pb_grpc.DOQStub(ch)
            calls = [stub.CreateQueue.future(pb.CreateQueueRequest(name=name, type="delayed"), timeout=120)
                     for name in NAMES]
            for f in calls:
                f.result()
            stub.Enqueue(pb.EnqueueRequest(queue_name=NAMES[-1], content=b"x"), timeout=60)
        yield n


def _names(doc: dict[str, object]) -> list[str]:
    return [q["name"] for q in doc["queues"]]  # type: ignore[attr-defined, index]


def test_one_queue_past_max_queues_is_refused_on_http_and_grpc_and_changes_nothing(node: NodeProc) -> None:
    status, body = http_call(node.http_url, "POST", "/API/v1/queues", {"name": "one-more", "type": "delayed"})
    assert status == 429, body
    assert (body["reason"], body["retryable"]) == ("QUEUE_LIMIT_REACHED", False)
    assert "--max-queues" in body["detail"]
    with node.grpc_channel() as ch:
        stub = pb_grpc.DOQStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateQueue(pb.CreateQueueRequest(name="one-more", type="fair"), timeout=60)
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("doq-reason", "QUEUE_LIMIT_REACHED") in (e.value.trailing_metadata() or ())
        assert http_call(node.http_url, "GET", "/API/v1/queues/one-more")[0] == 404
        # creating one that exists is still a harmless retry; deleting one makes room for one
        stub.CreateQueue(pb.CreateQueueRequest(name=NAMES[0], type="delayed"), timeout=60)
        stub.DeleteQueue(pb.DeleteQueueRequest(name=NAMES[0]), timeout=60)
        stub.CreateQueue(pb.CreateQueueRequest(name=NAMES[0], type="delayed"), timeout=60)
        with pytest.raises(grpc.RpcError):
            stub.CreateQueue(pb.CreateQueueRequest(name="one-more", type="delayed"), timeout=60)


def test_the_plain_get_answers_a_bounded_page_and_pages_cover_every_queue(node: NodeProc) -> None:
    status, first = http_call(node.http_url, "GET", "/API/v1/queues")
    assert status == 200
    assert _names(first) == NAMES[:MAX_QUEUES_PAGE] and first["next_page_token"]
    seen: list[str] = []
    token = ""
    while True:
        status, doc = http_call(node.http_url, "GET", f"/API/v1/queues?max_results=300&page_token={token}")
        assert status == 200 and len(doc["queues"]) <= 300
        seen += _names(doc)
        token = doc["next_page_token"]
        if token is None:
            break
    assert seen == NAMES
    for bad in ("max_results=0", f"max_results={MAX_QUEUES_PAGE + 1}", "page_token=not%20a%20name"):
        status, body = http_call(node.http_url, "GET", f"/API/v1/queues?{bad}")
        assert status == 400, (bad, body)


def test_grpc_list_queues_pages_and_the_clients_follow_them(node: NodeProc) -> None:
    with node.grpc_channel() as ch:
        stub = pb_grpc.DOQStub(ch)
        first = stub.ListQueues(pb.ListQueuesRequest(), timeout=60)
        assert len(first.queues) == MAX_QUEUES_PAGE and first.next_page_token
        rest = stub.ListQueues(pb.ListQueuesRequest(page_token=first.next_page_token, max_results=2), timeout=60)
        assert [q.name for q in rest.queues] == NAMES[MAX_QUEUES_PAGE:MAX_QUEUES_PAGE + 2]
        with pytest.raises(grpc.RpcError) as e:
            stub.ListQueues(pb.ListQueuesRequest(page_token="-x!"), timeout=60)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with DoqClient(node.grpc_addr) as client:
        assert [q.name for q in client.list_queues()] == NAMES
    out = subprocess.run([sys.executable, "-m", "doq", "queues", "list", "--json", "--server", node.http_url],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert [q["name"] for q in json.loads(out)["queues"]] == NAMES


def test_metrics_have_a_bounded_number_of_queue_series(node: NodeProc) -> None:
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    labels = re.findall(r'^doq_queue_messages\{queue="([^"]+)",state="ready"\}', text, re.M)
    assert len(labels) == MAX_QUEUE_SERIES + 1 and "_other" in labels
    assert NAMES[-1] in labels  # the queue holding a message is among those shown
    assert re.search(r"^doq_queues (\S+)$", text, re.M).group(1) == f"{float(LIMIT)}"  # type: ignore[union-attr]
    other = re.search(r'^doq_queue_messages\{queue="_other",state="ready"\} (\S+)$', text, re.M)
    assert other is not None and float(other.group(1)) == 0.0


def test_on_a_cluster_the_leaders_limit_applies_and_every_member_agrees(tmp_path: Path) -> None:
    """node-1 (the leader that bootstraps) runs `--max-queues 3`, the others 100: creations
    sent to node-3 are relayed to the leader and carry its limit in the log, so the fourth
    is refused and every member holds the same three queues."""
    nodes = node_procs(tmp_path, ["--election-timeout-ms", "5000"])
    nodes[0].extra_args += ["--max-queues", "3"]
    for n in nodes[1:]:
        n.extra_args += ["--max-queues", "100"]
    with running_cluster(nodes):
        term = cluster_view(nodes[0].http_url)["term"]
        assert leader(nodes).node_id == "node-1"
        for name in ("a", "b", "c"):
            assert http_call(nodes[2].http_url, "POST", "/API/v1/queues", {"name": name})[0] == 201
        status, body = http_call(nodes[2].http_url, "POST", "/API/v1/queues", {"name": "d"})
        assert (status, body["reason"]) == (429, "QUEUE_LIMIT_REACHED"), body
        assert cluster_view(nodes[0].http_url)["term"] == term  # one leader throughout
        for n in nodes:
            status, doc = http_call(n.http_url, "GET", "/API/v1/queues")
            assert status == 200 and _names(doc) == ["a", "b", "c"], (n.node_id, doc)
