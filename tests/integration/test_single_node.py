"""Integration tests of a real `doq serve` process: durability under kill -9, leases,
bad input, graceful shutdown, startup errors. Real LMDB files, real gRPC on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from tests.support.proc import NodeProc, free_port

pytestmark = pytest.mark.integration


def stub_for(node: NodeProc) -> tuple[grpc.Channel, pb_grpc.DOQStub]:
    ch = grpc.insecure_channel(node.grpc_addr)
    grpc.channel_ready_future(ch).result(timeout=10)
    return ch, pb_grpc.DOQStub(ch)


def drain(stub: pb_grpc.DOQStub, queue: str) -> list[pb.Message]:
    out: list[pb.Message] = []
    while True:
        got = stub.Dequeue(pb.DequeueRequest(queue_name=queue, ack=True, max_messages=1000)).messages
        if not got:
            return out
        out.extend(got)


def test_kill9_while_streaming_loses_no_acknowledged_enqueue(tmp_path: Path) -> None:
    node = NodeProc(tmp_path / "data").start()
    try:
        ch, stub = stub_for(node)
        stub.CreateQueue(pb.CreateQueueRequest(name="durable", type="delayed"))
        acked: dict[int, bytes] = {}
        sent = 0
        stop = threading.Event()

        def requests() -> Iterator[pb.EnqueueRequest]:
            nonlocal sent
            while not stop.is_set():
                sent += 1
                yield pb.EnqueueRequest(queue_name="durable", content=b"m-%d" % sent, priority=sent % 7)

        def producer() -> None:
            try:
                for i, resp in enumerate(stub.EnqueueStream(requests()), start=1):
                    if resp.success:
                        acked[resp.id] = b"m-%d" % i
            except grpc.RpcError:
                pass  # the server died under us: expected

        t = threading.Thread(target=producer, daemon=True)
        t.start()
        deadline = time.monotonic() + 120
        while len(acked) < 3000 and time.monotonic() < deadline:
            time.sleep(0.01)
        node.kill9()
        stop.set()
        t.join(10)
        ch.close()
        assert len(acked) >= 3000, "producer made too little progress before the kill"
        snapshot = dict(acked)

        node.start()
        ch, stub = stub_for(node)
        got = drain(stub, "durable")
        ch.close()
        ids = [m.id for m in got]
        assert len(ids) == len(set(ids)), "a message came back twice"
        by_id = {m.id: m.content for m in got}
        missing = [i for i in snapshot if i not in by_id]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
        assert all(by_id[i] == c for i, c in snapshot.items())
        # Messages sent but never acknowledged may exist, but each at most once.
        contents = [m.content for m in got]
        assert len(contents) == len(set(contents))
    finally:
        node.kill9()


def test_unacked_message_comes_back_after_visibility_timeout(doq_node: NodeProc) -> None:
    ch, stub = stub_for(doq_node)
    stub.CreateQueue(pb.CreateQueueRequest(
        name="leases", type="delayed", settings=pb.QueueSettings(visibility_timeout_ms=3000)))
    mid = stub.Enqueue(pb.EnqueueRequest(queue_name="leases", content=b"job")).id
    first = stub.Dequeue(pb.DequeueRequest(queue_name="leases")).messages
    assert [m.id for m in first] == [mid] and first[0].attempts == 1
    assert stub.Dequeue(pb.DequeueRequest(queue_name="leases")).messages == []
    assert stub.GetQueue(pb.GetQueueRequest(name="leases")).queue.stats.in_flight == 1
    # Long-poll: the redelivery arrives when the lease expires, without another enqueue
    # (a poll that ended unwoken would answer no message).
    again = stub.Dequeue(pb.DequeueRequest(queue_name="leases", wait_ms=60_000)).messages
    assert [m.id for m in again] == [mid]
    assert again[0].attempts == 2 and again[0].content == b"job"
    assert again[0].lease_id != first[0].lease_id
    # The first lease is stale now: acking with it is refused, with the new one accepted.
    with pytest.raises(grpc.RpcError) as e:
        stub.Ack(pb.AckRequest(queue_name="leases", id=mid, lease_id=first[0].lease_id))
    assert e.value.code() == grpc.StatusCode.ABORTED
    stub.Ack(pb.AckRequest(queue_name="leases", id=mid, lease_id=again[0].lease_id))
    assert stub.GetQueue(pb.GetQueueRequest(name="leases")).queue.stats.total == 0
    ch.close()


def _status(fn, req) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        fn(req)
    return e.value.code()


def test_bad_inputs_get_the_right_status_and_change_nothing(doq_node: NodeProc) -> None:
    ch, stub = stub_for(doq_node)
    stub.CreateQueue(pb.CreateQueueRequest(name="q1", type="fair"))
    stub.Enqueue(pb.EnqueueRequest(queue_name="q1", content=b"x", group="g"))
    before = stub.ListQueues(pb.ListQueuesRequest())
    S = grpc.StatusCode
    assert _status(stub.CreateQueue, pb.CreateQueueRequest(name="bad name!", type="delayed")) == S.INVALID_ARGUMENT
    assert _status(stub.CreateQueue, pb.CreateQueueRequest(name="q2", type="lifo")) == S.INVALID_ARGUMENT
    # Re-creating with the same type and settings is an idempotent success; different ones conflict.
    assert stub.CreateQueue(pb.CreateQueueRequest(name="q1", type="fair")).success
    assert _status(stub.CreateQueue, pb.CreateQueueRequest(name="q1", type="delayed")) == S.ALREADY_EXISTS
    assert _status(stub.Enqueue, pb.EnqueueRequest(queue_name="nope", content=b"x")) == S.NOT_FOUND
    assert _status(stub.Enqueue, pb.EnqueueRequest(queue_name="q1", content=b"x" * (1024 * 1024 + 1))) == S.RESOURCE_EXHAUSTED
    assert _status(stub.Enqueue, pb.EnqueueRequest(
        queue_name="q1", content=b"x", metadata={"k": "v" * 20000})) == S.INVALID_ARGUMENT
    assert _status(stub.Ack, pb.AckRequest(queue_name="q1", id=999_999)) == S.INVALID_ARGUMENT  # LEASE_REQUIRED
    assert _status(stub.Ack, pb.AckRequest(queue_name="q1", id=999_999, lease_id=1)) == S.NOT_FOUND
    assert _status(stub.Ack, pb.AckRequest(queue_name="q1", id=0)) == S.INVALID_ARGUMENT
    assert _status(stub.Get, pb.GetRequest(queue_name="q1", id=424242)) == S.NOT_FOUND
    assert _status(stub.GetQueue, pb.GetQueueRequest(name="missing")) == S.NOT_FOUND
    assert _status(stub.Dequeue, pb.DequeueRequest(queue_name="q1", wait_ms=10**9)) == S.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        stub.Enqueue(pb.EnqueueRequest(queue_name="nope", content=b"x"))
    assert dict(e.value.trailing_metadata())["doq-reason"] == "QUEUE_NOT_FOUND"
    # A batch with one bad item is refused as a whole, naming it (as over HTTP).
    with pytest.raises(grpc.RpcError) as e:
        stub.EnqueueBatch(pb.EnqueueBatchRequest(messages=[
            pb.EnqueueRequest(queue_name="q1", content=b"ok", group="g"),
            pb.EnqueueRequest(queue_name="no such", content=b"bad"),
        ]))
    assert e.value.code() == S.INVALID_ARGUMENT and e.value.details().startswith("messages[1]: ")
    assert dict(e.value.trailing_metadata())["doq-reason"] == "INVALID_QUEUE_NAME"
    after = stub.ListQueues(pb.ListQueuesRequest())
    assert [q.name for q in after.queues] == [q.name for q in before.queues]
    assert after.queues[0].stats.total == before.queues[0].stats.total
    ch.close()


def test_sigterm_is_graceful_and_keeps_data(tmp_path: Path) -> None:
    node = NodeProc(tmp_path / "data").start()
    try:
        ch, stub = stub_for(node)
        stub.CreateQueue(pb.CreateQueueRequest(name="t", type="delayed"))
        ids = [stub.Enqueue(pb.EnqueueRequest(queue_name="t", content=b"%d" % i)).id for i in range(20)]
        ch.close()
        assert node.terminate() == 0
        assert "Traceback" not in node.log()
        node.start()
        ch, stub = stub_for(node)
        assert sorted(m.id for m in drain(stub, "t")) == sorted(ids)
        ch.close()
    finally:
        node.kill9()


def test_bad_flag_and_unusable_data_dir_exit_nonzero(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "doq", "serve", "--grpc-addr", "nonsense"],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert bad.returncode != 0 and "HOST:PORT" in bad.stderr
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    r = subprocess.run(
        [sys.executable, "-m", "doq", "serve", "--data-dir", str(blocker),
         "--grpc-addr", f"127.0.0.1:{free_port()}", "--http-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert r.returncode != 0 and "data dir" in r.stderr


def test_dequeue_stream_settles_acks_and_ends_on_half_close(doq_node: NodeProc) -> None:
    import queue as q

    ch, stub = stub_for(doq_node)
    stub.CreateQueue(pb.CreateQueueRequest(name="s", type="delayed"))
    for i in range(5):
        stub.Enqueue(pb.EnqueueRequest(queue_name="s", content=b"%d" % i, priority=i))
    outbox: q.Queue[pb.DequeueStreamRequest | None] = q.Queue()
    outbox.put(pb.DequeueStreamRequest(queue_name="s", prefetch=2, auto_credit=True))

    def requests() -> Iterator[pb.DequeueStreamRequest]:
        while (r := outbox.get()) is not None:
            yield r

    stream = stub.DequeueStream(requests(), timeout=10)
    got = [next(stream), next(stream)]
    assert [m.content for m in got] == [b"0", b"1"]  # priority order, prefetch bound
    # Ack the first with its lease, the second with a stale lease id (refused, stays leased).
    outbox.put(pb.DequeueStreamRequest(ack_ids=[got[0].id, got[1].id],
                                       ack_lease_ids=[got[0].lease_id, got[1].lease_id + 999]))
    third = next(stream)  # the ack returned credits
    assert third.content == b"2"
    outbox.put(None)  # half-close: the server settles and ends the stream
    rest = list(stream)
    assert len(rest) <= 1  # at most the one credit left
    stats = stub.GetQueue(pb.GetQueueRequest(name="s")).queue.stats
    assert stats.total == 4, "only the validly acked message is gone"
    assert stats.in_flight == 2 + len(rest)
    ch.close()


def test_reflection_and_health_are_served(doq_node: NodeProc) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    ch, _ = stub_for(doq_node)
    db = ProtoReflectionDescriptorDatabase(ch)
    services = set(db.get_services())
    assert {"doq.v1.DOQ", "grpc.health.v1.Health"} <= services
    methods = {m.name for m in db.FindFileContainingSymbol("doq.v1.DOQ").service[0].method}
    assert {"EnqueueStream", "DequeueStream", "Ack", "Nack", "Touch", "UpdatePriority"} <= methods
    health = health_pb2_grpc.HealthStub(ch)
    for service in ("", "doq.v1.DOQ"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as e:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    ch.close()


def test_a_restart_above_the_parallel_load_threshold_holds_what_it_held(tmp_path: Path) -> None:
    """A restart whose store holds more message records than `--parallel-load-min` (lowered
    here through its environment variable) loads them on two processes and answers what
    it held: every message, in its queue's order, the in-flight ones still in flight."""
    node = NodeProc(tmp_path / "data", extra_args=["--log-level", "info"],
                    env={"DOQ_PARALLEL_LOAD_MIN": "1000"}).start()
    try:
        ch, stub = stub_for(node)
        stub.CreateQueue(pb.CreateQueueRequest(name="p", type="delayed"))
        stub.CreateQueue(pb.CreateQueueRequest(name="q", type="delayed"))
        for qn in ("p", "q"):
            for start in range(0, 2000, 500):
                got = stub.EnqueueBatch(pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(
                    queue_name=qn, contents=[b"%s%d" % (qn.encode(), i) for i in range(start, start + 500)],
                    priorities=[(i * 7919) % 101 for i in range(start, start + 500)])))
                assert len(got.ids) == 500 and not got.HasField("error")
        leased = stub.Dequeue(pb.DequeueRequest(queue_name="q", max_messages=10, visibility_timeout_ms=3_600_000))
        assert len(leased.messages) == 10

        def held() -> list[list[tuple[int, bytes]]]:
            out = []
            for qn in ("p", "q"):
                for state in ("ready", "in_flight"):
                    msgs: list[tuple[int, bytes]] = []
                    offset = 0
                    while True:
                        page = stub.Peek(pb.PeekRequest(queue_name=qn, state=state, offset=offset, limit=100))
                        msgs += [(m.id, m.content) for m in page.messages]
                        if not page.next_offset:
                            break
                        offset = page.next_offset
                    out.append(msgs)
            return out

        before = held()
        assert [len(x) for x in before] == [2000, 0, 1990, 10]
        ch.close()
        assert node.terminate() == 0
        node.start()
        assert "loaded on two processes" in node.log() and "loading on one CPU" not in node.log()
        ch, stub = stub_for(node)
        assert held() == before  # the same messages, in the same order
        ch.close()
    finally:
        node.kill9()
