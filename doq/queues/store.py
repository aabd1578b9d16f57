"""The tiny storage interface the machine writes its mutations through."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class Store(Protocol):
    """Key/value view of the replicated records, bound to the current write transaction.

    `get` sees the machine's own earlier puts/deletes (read-your-writes).
    """

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...


class MemoryStore:
    """A dict-backed `Store` (tests, simulation)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All records in key order (what `QueueMachine.load` expects)."""
        for k in sorted(self.data):
            yield k, self.data[k]
