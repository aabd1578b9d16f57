"""The peer door against real processes (issue 18): a forged Raft APP message carrying a
DeleteQueue, sent to a member's raft port with the `doq-raft-to` metadata `GET /cluster`
publishes, changes nothing on any node, whether it comes from a made-up node id without
a cluster id, with the right cluster id, or from a member's id with another cluster's id.
Real: three `doq serve` processes on 127.0.0.1, real gRPC. The door's refusal is observed
in the target's `doq_raft_messages_refused_total` before anything is compared."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.cluster import call, cluster_view, leader, three_nodes, until
from tests.support.forge import delete_queue_append, send_frame
from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with three_nodes(tmp_path_factory.mktemp("door") / "data") as nodes:
        status, body = call(nodes[0], "POST", "/API/v1/queues", {"name": "canary"})
        assert status in (200, 201), body
        yield nodes


def refused(node: NodeProc, reason: str) -> float:
    with urllib.request.urlopen(node.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    pattern = r'^doq_raft_messages_refused_total\{reason="' + reason + r'"\} ([0-9.e+]+)$'
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def settled(nodes: list[NodeProc]) -> dict[str, tuple[str, int]]:
    """{node: (digest, applied index)} once every node has applied the same index."""
    def same() -> dict[str, tuple[str, int]] | None:
        out = {}
        for n in nodes:
            status, body = call(n, "GET", "/db/digest")
            if status != 200:
                return None
            out[n.node_id] = (body["digest"], body["applied_index"])
        return out if len(set(out.values())) == 1 else None
    return dict(until("equal digests at one applied index", same))


@pytest.mark.parametrize("variant", ["no_cluster_id", "right_cluster_id_made_up_node", "wrong_cluster_id_member_id"])
@pytest.mark.parametrize("target_role", ["leader", "follower"])
def test_a_forged_append_changes_nothing_on_any_node(cluster: list[NodeProc], variant: str, target_role: str) -> None:
    before = settled(cluster)
    lead = leader(cluster)
    target = lead if target_role == "leader" else next(n for n in cluster if n is not lead)
    view = cluster_view(target.http_url)
    term, commit, cluster_id = view["term"], view["commit_index"], view["cluster_id"]
    assert cluster_id
    frm, ids, reason = {
        "no_cluster_id": ("mallory", [], "cluster"),
        "right_cluster_id_made_up_node": ("mallory", [cluster_id], "not_member"),
        "wrong_cluster_id_member_id": (lead.node_id if target is not lead else next(
            n.node_id for n in cluster if n is not lead), ["another-cluster"], "cluster"),
    }[variant]
    count0 = refused(target, reason)
    forged = delete_queue_append(frm=frm, to=target.node_id, term=term + 1, index=commit, queue="canary")
    send_frame(f"127.0.0.1:{target.raft_port}", stream_from=frm, to=target.node_id, messages=[forged],
               cluster_ids=ids)
    until(f"the forged message refused ({reason}) by {target.node_id}", lambda: refused(target, reason) > count0)

    after = settled(cluster)
    assert {d for d, _ in after.values()} == {d for d, _ in before.values()}  # nothing was applied
    for n in cluster:
        status, body = call(n, "GET", "/API/v1/queues/canary")
        assert status == 200, (n.node_id, body)
        assert cluster_view(n.http_url)["term"] == term, n.node_id  # no stranger raised a term
    assert "mallory" not in {m["node_id"] for m in cluster_view(lead.http_url)["members"]}
