"""Free TCP ports on 127.0.0.1 for the processes that tests, benchmarks and chaos runs start."""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
_RECENT_PORTS = 4096  # ports this process handed out lately: never handed out again meanwhile
_given: deque[int] = deque(maxlen=_RECENT_PORTS)


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (32768 if unknown)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now, chosen below the kernel's ephemeral range.

    A port from `bind(0)` lies inside that range, where any outgoing connection on the
    machine may take it while the process meant to listen on it is not up (e.g. a node
    restarted on its address after a kill). Ports below the range are taken only by
    listeners, so a port chosen at random there stays free far more reliably. A port this
    process handed out lately (the last `_RECENT_PORTS`) is not handed out again: the
    ports of a cluster are all chosen before its first node binds one, and two random
    choices may meet (a joiner given its leader's port was refused ADDRESS_IN_USE)."""
    low = _ephemeral_low()
    rnd = random.SystemRandom()
    for _ in range(200):
        port = rnd.randrange(_LOWEST, low) if low > _LOWEST + 1000 else 0
        if port and port in _given:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _given.append(port)
        return port
    raise OSError("no free port found on 127.0.0.1")
