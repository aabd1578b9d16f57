#!/usr/bin/env python3
"""Generate the synchronous client, producer, consumer and worker from the asyncio ones: one source for each pair.

- `doq_client/aio.py` (`AsyncDoqClient`) is the source of `doq_client/client.py`
  (`DoqClient`); each `doq_client._transport.*_aio` helper becomes its `*_sync` twin
  (where gRPC's two APIs differ in more than `await`).
- `doq_client/aio_worker.py` (`AsyncWorker`, tasks) is the source of
  `doq_client/worker.py` (`Worker`, threads): asyncio's lock, conditions and event become
  threading's, and each `doq_client._worker_io.*_aio` step its `*_sync` twin.
- `doq_client/aio_producer.py` (`AsyncProducer`, a task) is the source of
  `doq_client/producer.py` (`Producer`, threads): its `NoLock` becomes an `RLock`, its
  `AioSignal`s conditions of that lock, its loop's futures `LazyFuture`s, each
  `doq_client._producer_io.*_aio` step its `*_sync` twin.
- `doq_client/aio_consumer.py` (`AsyncConsumer`) is the source of
  `doq_client/consumer.py` (`Consumer`, thread-safe acks): its `NoLock` becomes a `Lock`,
  its `AioWake` a `ThreadWake`, asyncio's event threading's, each
  `doq_client._consumer_io.*_aio` step its `*_sync` twin.

Each is written by the substitutions below (the approach of httpcore's
`scripts/unasync.py`): `async def` -> `def`, no `await`, the asyncio names to their
synchronous twins. Every substitution must apply at least once, so a rule that no longer
matches its source is an error, not a silent skip.

    python clients/python/unasync.py           # write client.py, producer.py, consumer.py, worker.py
    python clients/python/unasync.py --check   # exit 1 if one is not what it generates

Edit `aio.py`, `aio_producer.py`, `aio_consumer.py`, `aio_worker.py` (or `_transport.py`,
`_producer_io.py`, `_consumer_io.py`, `_worker_io.py`), never `client.py`, `producer.py`,
`consumer.py` or `worker.py`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PKG = HERE / "doq_client"


def _header(source: str) -> str:
    return (
        f"# Generated from doq_client/{source} by clients/python/unasync.py: do not edit.\n"
        f"# Edit {source}, then run `python clients/python/unasync.py`.\n"
        "# The imports keep the source's order:\n"
        "# ruff: noqa: I001\n"
    )


# the language, as both sources use it
_LANGUAGE: list[tuple[str, str]] = [
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
]

# (pattern, replacement); applied in order, to code and docstrings alike.
CLIENT_RULES: list[tuple[str, str]] = [
    # prose that differs (whole phrases of the source's docstrings)
    (r"the asyncio client \(one `grpc\.aio\.Channel` per node address\)",
     "the synchronous client (thread-safe; one `grpc.Channel` per node address)"),
    (r" The methods are coroutines: create and use the client in one running event loop\.", ""),
    (r"asyncio doq client: each method is a coroutine; use it inside one running event loop\.",
     "Synchronous doq client; thread-safe."),
    # the language
    *_LANGUAGE,
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
    (r"\bdoq_client\.aio_producer\b", "doq_client.producer"),
    (r"\bdoq_client\.aio_consumer\b", "doq_client.consumer"),
    (r"\bAioChannel\b", "SyncChannel"),
    (r"\b(open_channel|given_channel|unary)_aio\b", r"\1_sync"),
    (r'_handle\.provide\("async", ', '_handle.provide("sync", '),
]

WORKER_RULES: list[tuple[str, str]] = [
    # prose that differs
    (r'^"""`AsyncWorker`: runs a coroutine function on a queue\'s messages with a concurrency '
     r"\(tasks\)\.\n\nThis file is also the source of the synchronous `doq_client\.worker\.Worker` "
     r"\(threads\),\nwhich `clients/python/unasync\.py` writes from it: edit this one\. ",
     '"""`Worker`: runs a handler on a queue\'s messages with a concurrency (threads).\n\n'
     "Generated from the asyncio worker, `doq_client/aio_worker.py`: one source. "),
    (r"Runs `await handler\(msg\)`", "Runs `handler(msg)`"),
    (r"Make it with `AsyncDoqClient\.worker\(\.\.\.\)`, `await worker\.run\(\)`;\n"
     r"    `stop\(\)` ends it gracefully\.",
     "Make it with `DoqClient.worker(...)`; `run()` it (blocks), or\n"
     "    `start()` it in a background thread and `stop()` / `join()` it (or use it as a\n"
     "    context manager); `stop()` ends it gracefully."),
    # the language
    *_LANGUAGE,
    (r"\basync with ", "with "),
    (r"^import asyncio\n", ""),
    (r"^import time\n", "import threading\nimport time\n"),
    (r"\basyncio\.Lock\(\)", "threading.RLock()  # RLock: stop() may run in a signal handler"),
    (r"\basyncio\.Condition\b", "threading.Condition"),
    (r"\basyncio\.Event\b", "threading.Event"),
    (r"^from collections\.abc import Awaitable, Callable\n", "from collections.abc import Callable\n"),
    (r"Awaitable\[Any\]", "Any"),
    # the worker's own names
    (r"\bAsyncWorker\b", "Worker"),
    (r"\bAsyncHandler\b", "Handler"),
    (r"\bAsyncClient\b", "SyncClient"),
    (r"\bAioShell\b", "ThreadShell"),
    (r"\b(abandon|check_handler|here|interrupted_grace_s|signals|spawn|stop|wait|wait_event)_aio\b",
     r"\1_sync"),
]

