"""Error mapping and retry policy without a server."""

from __future__ import annotations

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq_client import errors as e
from doq_client.retry import RetryPolicy, call_with_retry


def test_from_pb_error_picks_the_specific_class() -> None:
    err = e.from_pb_error(
        pb.Error(code=grpc.StatusCode.NOT_FOUND.value[0], reason="QUEUE_NOT_FOUND", message="no q")
    )
    assert type(err) is e.QueueNotFound and err.code == grpc.StatusCode.NOT_FOUND
    err = e.from_pb_error(
        pb.Error(
            code=grpc.StatusCode.UNAVAILABLE.value[0],
            reason="NOT_LEADER",
            retryable=True,
            leader_hint="n2",
        )
    )
    assert type(err) is e.NotLeader and err.retryable and err.leader_hint == "n2"
    err = e.from_pb_error(
        pb.Error(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], reason="MESSAGE_TOO_LARGE")
    )
    assert type(err) is e.TooLarge
    # a reason that does not fit the code does not override it
    err = e.from_pb_error(
        pb.Error(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], reason="QUEUE_NOT_FOUND")
    )
    assert type(err) is e.InvalidArgument


def test_retry_only_when_safe() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
    calls = []

    def flaky_then_ok() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "NOT_LEADER", True)
        return "ok"

    assert call_with_retry(policy, False, flaky_then_ok) == "ok" and len(calls) == 3

    calls.clear()

    def timeout() -> str:
        calls.append(1)
        raise e.make_error(grpc.StatusCode.DEADLINE_EXCEEDED, "x", "COMMIT_TIMEOUT", True)

    with pytest.raises(e.DeadlineExceeded):  # may have been applied: not retried unless idempotent
        call_with_retry(policy, False, timeout)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(e.DeadlineExceeded):
        call_with_retry(policy, True, timeout)
    assert len(calls) == 3

    calls.clear()

    def not_found() -> str:
        calls.append(1)
        raise e.make_error(grpc.StatusCode.NOT_FOUND, "x", "QUEUE_NOT_FOUND", False)

    with pytest.raises(e.QueueNotFound):
        call_with_retry(policy, True, not_found)
    assert len(calls) == 1


def test_a_bad_string_is_not_called_an_integer() -> None:
    """protobuf refuses a str field's value (a lone surrogate cannot be UTF-8): the client's
    InvalidArgument names the field without claiming it must be an integer."""
    from doq_client.types import enqueue_request

    with pytest.raises(e.InvalidArgument) as ei:
        enqueue_request("jobs", "x", group="\ud800")
    assert "group" in ei.value.message and "integer" not in ei.value.message


@pytest.mark.parametrize("prefetch", [0, -1, 2**32])
def test_a_prefetch_out_of_range_is_invalid_argument(prefetch: int) -> None:
    """prefetch below 1 is refused like one beyond uint32: the client's InvalidArgument."""
    from doq_client.consumer import Consumer

    with grpc.insecure_channel("127.0.0.1:1") as ch, pytest.raises(e.InvalidArgument):
        Consumer(ch, "jobs", prefetch=prefetch)
