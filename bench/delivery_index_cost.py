"""What a persisted delivery-order index would cost the fill: raw LMDB, no server.

`python bench/delivery_index_cost.py --messages 1000000` writes `--messages` messages of a
delayed queue with random priorities in commits of `--batch` (each commit durable, as the
node's), as the state store lays them out (bodies by (queue, id): an append; a versions
entry per message: an append), once without and once with one more entry per message in
an index keyed by (queue, priority, id) — the key order a rebuild could read ready
messages in, with no sort. Prints msg/s, CPU µs per message and bytes written to disk per
message (`/proc/self/io`) for each, `--runs` times alternated.
"""

from __future__ import annotations

import argparse
import random
import struct
import tempfile
import time
from pathlib import Path

import lmdb

_Q = struct.Struct(">Q")
_SIGN = 1 << 63


def _written_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def fill(root: Path, n: int, batch: int, with_index: bool) -> dict[str, float]:
    """Fill a fresh LMDB env under `root`; the figures of that fill."""
    with tempfile.TemporaryDirectory(dir=root) as d:
        env = lmdb.open(d, map_size=1 << 36, max_dbs=4)
        try:
            msgs, vers, idx = env.open_db(b"m"), env.open_db(b"v"), env.open_db(b"i")
            rnd = random.Random(1)
            prefix = b"M\x00\x05bench"
            body = b"v" * 8 + b"h" * 60 + b"x" * 100  # version, header, 100-byte payload
            c0, t0, w0 = time.process_time(), time.perf_counter(), _written_bytes()
            for start in range(1, n + 1, batch):
                ids = range(start, min(start + batch, n + 1))
                ver = _Q.pack(start)
                with env.begin(write=True) as txn:
                    txn.cursor(db=msgs).putmulti([(prefix + _Q.pack(i), body) for i in ids], append=True)
                    txn.cursor(db=vers).putmulti([(ver + prefix + _Q.pack(i), b"") for i in ids])
                    if with_index:
                        txn.cursor(db=idx).putmulti([(prefix + _Q.pack(rnd.randrange(10**9) ^ _SIGN) + _Q.pack(i), b"")
                                                     for i in ids])
            return {"msg_per_s": n / (time.perf_counter() - t0), "cpu_us_per_msg": (time.process_time() - c0) / n * 1e6,
                    "written_bytes_per_msg": (_written_bytes() - w0) / n}
        finally:
            env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="delivery_index_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000, help="messages per commit")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary envs go")
    ns = p.parse_args(argv)
    for _ in range(ns.runs):
        for with_index in (False, True):
            r = fill(Path(ns.dir), ns.messages, ns.batch, with_index)
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(f"{'with' if with_index else 'without'} index: {r['msg_per_s'] / 1e3:.1f}k msg/s, "
                  f"{r['cpu_us_per_msg']:.2f} µs CPU/msg, {r['written_bytes_per_msg']:.0f} B written/msg "
                  f"(load {load})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
