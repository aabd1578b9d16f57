"""``python -m tools.sim --seeds A:B [--nodes N] [--steps K] [--bug NAME]``

Runs seeds A..B-1, prints one summary line, and on a violation prints the seed, the
violations and a replay command; exits 1 if any seed violated an invariant.
"""

from __future__ import annotations

import argparse
import sys
import time

from doq.raft.config import KNOWN_BUGS
from tools.sim.runner import SimOptions, run_seed


def parse_seeds(text: str) -> range:
    if ":" in text:
        a, b = text.split(":", 1)
        return range(int(a), int(b))
    return range(int(text), int(text) + 1)


def replay_command(seed: int, opts: SimOptions) -> str:
    cmd = f"python -m tools.sim --seeds {seed}:{seed + 1} --nodes {opts.nodes} --steps {opts.steps}"
    return cmd + (f" --bug {opts.bug}" if opts.bug else "") + (" --queues" if opts.queues else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.sim", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--seeds", default="0:100", help="A:B runs seeds A..B-1 (default 0:100)")
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--bug", choices=sorted(KNOWN_BUGS), default=None)
    ap.add_argument("--queues", action="store_true",
                    help="the queue workload: real queue commands, redrives included, checked for conservation")
    ap.add_argument("--keep-going", action="store_true", help="do not stop at the first failure")
    ap.add_argument("--verbose", "-v", action="store_true", help="one line per seed")
    args = ap.parse_args(argv)
    opts = SimOptions(nodes=args.nodes, steps=args.steps, bug=args.bug, queues=args.queues)
    seeds = parse_seeds(args.seeds)
    t0 = time.perf_counter()
    total_steps = 0
    failed: list[int] = []
    ran = 0
    for seed in seeds:
        r = run_seed(seed, opts)
        ran += 1
        total_steps += r.steps
        if args.verbose:
            print(
                f"seed={seed} steps={r.steps} proposals={r.proposals} acked={r.acked} "
                f"reads={r.reads} elections={r.elections} crashes={r.crashes} "
                f"conf={r.conf_changes} violations={len(r.violations)} trace={r.trace_hash}"
            )
        if r.violations:
            failed.append(seed)
            print(f"VIOLATION seed={seed}:", file=sys.stderr)
            for v in r.violations[:5]:
                print(f"  {v}", file=sys.stderr)
            print(f"  replay: {replay_command(seed, opts)}", file=sys.stderr)
            if not args.keep_going:
                break
    dt = time.perf_counter() - t0
    print(
        f"seeds={seeds.start}:{seeds.stop} ran={ran} nodes={opts.nodes} bug={opts.bug or '-'} "
        f"steps={total_steps} violations={len(failed)} steps/s={total_steps / max(dt, 1e-9):.0f}"
        + (f" first_failing_seed={failed[0]}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
