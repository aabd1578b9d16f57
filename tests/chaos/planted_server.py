"""`doq` with a planted bug, to show that the chaos checker catches it (tests only).

Bug "ack before commit": the state store's write transaction (`StateStore.write`) stays
open across writes and commits only every `COMMIT_EVERY_S` seconds, while each write is
published to readers and answered at once; and the Raft log's segment files
(`SegmentLog`) get their records written only every `COMMIT_EVERY_S` seconds too (kept
in memory meanwhile, while the log counts them as written and synced). Everything looks
fine until a kill -9 loses what was acknowledged since the last commit (with either bug
alone, the other copy would bring it back at restart).

Run as a script with `doq`'s arguments: `python tests/chaos/planted_server.py serve ...`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from doq.cli import main
from doq.storage import segment_log
from doq.storage.segment_log import SegmentLog
from doq.storage.state import StateStore

COMMIT_EVERY_S = 5.0  # long: a kill loses the acks of up to 5 s, even when a loaded machine acks few
_honest_write = StateStore.write


@contextlib.contextmanager
def _write_late(self: Any, *, durable: bool = True, hold: Any = None) -> Iterator[Any]:
    """`StateStore.write` that commits only now and then (the writer thread's only txn;
    `durable` and the driver's `hold` ignored: nothing is ever held the honest way).
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


def _seg_write_late(self: Any, s: Any, batch: list[bytes], offset: int) -> None:
    """`SegmentLog._write` that keeps the bytes in memory and writes them (in order) only
    every `COMMIT_EVERY_S` seconds."""
    pending = self.__dict__.setdefault("_planted", [])
    since = self.__dict__.setdefault("_planted_since", time.monotonic())
    data = b"".join(batch)
    pending.append((s, data, offset))
    s.end = offset + len(data)
    self._dirty.add(s.seq)
    if time.monotonic() - since >= COMMIT_EVERY_S:
        for seg, d, off in pending:
            if seg in self._segs:  # not deleted meanwhile
                segment_log._write_all(seg.fd, d, off)
        pending.clear()
        self._planted_since = time.monotonic()


if __name__ == "__main__":
    assert callable(getattr(StateStore, "write", None)) and callable(getattr(StateStore, "_publish", None)), \
        "StateStore.write/_publish moved: re-plant the bug"
    assert callable(getattr(SegmentLog, "_write", None)), "SegmentLog._write moved: re-plant the bug"
    StateStore.write = _write_late  # type: ignore[method-assign]
    SegmentLog._write = _seg_write_late  # type: ignore[method-assign]
    print("planted: ack before commit", file=sys.stderr, flush=True)
    sys.exit(main())
