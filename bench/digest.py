"""What the state digest costs the node, both ways (not a test):
`python bench/digest.py [--messages 200000] [--batch 1000] [--rounds 3]`.

1. Maintained incrementally on every write (NOT what doq does; measured to decide): the
   apply loop of `python bench/apply_throughput.py` (enqueue, dequeue, ack of `--messages`
   100-byte messages in batches of `--batch`, one log entry per batch, real LMDB), side by
   side with a prototype sink that adds/subtracts `doq.storage.digest.item_hash_stored` of
   every record it writes or deletes and stores the 32-byte sum once per entry. Prints
   msg/s of each, the ratio, and the cost in us per message. The figures in docs/backup.md
   were taken when every write was in place and handed back the record it replaced; the
   sink now reads that record first (leases and deletes are no longer written in place),
   so it costs more than they say.
2. Computed in the backup's own read transaction (what doq does): `StateStore.state_digest`
   (one scan of every record) in us per record, and a full backup (`write_backup`, which
   now takes the digest in its read txn) against the same backup without the digest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.machine import QueueMachine
from doq.queues.model import QueueSettings
from doq.storage import digest as D
from doq.storage.env import open_env
from doq.storage.state import StateStore, _TxnSink

DIGEST_KEY = b"\x00digest"


class _DigestSink(_TxnSink):
    """The prototype: `_TxnSink` plus an incrementally maintained digest (sum of hashes).

    Every write of the machine's `Store` protocol adds the hash of each record written and
    subtracts that of the record it replaces or deletes, read with `_stored` (as composed
    from its body and lease entry: what `state_digest` scans) before the write."""

    __slots__ = ("acc",)

    def __init__(self, dbs: dict[int, Any], versions: Any, tombs: Any, stale: Any, leases: Any, gone: Any) -> None:
        super().__init__(dbs, versions, tombs, stale, leases, gone)
        self.acc = 0

    def _drop(self, keys: list[bytes]) -> None:
        for key in dict.fromkeys(keys):
            if (old := self._stored(key)) is not None:
                self.acc -= D.item_hash_stored(key, old)

    def put(self, key: bytes, value: bytes) -> None:
        self._drop([key])
        super().put(key, value)
        self.acc += D.item_hash_stored(key, self.ver + value)

    def insert(self, key: bytes, value: bytes) -> None:
        super().insert(key, value)
        self.acc += D.item_hash_stored(key, self.ver + value)

    def insert_many(self, keys: list[bytes], head: bytes, tails: list[bytes]) -> None:
        super().insert_many(keys, head, tails)
        prefix = self.ver + head
        self.acc += sum(D.item_hash_stored(k, prefix + t) for k, t in zip(keys, tails, strict=True))

    def delete(self, key: bytes) -> None:
        self._drop([key])
        super().delete(key)

    def delete_many(self, keys: list[bytes]) -> None:
        self._drop(keys)
        super().delete_many(keys)

    def pop_many(self, keys: list[bytes]) -> list[bytes | None]:
        self._drop(keys)
        return super().pop_many(keys)

    def rewrite_many(self, keys: list[bytes], edit: Callable[[list[bytes]], list[bytes]],
                     **options: Any) -> None:
        self._drop(keys)
        written: list[bytes] = []

        def edit_and_note(old: list[bytes]) -> list[bytes]:
            written.extend(edit(old))
            return written

        super().rewrite_many(keys, edit_and_note, **options)
        ver = self.ver
        self.acc += sum(D.item_hash_stored(k, ver + v) for k, v in zip(keys, written, strict=True))


def _with_digest_sink(st: StateStore) -> _DigestSink:
    sink = _DigestSink(st._kind_db, st._versions, st._tombs, st._stale, st._leases, st._gone)
    st._sink = sink
    st.machine = QueueMachine(sink)
    st.rebuild()
    return sink


def _apply_run(messages: int, batch: int, incremental: bool) -> dict[str, float]:
    """msg/s of enqueue, dequeue and ack (apply + commit, one entry per batch)."""
    with tempfile.TemporaryDirectory() as d:
        env = open_env(d)
        st = StateStore(env)
        sink = _with_digest_sink(st) if incremental else None
        meta = st._meta
        idx = 0
        now = 1_700_000_000_000
        spent = {"enqueue": 0.0, "dequeue": 0.0, "ack": 0.0}

        def run(kind: str, cmds: list[c.Command]) -> list[object]:
            nonlocal idx, now
            idx += 1
            now += 1
            data = encode_batch(c.CommandBatch(now, cmds))
            t0 = time.perf_counter()
            txn = env.begin(write=True)
            res = st.apply_entries(txn, [(idx, data)])[0]
            if sink is not None:
                sink.acc &= D.MASK
                txn.put(DIGEST_KEY, D.to_bytes(sink.acc), db=meta)
            txn.commit()
            spent[kind] += time.perf_counter() - t0
            return res

        run("enqueue", [c.CreateQueue("bench", "delayed", QueueSettings())])
        spent["enqueue"] = 0.0
        payload = b"x" * 100
        n = messages // batch
        for _ in range(n):
            run("enqueue", [c.Enqueue("bench", [c.EnqueueItem(payload, group=f"g{j % 10}") for j in range(batch)])])
        for _ in range(n):
            msgs = run("dequeue", [c.Dequeue("bench", batch)])[0]
            assert isinstance(msgs, list) and len(msgs) == batch
            run("ack", [c.Ack("bench", [m.id for m in msgs], [m.lease_id for m in msgs])])
        if sink is not None:  # the prototype is right: its sum equals a scan of the state
            assert sink.acc & D.MASK == st.state_digest()[1]
        env.close()
        total = n * batch
        return {k: total / v for k, v in spent.items()}


def bench_incremental(messages: int, batch: int, rounds: int) -> None:
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(rounds):  # interleaved, so both see the same machine load
        for flag in (False, True):
            runs[flag].append(_apply_run(messages, batch, flag))
    print(f"1. digest maintained on every write (prototype), {messages} msgs, batch {batch}, "
          f"median of {rounds}:")
    for kind in ("enqueue", "dequeue", "ack"):
        base = statistics.median(r[kind] for r in runs[False])
        inc = statistics.median(r[kind] for r in runs[True])
        print(f"   {kind:8s} without {base:9.0f} msg/s   with {inc:9.0f} msg/s   "
              f"ratio {inc / base:.3f}   +{(1 / inc - 1 / base) * 1e6:.2f} us/msg")


def bench_scan(messages: int, rounds: int) -> None:
    from doq.backup.format import BackupWriter
    from doq.backup.ops import write_backup

    with tempfile.TemporaryDirectory() as d:
        env = open_env(os.path.join(d, "db"))
        st = StateStore(env)
        cmds: list[c.Command] = [c.CreateQueue("q", "delayed", QueueSettings())]
        step = 10_000
        for i in range(0, messages, step):
            cmds.append(c.Enqueue("q", [c.EnqueueItem(b"x" * 100) for _ in range(min(step, messages - i))]))
        for index, start in enumerate(range(0, len(cmds), 16), start=1):
            with st.write() as txn:
                st.apply_entries(txn, [(index, c.CommandBatch(index, cmds[start : start + 16]))])
        n = sum(1 for _ in st.iter_changes(0))
        with st.write() as txn:  # one more entry: the next incremental holds ~1 record
            st.apply_entries(txn, [(st.applied_index + 1, c.CommandBatch(0, [c.Enqueue("q", [c.EnqueueItem(b"y")])]))])
        since = st.applied_index
        scan: list[float] = []
        full: list[float] = []
        plain: list[float] = []
        inc: list[float] = []
        path = os.path.join(d, "b.bak")
        for _ in range(rounds):
            t0 = time.perf_counter()
            st.state_digest()
            scan.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                write_backup(st, 0, f)
            full.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with open(path, "wb") as f:  # the same full backup, no digest
                to, it = st.changes(0)
                w = BackupWriter(f, from_version=0, to_version=to)
                w.add_many(it)
                w.close()
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                write_backup(st, since, f)
            inc.append(time.perf_counter() - t0)
        env.close()
    s, a, b, t_inc = (statistics.median(x) for x in (scan, full, plain, inc))
    print(f"2. digest in the backup's read txn, {n} records, median of {rounds}:")
    print(f"   state_digest scan (GET /db/digest) {s:.2f} s = {s / n * 1e6:.2f} us/record "
          f"({n / s / 1e3:.0f} k records/s)")
    print(f"   full backup with the digest {a:.2f} s, without {b:.2f} s "
          f"(+{(a / b - 1) * 100:.0f} %)")
    print(f"   incremental backup of 1 record (one scan for the digest) {t_inc:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scan-messages", type=int, default=1_000_000)
    a = ap.parse_args()
    bench_incremental(a.messages, a.batch, a.rounds)
    bench_scan(a.scan_messages, a.rounds)


if __name__ == "__main__":
    main()
