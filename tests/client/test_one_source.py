"""The synchronous and asyncio clients cannot drift apart.

- `doq_client/client.py` is what `clients/python/unasync.py` generates from
  `doq_client/aio.py` (the one source of both clients), `doq_client/producer.py` what it
  generates from `doq_client/aio_producer.py` (the one source of both producers),
  `doq_client/consumer.py` what it generates from `doq_client/aio_consumer.py` (the one
  source of both consumers), and `doq_client/worker.py` what it generates from
  `doq_client/aio_worker.py` (the one source of both workers);
- each sync/asyncio pair (client, producer, consumer, worker) offers the methods listed
  here, with the same parameters (names, kinds, defaults), the asyncio one as coroutines
  where the sync one blocks; the few differences are listed and nothing else differs.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from types import ModuleType
from typing import Any

import pytest

import doq_client
from tests.client.conftest import CLIENT_DIR

CLIENT_METHODS = {
    "ack", "ack_batch", "cancel_redrive", "close", "create_key", "create_queue", "delete",
    "delete_queue", "dequeue", "enqueue", "enqueue_batch", "get", "get_queue", "get_redrive",
    "list_groups", "list_keys", "list_queues", "list_queues_page", "nack", "peek",
    "purge_queue", "redrive", "reset_group", "revoke_key", "set_group_policy", "touch",
    "update_priority", "update_queue",
}
# name: (the sync class's public methods, those of the asyncio one that are coroutines
# (or async generators), those that are plain methods on both)
PAIRS: dict[str, tuple[type, type, set[str], set[str]]] = {
    "client": (doq_client.DoqClient, doq_client.AsyncDoqClient, CLIENT_METHODS,
               {"producer", "consumer", "worker"}),
    "producer": (doq_client.Producer, doq_client.AsyncProducer,
                 {"enqueue", "send", "enqueue_many", "flush", "close"}, set()),
    "consumer": (doq_client.Consumer, doq_client.AsyncConsumer, {"next", "batches", "close"},
                 {"ack", "ack_many", "nack"}),
    "worker": (doq_client.Worker, doq_client.AsyncWorker, {"run"}, {"stop"}),
}
# where the pair differs on purpose: a sync worker can also run in its own thread
SIGNATURE_DIFFERENCES: set[tuple[str, str]] = set()
SYNC_ONLY = {"worker": {"start", "join"}}
SYNC_ONLY_PROTOCOLS = {"worker": {"__enter__", "__exit__"}}  # with worker: start, then stop and join
PROTOCOLS = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__iter__": "__aiter__"}


def _unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doq_unasync", CLIENT_DIR / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public(cls: type) -> dict[str, Any]:
    """Public methods defined by `cls` (or a base of the client package)."""
    return {n: getattr(cls, n) for n in dir(cls)
            if not n.startswith("_") and callable(getattr(cls, n))
            and not isinstance(inspect.getattr_static(cls, n), property)}


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_sync_client_is_generated_from_the_asyncio_one() -> None:
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio.py").read_text()
    assert (CLIENT_DIR / "doq_client" / "client.py").read_text() == unasync.generate(source)
    assert unasync.main(["--check"]) == 0


def test_a_stale_rule_of_the_generator_is_an_error() -> None:
    unasync = _unasync()
    with pytest.raises(ValueError, match="matches nothing"):
        unasync.generate("class AsyncDoqClient: ...\n")


def test_the_generated_client_differs_from_its_source_only_by_the_rules() -> None:
    # a method added to the source is in the generated client, blocking
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio.py").read_text()
    marker = "    # -- queues ---"
    added = source.replace(marker, "    async def ping(self) -> None:\n"
                                   "        await self._call(_ops.list_keys())\n\n" + marker)
    generated = unasync.generate(added)
    assert "    def ping(self) -> None:\n        self._call(_ops.list_keys())\n" in generated


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_pair_offers_the_same_methods(name: str) -> None:
    sync_cls, async_cls, blocking, plain = PAIRS[name]
    sync_methods, async_methods = _public(sync_cls), _public(async_cls)
    assert set(sync_methods) == blocking | plain | SYNC_ONLY.get(name, set())
    assert set(async_methods) == blocking | plain
    for method in blocking | plain:
        s, a = sync_methods[method], async_methods[method]
        if (name, method) not in SIGNATURE_DIFFERENCES:
            assert _params(s) == _params(a), (name, method)
        is_async = inspect.iscoroutinefunction(a) or inspect.isasyncgenfunction(a)
        assert is_async == (method in blocking), (name, method)
        assert not inspect.iscoroutinefunction(s) and not inspect.isasyncgenfunction(s)
    assert _params(sync_cls.__init__) == _params(async_cls.__init__), name  # type: ignore[misc]
    for sync_name, async_name in PROTOCOLS.items():
        if sync_name in SYNC_ONLY_PROTOCOLS.get(name, set()):
            assert hasattr(sync_cls, sync_name) and not hasattr(async_cls, async_name)
        else:
            assert hasattr(sync_cls, sync_name) == hasattr(async_cls, async_name), (name, sync_name)


def test_the_listed_differences_are_real() -> None:
    # so the exceptions above cannot outlive what they excuse
    for name, method in SIGNATURE_DIFFERENCES:
        sync_cls, async_cls, _, _ = PAIRS[name]
        assert _params(getattr(sync_cls, method)) != _params(getattr(async_cls, method))
    for name, methods in SYNC_ONLY.items():
        assert not any(hasattr(PAIRS[name][1], m) for m in methods)



def test_the_sync_worker_is_generated_from_the_asyncio_one() -> None:
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_worker.py").read_text()
    assert (CLIENT_DIR / "doq_client" / "worker.py").read_text() == unasync.generate(source, "aio_worker.py")
    with pytest.raises(ValueError, match="matches nothing in aio_worker.py"):
        unasync.generate("class AsyncWorker: ...\n", "aio_worker.py")


def test_a_step_added_to_the_asyncio_worker_is_in_the_sync_one_with_its_twins() -> None:
    # the asyncio lock and waits become threading's; a `_worker_io` step its `*_sync` twin
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_worker.py").read_text()
    marker = "    async def _serve(self) -> None:"
    added = source.replace(marker, "    async def _idle(self) -> None:\n"
                                   "        async with self._lock:\n"
                                   "            await wait_aio(self._changed, MAIN_WAIT_S)\n\n" + marker)
    generated = unasync.generate(added, "aio_worker.py")
    assert ("    def _idle(self) -> None:\n        with self._lock:\n"
            "            wait_sync(self._changed, MAIN_WAIT_S)\n") in generated
    assert not [w for w in ("asyncio.", "_aio(", "async def", "async with", "await ") if w in generated]


# -- adding a field to one RPC -------------------------------------------------------------
_GENERATED = {"client.py", "worker.py", "producer.py", "consumer.py"}  # written by unasync.py


def _hand_written() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CLIENT_DIR / "doq_client").glob("*.py"))
            if p.name not in _GENERATED}


def test_a_field_added_to_one_rpc_touches_one_client_source() -> None:
    """Adding a field to `Peek` (a parameter of both clients' `peek`) is one edit of the
    clients' one source, `aio.py`, beside the request it builds in the sans-IO `_ops.py`:
    no other hand-written client module names Peek's request or op, and the sync client
    gets the field by generation (checked here on a source with the field added)."""
    files = _hand_written()
    assert [n for n, t in files.items() if "pb.PeekRequest" in t] == ["_ops.py"]
    assert [n for n, t in files.items() if "_ops.peek(" in t] == ["aio.py"]
    source = files["aio.py"]
    old_sig = 'async def peek(self, queue: str, limit: int = 20, *, state: str = "ready", offset: int = 0)'
    old_call = "await self._call(_ops.peek(queue, state, offset, limit))"
    assert old_sig in source and old_call in source
    added = source.replace(old_sig, old_sig.replace("offset: int = 0)", "offset: int = 0, since_ms: int = 0)"))
    added = added.replace(old_call, "await self._call(_ops.peek(queue, state, offset, limit, since_ms))")
    generated = _unasync().generate(added)
    assert 'def peek(self, queue: str, limit: int = 20, *, state: str = "ready", offset: int = 0, ' \
           "since_ms: int = 0)" in generated
    assert "return self._call(_ops.peek(queue, state, offset, limit, since_ms))" in generated


def test_every_unary_request_is_built_in_one_place_and_called_from_one_client_source() -> None:
    """For every unary RPC of the client: its request type is built only in `_ops.py` and
    its op is called from `aio.py` (and the worker's and consumer's own settles), but for
    the enqueues and nacks, whose requests streams build too (from one helper,
    `types.enqueue_request` / `types.nack_request`; a consumer settles a built nack with
    `nack_pb`)."""
    files = _hand_written()
    ops = files["_ops.py"]
    shared_requests = {"Enqueue", "EnqueueBatch", "Nack"}  # the streams' frames carry them too
    for method in sorted(set(re.findall(r'Op\(\s*"(\w+)"', ops)) - shared_requests):
        builders = [n for n, t in files.items() if f"pb.{method}Request" in t]
        assert builders == ["_ops.py"], (method, builders)
    uses = {"aio.py", "aio_worker.py", "_worker_core.py", "_consumer_core.py"}
    for fn in set(re.findall(r"^def ([a-z]\w*)\(", ops, flags=re.MULTILINE)) - {"nack_pb"}:
        callers = {n for n, t in files.items() if f"_ops.{fn}(" in t}
        assert callers <= uses and "aio.py" in callers, (fn, callers)
    assert {n for n, t in files.items() if "_ops.nack_pb(" in t} == {"_consumer_core.py"}


def test_the_sync_producer_is_generated_from_the_asyncio_one() -> None:
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_producer.py").read_text()
    assert (CLIENT_DIR / "doq_client" / "producer.py").read_text() == unasync.generate(source, "aio_producer.py")
    with pytest.raises(ValueError, match="matches nothing in aio_producer.py"):
        unasync.generate("class AsyncProducer: ...\n", "aio_producer.py")


def test_a_step_added_to_the_asyncio_producer_is_in_the_sync_one_with_its_lock_and_twins() -> None:
    # the asyncio producer's no-op lock is the sync one's RLock, its signals conditions of
    # it, and a `_producer_io` step its `*_sync` twin
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_producer.py").read_text()
    marker = "    async def _stream(self) -> None:"
    added = source.replace(marker, "    async def _idle(self) -> bool:\n"
                                   "        with self._lock:\n"
                                   "            return await wait_for_aio(self._results, self._flushed, 1.0)\n\n"
                                   + marker)
    generated = unasync.generate(added, "aio_producer.py")
    assert ("    def _idle(self) -> bool:\n        with self._lock:\n"
            "            return wait_for_sync(self._results, self._flushed, 1.0)\n") in generated
    assert "self._lock = threading.RLock()" in generated
    assert "self._results = ThreadSignal(self._lock)" in generated
    assert not [w for w in ("asyncio.", "_aio(", "async def", "async for", "await ", "NoLock", "AioSignal")
                if w in generated]


def test_the_sync_consumer_is_generated_from_the_asyncio_one() -> None:
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_consumer.py").read_text()
    assert (CLIENT_DIR / "doq_client" / "consumer.py").read_text() == unasync.generate(source, "aio_consumer.py")
    with pytest.raises(ValueError, match="matches nothing in aio_consumer.py"):
        unasync.generate("class AsyncConsumer: ...\n", "aio_consumer.py")


def test_a_step_added_to_the_asyncio_consumer_is_in_the_sync_one_with_its_lock_and_twins() -> None:
    # the asyncio consumer's no-op lock is the sync one's Lock, its wake-up a queue's, and
    # a `_consumer_io` step its `*_sync` twin
    unasync = _unasync()
    source = (CLIENT_DIR / "doq_client" / "aio_consumer.py").read_text()
    marker = "    async def _fill(self) -> bool:"
    added = source.replace(marker, "    async def _skip(self) -> bool:\n"
                                   "        with self._lock:\n"
                                   "            resp = await read_aio(self._call)\n"
                                   "        await self._wake.wait(ACK_INTERVAL_S)\n"
                                   "        return resp is not None\n\n" + marker)
    generated = unasync.generate(added, "aio_consumer.py")
    assert ("    def _skip(self) -> bool:\n        with self._lock:\n"
            "            resp = read_sync(self._call)\n"
            "        self._wake.wait(ACK_INTERVAL_S)\n") in generated
    assert "self._lock = threading.Lock()" in generated
    assert "self._wake = ThreadWake()" in generated
    assert not [w for w in ("asyncio.", "_aio(", "async def", "async for ", "await ", "NoLock", "AioWake",
                            "__aiter__", "AsyncIterator")
                if w in generated]


def test_the_consumer_module_keeps_its_names() -> None:
    # `doq_client.consumer` defined both consumers before it was generated: both stay there
    from doq_client import consumer

    assert consumer.Consumer is doq_client.Consumer
    assert consumer.AsyncConsumer is doq_client.AsyncConsumer
    assert set(consumer.__all__) == {"ACK_INTERVAL_S", "AsyncConsumer", "Consumer"}