PRODUCER_RULES: list[tuple[str, str]] = [
    # prose that differs
    (r'^"""`AsyncProducer`: many enqueues in flight on one EnqueueBatchStream / EnqueueStream '
     r"\(a task\)\.\n\nThis file is also the source of the synchronous `doq_client\.producer\.Producer` "
     r"\(threads\),\nwhich `clients/python/unasync\.py` writes from it: edit this one\. ",
     '"""`Producer`: many enqueues in flight on one EnqueueBatchStream / EnqueueStream (threads).\n\n'
     "Generated from the asyncio producer, `doq_client/aio_producer.py`: one source. "),
    (r"asyncio producer over a stream of an `AsyncDoqClient` \(or of one `grpc\.aio\.Channel`,\n"
     r"    retried on that channel only\); use it in one event loop\.\n\n"
     r"    A task reads responses \(and reconnects\); `enqueue` waits only while the window is full\.",
     "Thread-safe synchronous producer over a stream of a `DoqClient` (or of one\n"
     "    `grpc.Channel`, retried on that channel only).\n\n"
     "    A background thread reads responses (and reconnects); `enqueue` blocks only while the\n"
     "    window is full."),
    # the language
    *_LANGUAGE,
    (r"\basync for ", "for "),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"^import asyncio\n", "import concurrent.futures\nimport threading\nimport time\n"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basyncio\.get_running_loop\(\)\.create_future\(\)", "LazyFuture()"),  # inline: a call per message
    (r"^from doq_client\._producer_io import", "from doq_client._future import LazyFuture\nfrom doq_client._producer_io import"),
    (r"\basyncio\.Future\b", "concurrent.futures.Future"),
    (r"\basyncio\.Task\[None\]", "threading.Thread"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bgrpc\.aio\.Channel\b", "grpc.Channel"),
    (r'\bclient_on\(client, "async"\)', 'client_on(client, "sync")'),
    (r"^    NoLock,\n", ""),
    (r"\bNoLock\(\)", "threading.RLock()"),
    # the producer's own names
    (r"\bAsyncProducer\b", "Producer"),
    (r"\bAsyncClient\b", "SyncClient"),
    (r"\bAioSignal\b", "ThreadSignal"),
    (r"\b(CANCELLED|join|spawn|wait_for)_aio\b", r"\1_sync"),
    (r"for request in frame:\n\s+yield request\n", "yield from frame\n"),  # no `yield from` in async
]

CONSUMER_RULES: list[tuple[str, str]] = [
    # prose that differs
    (r'^"""`AsyncConsumer`: a prefetching consumer over (.*)\n\nThis file is also the source of the '
     r"synchronous `doq_client\.consumer\.Consumer` \(threads\),\nwhich `clients/python/unasync\.py` "
     r"writes from it: edit this one\. ",
     '"""`Consumer`: a prefetching consumer over \\1\n\n'
     "Generated from the asyncio consumer, `doq_client/aio_consumer.py`: one source. "),
    (r"asyncio consumer on an `AsyncDoqClient` \(or one `grpc\.aio\.Channel`, reopened on that\n"
     r"    channel only\)\. Use `async with` and `async for`\.",
     "Synchronous consumer on a `DoqClient` (or one `grpc.Channel`, reopened on that\n"
     "    channel only); iterate it in one thread. `ack`/`nack` may be called from any thread\n"
     "    (for a message from a failed stream they return once the unary call is answered)."),
    (r"end the stream \(see the module docstring\)\. Idempotent\.",
     "end the stream (see the module docstring). Idempotent; call it from the thread that\n"
     "        iterates."),
    # the language
    *_LANGUAGE,
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"^import asyncio\n", "import threading\n"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basyncio\.Event\b", "threading.Event"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bgrpc\.aio\.Channel\b", "grpc.Channel"),
    (r'\bclient_on\(client, "async"\)', 'client_on(client, "sync")'),
    (r"^    NoLock,\n", ""),
    (r"\bNoLock\(\)", "threading.Lock()"),
    # the consumer's own names
    (r"\bAsyncConsumer\b", "Consumer"),
    (r"\bAsyncClient\b", "SyncClient"),
    (r"\bAioWake\b", "ThreadWake"),
    (r"\b(drain|join|read|release|settle)_aio\b", r"\1_sync"),
    # `doq_client.consumer.AsyncConsumer` stays importable (it was defined there)
    (r'^__all__ = \["ACK_INTERVAL_S", "Consumer"\]\n',
     "from doq_client.aio_consumer import AsyncConsumer  # the asyncio twin, as before\n\n"
     '__all__ = ["ACK_INTERVAL_S", "AsyncConsumer", "Consumer"]\n'),
]

# source -> (target, rules): each sync module written from its asyncio source
JOBS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "aio.py": ("client.py", CLIENT_RULES),
    "aio_worker.py": ("worker.py", WORKER_RULES),
    "aio_producer.py": ("producer.py", PRODUCER_RULES),
    "aio_consumer.py": ("consumer.py", CONSUMER_RULES),
}


def generate(source: str, name: str = "aio.py") -> str:
    """The synchronous module's text from the asyncio module `name`'s `source`."""
    out = source
    for pattern, replacement in JOBS[name][1]:
        out, n = re.subn(pattern, replacement, out, flags=re.MULTILINE)
        if n == 0:
            raise ValueError(f"unasync: {pattern!r} matches nothing in {name}: update the rules")
    return _header(name) + out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, (target_name, _) in JOBS.items():
        target = PKG / target_name
        text = generate((PKG / name).read_text(), name)
        if check:
            if not target.exists() or target.read_text() != text:
                stale.append(f"{target} is not generated from {name}")
        else:
            target.write_text(text)
    if stale:
        print("\n".join(stale) + f": run `python {Path(__file__).name}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
