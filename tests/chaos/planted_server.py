"""`doq` with a planted bug, to show that the chaos checker catches it (tests only).

Bug "ack before commit": the single-node log answers each proposal as soon as it is
applied inside an open LMDB write transaction, and commits that transaction only every
`COMMIT_EVERY_S` seconds. Everything looks fine until a kill -9 loses what was
acknowledged since the last commit.

Run as a script with `doq`'s arguments: `python tests/chaos/planted_server.py serve ...`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from doq.cli import main
from doq.node import local

COMMIT_EVERY_S = 1.0


def _commit_late(self: Any, index: int, batch: Any) -> list[object]:
    """Writer thread: apply in the open transaction; commit it only now and then."""
    txn = getattr(self, "_planted_txn", None)
    if txn is None:
        txn = self._planted_txn = self.env.begin(write=True)
        self._planted_since = time.monotonic()
    results: list[object] = self.state.apply_entries(txn, [(index, batch)])[0]
    if time.monotonic() - self._planted_since >= COMMIT_EVERY_S:
        txn.commit()
        self._planted_txn = None
    return results


if __name__ == "__main__":
    assert "_commit" in vars(local.LocalNode), "LocalNode._commit moved: re-plant the bug"
    local.LocalNode._commit = _commit_late  # type: ignore[method-assign]
    print("planted: ack before commit", file=sys.stderr, flush=True)
    sys.exit(main())
