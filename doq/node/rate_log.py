"""A log line at most once per interval per key, with the count of what it stood for.

For events a remote party can cause at will (refused peer messages, undecodable frames):
they are counted in metrics every time, but logged at most once per `interval_s` per key,
so a stranger cannot fill the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """`warn(key, fmt, *args)` logs at most once per `interval_s` per key; the line says how
    many events of that key it stands for since the previous line."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock_s: Callable[[], float] = time.monotonic, max_keys: int = 64) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock_s = clock_s
        self._max_keys = max_keys
        self._last_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, key: str, fmt: str, *args: object) -> bool:
        """Log (WARNING) unless `key` was logged less than `interval_s` ago; True if logged."""
        now = self._clock_s()
        last = self._last_s.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if last is None and len(self._last_s) >= self._max_keys:
            key = "(other)"  # bounded memory whatever keys a stranger makes up
            last = self._last_s.get(key)
            if last is not None and now - last < self._interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
        self._last_s[key] = now
        more = self._suppressed.pop(key, 0)
        suffix = f" (and {more} more like it since the last such line)" if more else ""
        self._log.warning(fmt + "%s", *args, suffix)
        return True
