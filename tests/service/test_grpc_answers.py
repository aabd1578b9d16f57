"""What a gRPC caller gets back for fields and ids that only the gRPC adapter carries, over
real gRPC on 127.0.0.1 and a temporary LMDB (in process: a mutation run reaches it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

from doq.errors import FailedPrecondition, Overloaded
from doq.queues import limits as L
from doq.service.door import Action, Caller
from doq.service.grpc_server import build_server
from doq.service.limits import Limits
from tests.support import inproc
from tests.support.inproc import Served


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with inproc.served(tmp_path) as srv:
        await srv.api.create_queue("q")
        yield srv


async def test_the_metadata_of_a_single_enqueue_is_kept(served: Served) -> None:
    sent = await served.stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x",
                                                       metadata={"trace": "t-1", "k": "v"}))
    got = await served.stub.Get(pb.GetRequest(queue_name="q", id=sent.id))
    assert dict(got.metadata) == {"trace": "t-1", "k": "v"}


@pytest.mark.parametrize("call", ["Get", "Ack", "Nack", "Delete"])
async def test_a_message_id_of_0_is_refused_as_an_invalid_id_and_changes_nothing(
    served: Served, call: str
) -> None:
    await served.stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x"))
    before = inproc.user_records(served.api)
    request = {"Get": pb.GetRequest(queue_name="q", id=0),
               "Ack": pb.AckRequest(queue_name="q", id=0, lease_id=1),
               "Nack": pb.NackRequest(queue_name="q", id=0, lease_id=1),
               "Delete": pb.DeleteRequest(queue_name="q", id=0)}[call]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(served.stub, call)(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailers = dict(err.value.trailing_metadata() or ())
    assert trailers.get("doq-reason") == "INVALID_ID" and trailers.get("doq-retryable") == "false"
    assert inproc.user_records(served.api) == before


async def test_undecodable_bytes_are_refused_invalid_request_and_the_server_serves_on(tmp_path: Path) -> None:
    """The in-process twin of the process test in tests/integration/test_connection_limits.py."""
    garbage = b"\xff\xff\xff\xff\x0f not a message"
    async with inproc.local_service(tmp_path) as api:
        server, port = build_server(api, "127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                unary = ch.unary_unary("/doq.v1.DOQ/Enqueue", request_serializer=bytes,
                                       response_deserializer=bytes)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unary(garbage)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert dict(err.value.trailing_metadata() or ())["doq-reason"] == "INVALID_REQUEST"
                assert await pb_grpc.DOQStub(ch).ListQueues(pb.ListQueuesRequest()) is not None
        finally:
            await server.stop(None)


async def test_get_queue_answers_every_setting_the_queue_was_created_with(served: Served) -> None:
    settings = pb.QueueSettings(visibility_timeout_ms=45_000, max_attempts=4, dead_letter_queue="q",
                                max_unacked_per_group=3, dedup_window_ms=90_000,
                                default_group_weight=2, default_group_max_per_second=50)
    await served.stub.CreateQueue(pb.CreateQueueRequest(name="f", type="fair", settings=settings))
    got = await served.stub.GetQueue(pb.GetQueueRequest(name="f"))
    assert got.queue.settings == settings
    listed = await served.stub.ListQueues(pb.ListQueuesRequest())
    assert [q.settings for q in listed.queues if q.name == "f"] == [settings]


async def test_a_nack_the_door_refuses_for_its_queue_leaves_the_message_in_flight(served: Served) -> None:
    """The door sees each settlement's queue: a check that refuses queue `forbidden`
    (standing in for a key's queue scope) refuses the nack, and the lease stands."""

    def check(caller: Caller, action: Action, queue: str | None) -> None:
        if action == Action.NACK and queue == "forbidden":
            raise FailedPrecondition("refused by the door", reason="REFUSED_BY_TEST")

    await served.api.create_queue("forbidden")
    sent = await served.stub.Enqueue(pb.EnqueueRequest(queue_name="forbidden", content=b"x"))
    got = await served.stub.Dequeue(pb.DequeueRequest(queue_name="forbidden", max_messages=1))
    [msg] = got.messages
    served.api.door.add_check(check)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Nack(pb.NackRequest(queue_name="forbidden", id=sent.id, lease_id=msg.lease_id))
    assert dict(err.value.trailing_metadata() or ())["doq-reason"] == "REFUSED_BY_TEST"
    now = await served.stub.Get(pb.GetRequest(queue_name="forbidden", id=sent.id))
    assert (now.lease_id, now.attempts) == (msg.lease_id, msg.attempts)


async def test_a_retryable_refusal_says_so_in_its_trailers(served: Served) -> None:
    """Clients retry on `doq-retryable: true` (clients/python: the error's `retryable`)."""

    def check(caller: Caller, action: Action, queue: str | None) -> None:
        raise Overloaded("too busy, try again")

    served.api.door.add_check(check)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Enqueue(pb.EnqueueRequest(queue_name="q", content=b"x"))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(err.value.trailing_metadata() or ())
    assert (trailers["doq-reason"], trailers["doq-retryable"]) == ("OVERLOADED", "true")


@pytest.mark.parametrize(("field", "bound"), [("default_group_weight", L.MAX_GROUP_WEIGHT),
                                              ("default_group_max_per_second", L.MAX_GROUP_RATE)])
async def test_a_fair_setting_past_its_bound_is_refused_naming_it(served: Served, field: str, bound: int) -> None:
    settings = pb.QueueSettings(**{field: bound + 1})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.CreateQueue(pb.CreateQueueRequest(name="f", type="fair", settings=settings))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"{field} must be within 0..{bound}"
    assert dict(err.value.trailing_metadata() or ())["doq-reason"] == "INVALID_SETTINGS"
    assert [q.name for q in served.api.node.state.list_queues()] == ["q"]


async def test_a_columns_batch_over_the_message_limit_is_refused_whole(tmp_path: Path) -> None:
    async with inproc.local_service(tmp_path, Limits(max_batch_messages=3)) as api, \
            inproc.grpc_stub(api) as stub:
        await api.create_queue("q")
        too_many = pb.EnqueueColumns(queue_name="q", contents=[b"a", b"b", b"c", b"d"])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EnqueueBatch(pb.EnqueueBatchRequest(columns=too_many))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(err.value.trailing_metadata() or ())["doq-reason"] == "BATCH_TOO_LARGE"
        assert (await api.get_queue("q")).stats.total == 0
        fits = pb.EnqueueColumns(queue_name="q", contents=[b"a", b"b", b"c"])
        assert len((await stub.EnqueueBatch(pb.EnqueueBatchRequest(columns=fits))).ids) == 3


async def test_reading_a_redrive_is_a_read_of_its_queue_for_the_door(served: Served) -> None:
    """GetRedrive asks the door for a read of the queue (GET_QUEUE): a key that may not
    read the queue may not read its redrive either."""
    seen: list[tuple[Action, str | None]] = []

    def check(caller: Caller, action: Action, queue: str | None) -> None:
        seen.append((action, queue))
        if action == Action.GET_QUEUE:
            raise FailedPrecondition("refused by the door", reason="REFUSED_BY_TEST")

    served.api.door.add_check(check)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.GetRedrive(pb.GetRedriveRequest(queue_name="q"))
    assert dict(err.value.trailing_metadata() or ())["doq-reason"] == "REFUSED_BY_TEST"
    assert seen == [(Action.GET_QUEUE, "q")]
