"""A stand-in for `doq.storage.load_worker` that fails as `$DOQ_FAKE_LOAD_WORKER` says
(tests/storage/test_parallel_load.py): exit, garbage, other transaction, unfit columns, hang."""

from __future__ import annotations

import marshal
import os
import sys
import time

from doq.storage.state import LOAD_WORKER_MAGIC


def main() -> int:
    mode = os.environ["DOQ_FAKE_LOAD_WORKER"]
    txn_id = int(sys.argv[3])
    out = sys.stdout.buffer
    if mode == "exit":
        print("failed on purpose", file=sys.stderr)
        return 3
    if mode == "garbage":
        out.write(b"\x00\xffnot marshal" * 100)
    elif mode == "other transaction":
        out.write(marshal.dumps((LOAD_WORKER_MAGIC, txn_id + 1, [])))
    elif mode == "unfit columns":
        out.write(marshal.dumps((LOAD_WORKER_MAGIC, txn_id,
                                 [("c", "no such queue", True, 0, 0, None, bytes(8), bytes(8), bytes(8), b"", b"", [])])))
    elif mode == "hang":
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
