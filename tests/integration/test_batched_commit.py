"""The batched commit on a real `doq serve` process (`--hold-commit-ms`, docs/raft.md, "The
batched commit"): the state's LMDB commit is held across calls; a kill -9 between two
commits loses nothing confirmed (the entries are durable in the Raft log and applied again
at the start), and a direct reader of LMDB right after an answer finds it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration


def _stub(node: NodeProc) -> tuple[grpc.Channel, pb_grpc.DOQStub]:
    ch = grpc.insecure_channel(node.grpc_addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    return ch, pb_grpc.DOQStub(ch)


def test_kill9_between_commits_loses_nothing_confirmed_and_get_right_after_an_answer_finds_it(
        tmp_path: Path) -> None:
    """A hold of a minute: no call below is committed to LMDB by a timer before the kill
    (only a direct reader's wait commits). Every confirmed enqueue is there after the
    restart, each once, with its content; a `Get` right after each answer finds it."""
    node = NodeProc(tmp_path / "data", extra_args=["--hold-commit-ms", "60000"]).start()
    try:
        ch, stub = _stub(node)
        stub.CreateQueue(pb.CreateQueueRequest(name="q", type="delayed"))
        confirmed: dict[int, bytes] = {}
        for i in range(60):
            resp = stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"m-%d" % i))
            assert resp.success
            confirmed[resp.id] = b"m-%d" % i
            if i % 20 == 0:  # a direct reader of LMDB right after the answer
                assert stub.Get(pb.GetRequest(queue_name="q", id=resp.id)).content == b"m-%d" % i
        ch.close()
        node.kill9()  # 19 calls since the last reader's commit: only in the log

        node.start()
        ch, stub = _stub(node)
        got: list[pb.Message] = []
        while True:
            batch = stub.Dequeue(pb.DequeueRequest(queue_name="q", ack=True, max_messages=1000)).messages
            if not batch:
                break
            got.extend(batch)
        ch.close()
        by_id = {m.id: m.content for m in got}
        assert len(by_id) == len(got) == len(confirmed)
        assert by_id == confirmed
    finally:
        node.kill9()
