"""Backup throughput: `python bench/backup_throughput.py [--records N] [--value-bytes B] [--lmdb]`.

Writes N small records (key ~20 B, value B bytes, 1 in 10 a tombstone) to a backup file in
a temp dir and prints MB/s of record payload (key + value bytes) and of file bytes.
Without `--lmdb` the records come from memory (format cost only); with `--lmdb` N messages
of B bytes (1 in 10 then deleted) are first enqueued into a real StateStore and backed up
with `write_backup` (one read txn).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.backup.format import BackupReader, BackupWriter, Record


def _records(n: int, value_bytes: int) -> Iterator[Record]:
    pad = os.urandom(value_bytes).hex().encode()
    prefix = b"M" + len(b"orders-queue").to_bytes(2, "big") + b"orders-queue"
    for i in range(n):
        key = prefix + i.to_bytes(8, "big")  # a message key of doq.queues.keys
        value = (b'{"user_id": %d, "event": "signup", "pad": "%s"}' % (i, pad[i % 64 : i % 64 + value_bytes]))
        yield (key, None if i % 10 == 9 else value[:value_bytes], i + 1)


def _report(label: str, n: int, payload: int, size: int, seconds: float) -> None:
    print(f"{label}: {n} records, payload {payload / 1e6:.1f} MB, file {size / 1e6:.1f} MB, "
          f"{seconds:.2f} s -> {payload / 1e6 / seconds:.0f} MB/s payload, "
          f"{n / seconds / 1e3:.0f} k records/s")


def bench_format(n: int, value_bytes: int, path: str) -> None:
    recs = list(_records(n, value_bytes))
    payload = sum(len(k) + len(v or b"") for k, v, _ in recs)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        w = BackupWriter(f, from_version=0, to_version=n)
        w.add_many(recs)
        s = w.close()
    dt = time.perf_counter() - t0
    _report("write (format only)", n, payload, s.file_bytes, dt)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        count = sum(1 for _ in BackupReader(f).records())
    _report("read+verify", count, payload, s.file_bytes, time.perf_counter() - t0)


def bench_lmdb(n: int, value_bytes: int, path: str, tmp: str) -> None:
    from doq.backup.ops import write_backup
    from doq.queues import commands as c
    from doq.storage.env import open_env
    from doq.storage.state import StateStore

    env = open_env(os.path.join(tmp, "db"))
    state = StateStore(env)
    pad = os.urandom(value_bytes + 64).hex().encode()
    cmds: list[c.Command] = [c.CreateQueue("orders-queue", "delayed", c.QueueSettings())]
    step = 10_000
    for i in range(0, n, step):  # n messages, then 1 in 10 deleted (a tombstone each)
        items = [c.EnqueueItem(pad[j % 64 : j % 64 + value_bytes]) for j in range(i, min(i + step, n))]
        cmds.append(c.Enqueue("orders-queue", items))
    cmds += [c.DeleteMessage("orders-queue", id_) for id_ in range(10, n + 1, 10)]
    for index, start in enumerate(range(0, len(cmds), 64), start=1):
        with state.write() as txn:
            state.apply_entries(txn, [(index, c.CommandBatch(index, cmds[start : start + 64]))])
    records = list(state.changes(0)[1])
    payload = sum(len(k) + len(v or b"") for k, v, _ in records)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        write_backup(state, 0, f)
    dt = time.perf_counter() - t0
    _report("write_backup (LMDB StateStore)", len(records), payload, os.path.getsize(path), dt)
    env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--lmdb", action="store_true", help="back up a real StateStore")
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.bak")
        if ns.lmdb:
            bench_lmdb(ns.records, ns.value_bytes, path, tmp)
        else:
            bench_format(ns.records, ns.value_bytes, path)


if __name__ == "__main__":
    main()
