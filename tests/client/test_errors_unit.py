"""Error mapping and retry policy without a server."""

from __future__ import annotations

import time

import grpc
import pytest
from doq_proto.v1 import doq_pb2 as pb

from doq_client import errors as e
from doq_client._routing import Router, parse_targets
from doq_client.retry import NO_FAILOVER, NO_RETRY, Attempts, FailoverPolicy, RetryPolicy


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


def _delays(tries: Attempts, err: e.DoqClientError, n: int) -> list[float | None]:
    return [tries.next_delay(err, False) for _ in range(n)]


def test_retry_only_when_safe() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
    quick = FailoverPolicy(timeout_s=60, initial_backoff_s=0.001, max_backoff_s=0.002)
    unknown = e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "OUTCOME_UNKNOWN", False)
    assert type(unknown) is e.OutcomeUnknown
    # OUTCOME_UNKNOWN (a deposed Raft leader that did not learn the fate of its entry) does
    # not prove the command was not applied: only a repeatable call is sent again
    assert _delays(Attempts(policy, quick, False), unknown, 1) == [None]
    tries = Attempts(policy, quick, True)
    assert None not in _delays(tries, unknown, 10) and tries.unknown  # failover: by time, not count
    # NOT_LEADER proves it was not applied (refused before the log, or its entry replaced)
    not_leader = e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "NOT_LEADER", True)
    tries = Attempts(policy, quick, False)
    assert None not in _delays(tries, not_leader, 3) and not tries.unknown
    # a reason that proves nothing was applied: retried even if not repeatable
    overloaded = e.make_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "x", "OVERLOADED", True)
    tries = Attempts(policy, quick, False)
    assert _delays(tries, overloaded, 3)[2] is None and not tries.unknown
    # other retryable errors: the retry policy's attempts (off by default)
    timeout = e.make_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "x", "DATA_SIZE_LIMIT", True)  # a storage alarm
    assert _delays(Attempts(policy, quick, False), timeout, 1) == [None]
    assert [d is None for d in _delays(Attempts(policy, quick, True), timeout, 3)] == [False, False, True]
    assert _delays(Attempts(NO_RETRY, quick, True), timeout, 1) == [None]
    not_found = e.make_error(grpc.StatusCode.NOT_FOUND, "x", "QUEUE_NOT_FOUND", False)
    assert _delays(Attempts(policy, quick, True), not_found, 1) == [None]


def test_failover_is_bounded_by_time_and_follows_a_hint_at_once() -> None:
    err = e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "", True)
    assert Attempts(NO_RETRY, NO_FAILOVER, True).next_delay(err, True) is None
    tries = Attempts(NO_RETRY, FailoverPolicy(timeout_s=0.05, initial_backoff_s=0.01), True)
    assert tries.next_delay(err, True) == 0.0  # the first hint: at once
    assert (tries.next_delay(err, True) or 0) > 0  # then paced
    deadline = time.monotonic() + 5
    while (d := tries.next_delay(err, False)) is not None:
        assert d <= 0.05 and time.monotonic() < deadline
        time.sleep(d)


def test_router_moves_to_the_named_leader_else_the_next_address() -> None:
    r: Router[str] = Router(parse_targets(" a:1, b:2 ,a:1"), lambda addr: addr)
    assert r.known == ["a:1", "b:2"] and r.current == "a:1"
    down = e.make_error(grpc.StatusCode.UNAVAILABLE, "x")
    assert not r.moved(down, "a:1") and r.current == "b:2"
    assert not r.moved(down, "a:1") and r.current == "b:2"  # another caller moved already
    hint = e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "NOT_LEADER", True, "n3", "c:3")
    assert r.moved(hint, "b:2") and r.current == "c:3" and r.known == ["a:1", "b:2", "c:3"]
    # a hint by node id only is followed once a node listed that member's address
    by_id = e.make_error(grpc.StatusCode.UNAVAILABLE, "x", "NOT_LEADER", True, "n1")
    assert not r.moved(by_id, "c:3") and r.current == "a:1"
    r.learn(pb.ListServersResponse(servers=[pb.Server(id="n1", grpc_addr="d:4"),
                                           pb.Server(id="n2", grpc_addr="0.0.0.0:5")]))
    assert r.moved(by_id, "a:1") and r.current == "d:4" and "0.0.0.0:5" not in r.known
    with pytest.raises(ValueError):
        parse_targets(" , ")


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


def test_the_not_applied_reasons_are_reasons_the_server_sends() -> None:
    """The client retries any call after a "not applied" reason, so each must be one the
    server really answers with (a reason it never sends would be a retry rule for nothing)."""
    from pathlib import Path

    from doq_client.retry import NOT_APPLIED_REASONS

    server = "".join(p.read_text() for p in (Path(__file__).parents[2] / "doq").rglob("*.py"))
    assert NOT_APPLIED_REASONS and all(f'"{reason}"' in server for reason in NOT_APPLIED_REASONS)
