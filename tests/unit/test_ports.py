"""Ports for the processes tests start: free, and outside the range outgoing connections use."""

from __future__ import annotations

import socket

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
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        picks = iter([busy, busy, busy + 1 if busy + 1 < 65536 else busy - 1])

        class FixedRandom:
            def randrange(self, _a: int, _b: int) -> int:
                return next(picks)

        monkeypatch.setattr(ports.random, "SystemRandom", FixedRandom)
        assert ports.free_port() != busy
