"""The delayed index's fill alone: `PairList.add_many` of random priorities, no storage.

`python bench/pairlist_fill.py --messages 5000000` adds `--messages` (random priority, id)
pairs in batches of `--batch` (as `EnqueueColumns` entries of that many messages do) and
prints, per tenth of the fill: CPU µs per pair added, the pairs sorted per pair added (the
chunk sorts `add_many` causes, `PairList._fix`) and the chunk count; then the CPU per pair
of draining `--drain` pairs by `pop_front(500)`. Runs the code on `sys.path`, so the same
command measures two checkouts back to back.

A uniform fill sorts its chunks in waves: a chunk cut to LOAD..2*LOAD pairs is sorted again
when it reaches UNSORTED_LOADS * LOAD, and the chunks of one cut all grow at about the same
rate, so they reach that size together (the list ~UNSORTED_LOADS times larger than at the
cut). Between waves a fill sorts nothing; in a wave it sorts 2-3 pairs per pair added.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.queues import pairlist as P


def _fill(prios: list[int], batch: int, sorted_pairs: list[int]) -> tuple[float, P.PairList]:
    """Add (prios[i], i + 1) in batches, printing each tenth's figures: (CPU s, the list)."""
    n = len(prios)
    pl = P.PairList()
    step = max(batch, n // 10)
    total = time.process_time()
    t0, s0, mark = total, 0, step
    for i in range(0, n, batch):
        j = min(n, i + batch)
        pl.add_many(prios[i:j], range(i + 1, j + 1))
        if j >= mark or j == n:
            t = time.process_time()
            part = j - (mark - step)
            print(f"{j / 1e6:5.2f}M: {(t - t0) / part * 1e6:5.2f} µs a pair, "
                  f"{(sorted_pairs[0] - s0) / part:4.2f} pairs sorted a pair added, {len(pl._as)} chunks", flush=True)
            t0, s0, mark = t, sorted_pairs[0], mark + step
    return time.process_time() - total, pl


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pairlist_fill", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=5_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--drain", type=int, default=250_000)
    p.add_argument("--seed", type=int, default=7)
    ns = p.parse_args(argv)
    n, batch = ns.messages, ns.batch
    rnd = random.Random(ns.seed)
    prios = [rnd.randrange(0, 1 << 31) for _ in range(n)]
    sorted_pairs = [0]
    fix = P.PairList._fix

    def counted_fix(self: P.PairList, i: int) -> None:
        sorted_pairs[0] += len(self._as[i])
        fix(self, i)

    P.PairList._fix = counted_fix  # type: ignore[method-assign]
    try:
        fill = _fill(prios, batch, sorted_pairs)
    finally:
        P.PairList._fix = fix  # type: ignore[method-assign]
    t = time.process_time()
    m = min(ns.drain, n)
    taken = 0
    pl = fill[1]
    while taken < m:
        taken += len(pl.pop_front(min(500, m - taken))[0])
    drain = time.process_time() - t
    print(f"fill {fill[0] / n * 1e6:.2f} µs a pair ({sorted_pairs[0] / n:.2f} pairs sorted a pair), "
          f"pop_front {drain / max(1, m) * 1e6:.2f} µs a pair")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
