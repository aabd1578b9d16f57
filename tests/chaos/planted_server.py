"""`doq` with a planted bug, to show that the chaos checker catches it (tests only).

Bug "ack before commit": the state store's write transaction (`StateStore.write`) stays
open across writes and commits only every `COMMIT_EVERY_S` seconds, while each write is
published to readers and answered at once. Everything looks fine until a kill -9 loses
what was acknowledged since the last commit.

Run as a script with `doq`'s arguments: `python tests/chaos/planted_server.py serve ...`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from doq.cli import main
from doq.storage.state import StateStore

COMMIT_EVERY_S = 1.0
_honest_write = StateStore.write


@contextlib.contextmanager
def _write_late(self: Any, *, durable: bool = True) -> Iterator[Any]:
    """`StateStore.write` that commits only now and then (the writer thread's only txn;
    `durable` ignored).
    The write that creates a fresh node's cluster id commits at once: the node's start
    opens other write transactions after it, which would wait for this one forever."""
    if not self.cluster_id and getattr(self, "_planted_txn", None) is None:
        with _honest_write(self) as txn:
            yield txn
        return
    txn = getattr(self, "_planted_txn", None)
    if txn is None:
        txn = self._planted_txn = self.env.begin(write=True)
        self._planted_since = time.monotonic()
    yield txn
    if time.monotonic() - self._planted_since >= COMMIT_EVERY_S:
        txn.commit()
        self._planted_txn = None
    self._publish()  # readers and proposers see it now, committed or not


if __name__ == "__main__":
    assert callable(getattr(StateStore, "write", None)) and callable(getattr(StateStore, "_publish", None)), \
        "StateStore.write/_publish moved: re-plant the bug"
    StateStore.write = _write_late  # type: ignore[method-assign]
    print("planted: ack before commit", file=sys.stderr, flush=True)
    sys.exit(main())
