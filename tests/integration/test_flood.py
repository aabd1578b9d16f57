"""A client flooding a node with acks of messages that do not exist (issue 19's attack):
the node's memory stays bounded, another client is answered meanwhile, and the canary
queue is intact.

Real processes on 127.0.0.1: one `doq serve`, the flooding client in its own process
(`tests/support/flood.py`: one DequeueStream, requests of 100 unknown ack ids, replies
never read), and this test as the other client (gRPC and HTTP). Before the bounds, this
attack grew the node's RSS by 326 MB in 30 s and left it unable to answer a read for
minutes after the flooder left.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import running_node

pytestmark = pytest.mark.integration

FLOOD_S = 20.0
RSS_GROWTH_BOUND_MB = 64  # the node's RSS during and after the flood, over its RSS before
ANSWER_BOUND_S = 10.0  # generous: every call of the other client, on a loaded machine
CANARY = 200
ROOT = Path(__file__).resolve().parents[2]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def test_a_flood_of_unknown_acks_leaves_memory_bounded_and_other_clients_answered(tmp_path: Path) -> None:
    with running_node(tmp_path / "data") as node, grpc.insecure_channel(node.grpc_addr) as channel:
        assert node.proc is not None
        stub = pb_grpc.DOQStub(channel)
        for q in ("canary", "flood", "other"):
            stub.CreateQueue(pb.CreateQueueRequest(name=q), timeout=30)
        canary = stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
            pb.EnqueueRequest(queue_name="canary", content=b"canary-%d" % i) for i in range(CANARY)]), timeout=30)
        canary_ids = [r.id for r in canary.results]
        # ids that existed and are gone: enqueued to `flood`, dequeued with ack (removed)
        gone = stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
            pb.EnqueueRequest(queue_name="flood", content=b"x") for _ in range(1000)]), timeout=30)
        stub.Dequeue(pb.DequeueRequest(queue_name="flood", ack=True, max_messages=1000), timeout=30)
        gone_ids = f"{gone.results[0].id}:{gone.results[-1].id}"
        rss_before = _rss_mb(node.proc.pid)

        flooder = subprocess.Popen(
            [sys.executable, "-m", "tests.support.flood", "--target", node.grpc_addr, "--queue", "flood",
             "--gone", gone_ids, "--seconds", str(FLOOD_S)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            rss_peak = rss_before
            answers: list[float] = []
            deadline = time.monotonic() + FLOOD_S
            while time.monotonic() < deadline and flooder.poll() is None:
                answers.append(_timed(lambda: stub.Enqueue(
                    pb.EnqueueRequest(queue_name="other", content=b"m"), timeout=60)))
                answers.append(_timed(lambda: urllib.request.urlopen(
                    node.http_url + "/API/v1/queues/canary", timeout=60).read()))
                rss_peak = max(rss_peak, _rss_mb(node.proc.pid))
                time.sleep(0.2)
            out, err = flooder.communicate(timeout=60)
        finally:
            if flooder.poll() is None:
                flooder.kill()
                flooder.wait(10)
        sent = int(out.decode().strip() or 0)
        assert flooder.returncode == 0, err.decode()[-2000:]
        assert sent >= 100, f"the flooder sent only {sent} requests: no flood"
        # after the flooder left: answered at once, nothing kept
        after = _timed(lambda: stub.GetQueue(pb.GetQueueRequest(name="canary"), timeout=60))
        rss_peak = max(rss_peak, _rss_mb(node.proc.pid))

        assert answers and max(answers) < ANSWER_BOUND_S, f"slowest answer {max(answers):.1f} s"
        assert after < ANSWER_BOUND_S
        assert rss_peak - rss_before < RSS_GROWTH_BOUND_MB, (
            f"RSS {rss_before:.0f} -> {rss_peak:.0f} MB with {sent} requests of 100 unknown acks")
        queue = stub.GetQueue(pb.GetQueueRequest(name="canary"), timeout=30).queue
        assert (queue.stats.ready, queue.stats.total) == (CANARY, CANARY)
        for i, id_ in enumerate(canary_ids):
            assert stub.Get(pb.GetRequest(queue_name="canary", id=id_), timeout=30).content == b"canary-%d" % i
        print(f"flood: {sent} requests of 100 unknown acks in {FLOOD_S:.0f} s; RSS {rss_before:.0f} -> "
              f"{rss_peak:.0f} MB; other client's slowest answer {max(answers) * 1000:.0f} ms "
              f"({len(answers)} calls)")
