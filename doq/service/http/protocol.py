"""The HTTP/1.1 protocol the gateway is served with: uvicorn's httptools protocol, bounded.

uvicorn itself bounds the connection count (`limit_concurrency`: past it, requests are
answered 503) and idle keep-alive connections (`timeout_keep_alive`); it has no bound on a
request's headers with httptools, nor on how long a client may take to send them or its
body (a half-open connection, or a body trickled in, is held for good). This subclass adds
exactly those, with the limits of `doq.service.limits.Limits`:

- request line and headers together at most `max_header_bytes`, at most `max_headers`
  headers: past either, 431 and the connection is closed (nothing reaches the app);
- a connection must send its first request, a request its whole head (request line and
  headers: a total, so headers trickled in byte by byte do not hold a connection), and
  then each piece of its body within `read_timeout_s` of the previous (the request's
  first byte starts the count); else the connection is closed (408 if no answer was
  started). While the app works on a complete request no timer runs; between requests
  uvicorn's keep-alive timeout does.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    """Raised in a parser callback: the request's headers pass a limit."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """See the module docstring; the limits are class attributes (`bounded_protocol`)."""

    max_header_bytes = 64 * 1024
    max_headers = 100
    read_timeout_s = 30.0

    _read_timer: asyncio.TimerHandle | None = None
    _last_read = 0.0
    _reading = False  # a request (or the first one) is being received
    _header_bytes = 0
    _header_count = 0
    _refusal = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # the first request must come

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_body(self, body: bytes) -> None:
        self._last_read = self.loop.time()  # the timer, when it fires, measures the gap from here
        super().on_body(body)

    def on_message_begin(self) -> None:
        self._header_bytes = self._header_count = 0
        self._arm()
        super().on_message_begin()

    # on_url and on_header do what uvicorn's do (kept in step with uvicorn 0.54's, which the
    # tests exercise through a real server) plus the counting, without a super() call per
    # header: they run for every header of every request
    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self.max_header_bytes:
            self._refuse()
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        self._header_count += 1
        if self._header_bytes > self.max_header_bytes or self._header_count > self.max_headers:
            self._refuse()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_message_complete(self) -> None:
        self._reading = False  # the app works now: the timer, if it fires, does nothing
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refusal:
            self._answer_and_close(self._refusal, f"request headers exceed {self.max_header_bytes} bytes "
                                                  f"or {self.max_headers} fields")
            return
        super().send_400_response(msg)

    # -- helpers --------------------------------------------------------------------------
    def _refuse(self) -> None:
        self._refusal = 431
        raise _Refused()  # httptools stops parsing; uvicorn calls send_400_response

    def _arm(self) -> None:
        """Start timing a read (from now). The timer is not made per request nor per chunk:
        when it fires it does nothing unless a read is under way, and sleeps again for
        the rest of the gap if a byte came since (measured: ~1 us per request instead of
        ~5 us with a timer per request)."""
        self._last_read = self.loop.time()
        self._reading = True
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self._reading or self.transport.is_closing():
            return  # between requests (uvicorn's keep-alive timeout rules) or closing
        left = self._last_read + self.read_timeout_s - self.loop.time()
        if left > 0:  # a byte came meanwhile: wait for the rest of the gap
            self._read_timer = self.loop.call_later(left, self._read_timed_out)
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            self._answer_and_close(408, f"no request data for {self.read_timeout_s:g} s")
        else:
            self.transport.close()
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()  # an app waiting for the body sees the disconnect

    def _answer_and_close(self, status: int, msg: str) -> None:
        body = msg.encode()
        self.transport.write(b"".join((
            b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status]),
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body), body)))
        self.transport.close()


def bounded_protocol(*, max_header_bytes: int, max_headers: int, read_timeout_s: float) -> type[BoundedHttpProtocol]:
    """A `BoundedHttpProtocol` class with these limits (uvicorn's `http=` takes a class)."""
    return type("BoundedHttpProtocol", (BoundedHttpProtocol,), {
        "max_header_bytes": max_header_bytes, "max_headers": max_headers, "read_timeout_s": read_timeout_s})
