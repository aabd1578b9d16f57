"""Domain results -> protobuf responses (the batch response built in place)."""

from __future__ import annotations

import grpc

from doq.errors import QueueNotFound
from doq.queues.model import EnqueueResult
from doq.service.convert import enqueue_batch_to_pb, enqueue_result_to_pb


def test_batch_response_matches_item_responses_and_counts_fresh_messages() -> None:
    results = [
        EnqueueResult(1, False, "", 0, 0),
        EnqueueResult(2, False, "tenant-a", -5, 1_700_000_000_000),
        EnqueueResult(1, True, "", 0, 0),  # a duplicate of id 1
        QueueNotFound("queue 'x' not found"),
        EnqueueResult(3, False, "", 7, 0),
    ]
    response, fresh = enqueue_batch_to_pb(results)
    assert fresh == 3
    assert list(response.results) == [enqueue_result_to_pb(r) for r in results]
    dup, err = response.results[2], response.results[3]
    assert dup.success and dup.duplicate and dup.id == 1
    assert not err.success and err.error.reason == "QUEUE_NOT_FOUND"
    assert err.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert response.results[1].group == "tenant-a" and response.results[1].priority == -5


def test_empty_batch() -> None:
    response, fresh = enqueue_batch_to_pb([])
    assert fresh == 0 and len(response.results) == 0
