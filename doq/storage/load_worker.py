"""The second process of a start's load (`doq.storage.state.StateStore`, `_load_machine`).

`python -m doq.storage.load_worker ENV_PATH SPLIT_HEX TXN_ID SPLIT_RECORDS` opens the node's LMDB
environment read-only, checks that its read transaction is the one the starting process
reads (`TXN_ID`: nothing wrote in between), loads the queues and the meta record, reads
the message records from key `SPLIT_HEX` on (their gone and leased ones resolved as the
start does) and writes `marshal.dumps((LOAD_WORKER_MAGIC, TXN_ID, segments))` to its
standard output: `QueueMachine.segments` of them (arrays as bytes; the chunks to be taken
record by record as their records; a delayed queue's many ready pairs distributed into
pair ranges, for about `SPLIT_RECORDS` pairs in the queue holding the split key, the start's
grid). Its progress is a byte on standard error when it starts
and every `PROGRESS_CHUNKS` chunks (the start kills a worker that stops progressing); it
exits when the starting process is gone. Exits non-zero, with a last line on standard
error, if anything fails; the starting process then loads alone. Imports only the storage
layer and the queues core (not the server)."""

from __future__ import annotations

import gc
import marshal
import os
import sys
from collections.abc import Callable

import lmdb

from doq.queues.machine import QueueMachine
from doq.queues.store import MemoryStore
from doq.storage.env import MAX_DBS
from doq.storage.state import LOAD_WORKER_MAGIC, machine_records, message_overrides

_DBS = (b"state_meta", b"state_queues", b"state_messages", b"state_leases", b"state_gone")
PROGRESS_CHUNKS = 16  # chunks of records (`machine._CHUNK` each) per progress byte


def _progress() -> Callable[[], None]:
    """Called once per chunk: a byte on standard error every `PROGRESS_CHUNKS`; exits if
    the starting process is gone (this worker was orphaned)."""
    parent = os.getppid()
    err = sys.stderr.buffer
    n = 0

    def step() -> None:
        nonlocal n
        n += 1
        if n % PROGRESS_CHUNKS == 0:
            if os.getppid() != parent:
                raise SystemExit(2)
            err.write(b".")
            err.flush()

    return step


def segments_of(env: lmdb.Environment, split: bytes, txn_id: int,
                progress: Callable[[], None] | None = None, split_records: int | None = None) -> bytes:
    """The answer (see the module docstring) for the records of `env` from `split` on."""
    with env.begin() as txn:
        if txn.id() != txn_id:
            raise RuntimeError(f"read transaction {txn.id()}, not {txn_id}: the store changed")
        dbs = {n: env.open_db(n, txn=txn, create=False) for n in _DBS}
        gone = [bytes(g[8:]) for g in txn.cursor(db=dbs[b"state_gone"]).iternext(values=False)]
        overrides = message_overrides(txn, dbs[b"state_messages"], dbs[b"state_leases"], gone, split)
        cur = txn.cursor(db=dbs[b"state_messages"])
        msgs = cur.iternext() if cur.set_range(split) else iter(())
        m = QueueMachine(MemoryStore())
        segs = m.segments_of(machine_records(txn, dbs, dedups=False), msgs, 8, overrides or None, progress,
                             split_records)
        return marshal.dumps((LOAD_WORKER_MAGIC, txn_id, segs))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path, split_hex, txn_id = args[0], bytes.fromhex(args[1]), int(args[2])
        split_records = int(args[3]) if len(args) > 3 else None
        sys.stderr.buffer.write(b".")  # started
        sys.stderr.buffer.flush()
        gc.disable()  # millions of short-lived objects, no cycles (as the start's own load)
        env = lmdb.open(path, readonly=True, lock=True, max_dbs=MAX_DBS, readahead=False)
        try:
            out = segments_of(env, split_hex, txn_id, _progress(), split_records)
        finally:
            env.close()
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    except Exception as e:  # noqa: BLE001 - reported to the starting process, which loads alone
        print(f"\ndoq load worker: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
