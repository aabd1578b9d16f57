#!/usr/bin/env python3
"""Generate the synchronous client from the asyncio one: one source for both.

`doq_client/aio.py` (`AsyncDoqClient`) is the source; `doq_client/client.py`
(`DoqClient`) is written from it by the substitutions below (the approach of httpcore's
`scripts/unasync.py`): `async def` -> `def`, no `await`, the asyncio names to their
synchronous twins, and each `doq_client._transport.*_aio` helper to its `*_sync` twin
(where gRPC's two APIs differ in more than `await`). Every substitution must apply at
least once, so a rule that no longer matches the source is an error, not a silent skip.

    python clients/python/unasync.py           # write doq_client/client.py
    python clients/python/unasync.py --check   # exit 1 if client.py is not what it generates

Edit `aio.py` (or `_transport.py`), never `client.py`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "doq_client" / "aio.py"
TARGET = HERE / "doq_client" / "client.py"

HEADER = (
    "# Generated from doq_client/aio.py by clients/python/unasync.py: do not edit.\n"
    "# Edit aio.py, then run `python clients/python/unasync.py`.\n"
    "# The imports keep the source's order:\n"
    "# ruff: noqa: I001\n"
)

# (pattern, replacement); applied in order, to code and docstrings alike.
SUBSTITUTIONS: list[tuple[str, str]] = [
    # prose that differs (whole phrases of the source's docstrings)
    (r"the asyncio client \(one `grpc\.aio\.Channel` per node address\)",
     "the synchronous client (thread-safe; one `grpc.Channel` per node address)"),
    (r" The methods are coroutines: create and use the client in one running event loop\.", ""),
    (r"asyncio doq client: each method is a coroutine; use it inside one running event loop\.",
     "Synchronous doq client; thread-safe."),
    # the language
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"^import asyncio\n", ""),
    (r"^import logging\n", "import logging\nimport time\n"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    # the client's own names
    (r"\bAsyncDoqClient\b", "DoqClient"),
    (r"\bAsyncProducer\b", "Producer"),
    (r"\bAsyncConsumer\b", "Consumer"),
    (r"\bAsyncWorker\b", "Worker"),
    (r"\bAsyncHandler\b", "Handler"),
    (r"\bdoq_client\.aio_worker\b", "doq_client.worker"),
    (r"\bAioChannel\b", "SyncChannel"),
    (r"\b(open_channel|given_channel|unary)_aio\b", r"\1_sync"),
    (r'_handle\.provide\("async", ', '_handle.provide("sync", '),
]


def generate(source: str) -> str:
    """The synchronous client's text from the asyncio client's `source`."""
    out = source
    for pattern, replacement in SUBSTITUTIONS:
        out, n = re.subn(pattern, replacement, out, flags=re.MULTILINE)
        if n == 0:
            raise ValueError(f"unasync: {pattern!r} matches nothing in {SOURCE.name}: update the rules")
    return HEADER + out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    text = generate(SOURCE.read_text())
    if check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is not generated from {SOURCE.name}: run `python {Path(__file__).name}`",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
