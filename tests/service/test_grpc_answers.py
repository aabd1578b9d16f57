"""What a gRPC caller gets back for fields and ids that only the gRPC adapter carries, over
real gRPC on 127.0.0.1 and a temporary LMDB (in process: a mutation run reaches it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

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
