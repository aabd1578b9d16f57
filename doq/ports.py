"""Free TCP ports on 127.0.0.1 for the processes that tests, benchmarks and chaos runs start.

`DOQ_PORT_RANGE=LOW-HIGH` (environment, read at each call) narrows the choice to ports
LOW..HIGH-1: parallel test workers each get a slice of their own (tests/conftest.py), so
two workers never pick one port; the processes a worker starts inherit its slice.
"""

from __future__ import annotations

import os
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


def port_range() -> tuple[int, int]:
    """The ports `free_port` chooses from: `DOQ_PORT_RANGE` when set, else from 10000 up
    to the kernel's ephemeral range. A malformed or empty `DOQ_PORT_RANGE` is an error."""
    spec = os.environ.get("DOQ_PORT_RANGE", "")
    if not spec:
        return _LOWEST, _ephemeral_low()
    try:
        low_s, high_s = spec.split("-")
        low, high = int(low_s), int(high_s)
    except ValueError:
        raise ValueError(f"DOQ_PORT_RANGE must be LOW-HIGH, got {spec!r}") from None
    if not 1024 <= low < high <= 65536:
        raise ValueError(f"DOQ_PORT_RANGE must satisfy 1024 <= LOW < HIGH <= 65536, got {spec!r}")
    return low, high


def worker_slice(worker: int, workers: int) -> str:
    """`DOQ_PORT_RANGE` for parallel worker `worker` of `workers`: equal, disjoint slices of
    the default range ("" when the range is too small to share: the default applies)."""
    low, high = _LOWEST, _ephemeral_low()
    size = (high - low) // workers
    if size < 1000:
        return ""
    return f"{low + worker * size}-{low + (worker + 1) * size}"


def free_port() -> int:
    """A port that is free now, chosen below the kernel's ephemeral range.

    A port from `bind(0)` lies inside that range, where any outgoing connection on the
    machine may take it while the process meant to listen on it is not up (e.g. a node
    restarted on its address after a kill). Ports below the range are taken only by
    listeners, so a port chosen at random there stays free far more reliably. A port this
    process handed out lately (the last `_RECENT_PORTS`) is not handed out again: the
    ports of a cluster are all chosen before its first node binds one, and two random
    choices may meet (a joiner given its leader's port was refused ADDRESS_IN_USE)."""
    low, high = port_range()
    rnd = random.SystemRandom()
    for _ in range(200):
        port = rnd.randrange(low, high) if high > low + 100 else 0
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
