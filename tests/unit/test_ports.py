"""Ports for the processes tests start: free, and outside the range outgoing connections use."""

from __future__ import annotations

import random
import re
import socket

import pytest

from doq import ports


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_listened_on() -> None:
    low = ports._ephemeral_low()
    seen = set()
    for _ in range(20):
        port = ports.free_port()
        assert ports._LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
        seen.add(port)
    assert len(seen) > 1  # chosen at random, not one fixed port


def test_a_port_in_use_is_never_returned(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The held port is offered twice, then the real random choice takes over: no
    assumption that any particular other port is free (a busy machine may hold it)."""
    real = random.SystemRandom()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        offered: list[int] = []

        class BusyFirst:
            def randrange(self, a: int, b: int) -> int:
                port = busy if len(offered) < 2 else real.randrange(a, b)
                offered.append(port)
                return port

        monkeypatch.setattr(ports.random, "SystemRandom", BusyFirst)
        port = ports.free_port()
        assert port != busy
        assert offered[:2] == [busy, busy]  # the busy port was tried, refused, and skipped
        assert port == offered[-1]


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The ports of a cluster are all chosen before its first node binds one: the same
    random choice twice must not give two nodes one port (a joiner given its leader's
    port was refused ADDRESS_IN_USE). Here the random source offers one port to both
    calls first; the second call skips it."""
    real = random.SystemRandom()
    first = ports.free_port()  # free (nothing binds it here), and now handed out
    offered: list[int] = []

    class SameFirst:
        def randrange(self, a: int, b: int) -> int:
            port = first if not offered else real.randrange(a, b)
            offered.append(port)
            return port

    monkeypatch.setattr(ports.random, "SystemRandom", SameFirst)
    second = ports.free_port()
    assert offered[0] == first and second != first


def test_doq_port_range_narrows_the_choice(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DOQ_PORT_RANGE", "20000-20200")
    chosen = {ports.free_port() for _ in range(30)}
    assert all(20000 <= p < 20200 for p in chosen) and len(chosen) > 1


def test_a_malformed_doq_port_range_is_a_clear_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for spec in ("20000", "a-b", "20200-20000", "80-90", "20000-70000"):
        monkeypatch.setenv("DOQ_PORT_RANGE", spec)
        with pytest.raises(ValueError, match=f"DOQ_PORT_RANGE.*{re.escape(repr(spec))}"):
            ports.free_port()


def test_parallel_workers_get_disjoint_slices_of_the_default_range(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DOQ_PORT_RANGE", raising=False)
    default_low, default_high = ports.port_range()
    slices = []
    for worker in range(4):
        monkeypatch.setenv("DOQ_PORT_RANGE", ports.worker_slice(worker, 4))
        slices.append(ports.port_range())
    assert all(default_low <= low < high <= default_high for low, high in slices)
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:], strict=False))  # in order, no overlap
