"""The tiny storage interface the machine writes its mutations through."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol


class Store(Protocol):
    """Key/value view of the replicated records, bound to the current write transaction.

    `get` sees the machine's own earlier puts/deletes (read-your-writes). `insert` and
    `insert_many` write records whose keys do not exist (fresh message ids): a store may
    skip reading an old value. The `*_many` calls do what their single-key counterparts
    do for each key in turn, in fewer calls (`delete_many`: `delete` of each key).
    """

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def insert(self, key: bytes, value: bytes) -> None: ...

    def insert_many(self, keys: list[bytes], head: bytes, tails: list[bytes]) -> None:
        """Insert record `keys[i]` = `head + tails[i]` for each i (keys of one kind)."""
        ...

    def delete(self, key: bytes) -> None: ...

    def delete_many(self, keys: list[bytes]) -> None:
        """`delete` of each key (keys of one kind)."""
        ...

    def rewrite_many(self, keys: list[bytes], edit: Callable[[list[bytes]], list[bytes]], *,
                     lease_only: bool = False) -> None:
        """Put record `keys[i]` = `edit(old)[i]`, `old` being the current records of `keys`
        (distinct keys of one kind, each of which exists); `edit` is called once.
        `lease_only`: the caller's word that `edit` changes only the lease fields of
        message records (`doq.queues.records.lease_only`), so a store need not compare."""
        ...

    def pop_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Delete each of `keys` (of one kind); their records before (None if absent)."""
        ...


class MemoryStore:
    """A dict-backed `Store` (tests, simulation)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def insert(self, key: bytes, value: bytes) -> None:
        assert key not in self.data, key
        self.data[key] = value

    def insert_many(self, keys: list[bytes], head: bytes, tails: list[bytes]) -> None:
        for k, t in zip(keys, tails, strict=True):
            self.insert(k, head + t)

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def delete_many(self, keys: list[bytes]) -> None:
        for k in keys:
            self.data.pop(k, None)

    def rewrite_many(self, keys: list[bytes], edit: Callable[[list[bytes]], list[bytes]], *,
                     lease_only: bool = False) -> None:
        news = edit([self.data[k] for k in keys])
        self.data.update(zip(keys, news, strict=True))

    def pop_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.data.pop(k, None) for k in keys]

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All records in key order (what `QueueMachine.load` expects)."""
        for k in sorted(self.data):
            yield k, self.data[k]
