"""The Python client against an address nothing listens on (a real gRPC channel to a port
of 127.0.0.1 that was just freed): it says once, at the start, what it waits for and for
how long, then gives up after FailoverPolicy.timeout_s with Unavailable."""

from __future__ import annotations

import logging
import socket

import pytest

from doq_client import DoqClient, FailoverPolicy, Unavailable


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed at once: nothing listens there


def test_a_dead_address_is_announced_once_then_refused_after_the_failover_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="doq_client")
    with DoqClient(f"127.0.0.1:{_dead_port()}", failover=FailoverPolicy(timeout_s=0.5)) as client, \
            pytest.raises(Unavailable):
        client.list_queues()
    said = [r.getMessage() for r in caplog.records if r.name == "doq_client"]
    assert len(said) == 1 and "looking for a leader for up to 0.5 s (FailoverPolicy.timeout_s)" in said[0], said
