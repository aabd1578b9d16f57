"""A stand-in for `doq.storage.load_worker` that fails as `$DOQ_FAKE_LOAD_WORKER` says
(tests/storage/test_parallel_load.py): exit, garbage, other transaction, unfit columns, hang,
hang in its read transaction; or `slow`: shows progress for a while, then does the real work."""

from __future__ import annotations

import marshal
import os
import sys
import threading
import time


def main() -> int:
    mode = os.environ["DOQ_FAKE_LOAD_WORKER"]
    if mode == "slow":  # progress every 50 ms, from a thread, first thing, while 8 s pass; then the work
        def dots() -> None:
            while True:
                sys.stderr.buffer.write(b".")
                sys.stderr.buffer.flush()
                time.sleep(0.05)

        threading.Thread(target=dots, daemon=True).start()
        time.sleep(8)
        from doq.storage import load_worker
        return load_worker.main()
    import lmdb

    from doq.storage.env import MAX_DBS
    from doq.storage.state import LOAD_WORKER_MAGIC
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
                                 [("c", "no such queue", True, 0, 0, None, bytes(8), bytes(8), bytes(8), b"", b"", [], [])])))
    elif mode == "hang":
        time.sleep(3600)
    elif mode == "hang in its read transaction":
        env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=MAX_DBS)
        with env.begin():
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
