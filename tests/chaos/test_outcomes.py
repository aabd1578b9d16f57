"""What the workload records when a call fails: `fail` only when the error proves the
request was not applied, `info` (unknown) otherwise."""

from __future__ import annotations

import grpc
import pytest

from doq_client.errors import make_error
from tools.chaos.workload import outcome_of

S = grpc.StatusCode


@pytest.mark.parametrize(("code", "reason", "outcome"), [
    # NOT_LEADER: refused before it entered the log, or its entry was replaced; a leader
    # deposed before it learned the fate of its entry answers OUTCOME_UNKNOWN
    (S.UNAVAILABLE, "NOT_LEADER", "fail"),
    (S.UNAVAILABLE, "OUTCOME_UNKNOWN", "info"),
    (S.UNAVAILABLE, "LEADER_UNREACHABLE", "info"),
    (S.UNAVAILABLE, "NO_LEADER", "info"),
    (S.UNAVAILABLE, "SHUTTING_DOWN", "info"),
    (S.RESOURCE_EXHAUSTED, "OVERLOADED", "fail"),
    (S.ABORTED, "STALE_LEASE", "fail"),
    (S.NOT_FOUND, "MESSAGE_NOT_FOUND", "fail"),
    (S.INVALID_ARGUMENT, "INVALID_QUEUE_NAME", "fail"),
    (S.UNAVAILABLE, "", "info"),  # the connection broke: it may have been applied
    (S.DEADLINE_EXCEEDED, "", "info"),
    (S.CANCELLED, "", "info"),
    (S.INTERNAL, "", "info"),
])
def test_only_errors_that_prove_nothing_happened_are_failures(code: grpc.StatusCode, reason: str,
                                                               outcome: str) -> None:
    assert outcome_of(make_error(code, "x", reason)) == outcome
