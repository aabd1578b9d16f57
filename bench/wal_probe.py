"""What one durable write costs on this disk: an append to a preallocated file with ONE
fdatasync, against an LMDB commit with its data sync and an explicit meta sync (what a
durable Ready costs today, `doq.storage.env.sync_meta`) and with the data sync only
(`StateStore.write(durable=False)`).

    python bench/wal_probe.py [--dir /work/tmp-probe] [--n 400] [--bytes 200]

Each write carries `--bytes` bytes (a Raft entry of a small batch) to a new offset / a new
key. The three probes alternate write by write so the machine's load falls on each alike.
Prints p50 / p90 / p99 in ms per probe. The directory must be on the data disk (not tmpfs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import time
from pathlib import Path

import lmdb


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/work/tmp-wal-probe")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--bytes", type=int, default=200)
    args = ap.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, mode=0o700)
    payload = os.urandom(args.bytes)
    # the segment: preallocated and zero-filled, then synced, so an fdatasync after a
    # pwrite inside it has no size or block allocation (metadata) to flush
    seg = root / "seg"
    fd = os.open(seg, os.O_RDWR | os.O_CREAT, 0o600)
    size = (args.n + 8) * (args.bytes + 64)
    os.write(fd, b"\0" * size)
    os.fsync(fd)
    env = lmdb.open(str(root / "lmdb"), map_size=1 << 30, sync=True, metasync=False, max_dbs=2)
    db = env.open_db(b"t", create=True)
    times: dict[str, list[float]] = {"pwrite+fdatasync": [], "lmdb data+meta sync": [], "lmdb data sync": []}
    off = 0
    for i in range(args.n):
        t0 = time.perf_counter()
        os.pwrite(fd, payload, off)
        os.fdatasync(fd)
        t1 = time.perf_counter()
        times["pwrite+fdatasync"].append(t1 - t0)
        off += len(payload)
        for name, meta in (("lmdb data+meta sync", True), ("lmdb data sync", False)):
            t0 = time.perf_counter()
            with env.begin(write=True, db=db) as txn:
                txn.put(struct.pack(">QB", i, meta), payload)
            if meta:
                env.sync(True)
            times[name].append(time.perf_counter() - t0)
    os.close(fd)
    env.close()
    print(f"{args.n} writes of {args.bytes} B each in {root} (load {os.getloadavg()[0]:.2f})")
    for name, xs in times.items():
        ms = [x * 1000 for x in xs]
        print(f"{name:22s} p50 {statistics.median(ms):.3f}  p90 {_pct(ms, 0.9):.3f}  "
              f"p99 {_pct(ms, 0.99):.3f} ms")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
