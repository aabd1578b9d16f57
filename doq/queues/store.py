"""The tiny storage interface the machine writes its mutations through."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class Store(Protocol):
    """Key/value view of the replicated records, bound to the current write transaction.

    `get` sees the machine's own earlier puts/deletes (read-your-writes). `insert` and
    `insert_many` write records whose keys do not exist (fresh message ids): a store may
    skip reading an old value. `delete_many` is `delete` of each key, in one call.
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

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All records in key order (what `QueueMachine.load` expects)."""
        for k in sorted(self.data):
            yield k, self.data[k]
