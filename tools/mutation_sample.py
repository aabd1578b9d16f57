"""A seeded uniform random sample of mutants, and its score with a 95 % interval.

`make mutation` on all of doq/raft and doq/queues (10 000 mutants) takes many hours on a
small machine. A uniform random sample of the mutants of one package estimates its score
honestly: `pick` lists the mutants of each package (mutmut's names, from
``mutants/**/*.py.meta``, sorted) and draws ``n`` of them with ``random.Random(seed)``, so
the same seed and the same source give the same names on every machine; `run` hands the
ones without a verdict (and the survivors, which newer tests may kill) to `mutmut run`;
`score` prints, per package, killed / checked over the sample with its Wilson 95 % interval
(a mutant that spun past the CPU limit counts as killed, as in `make mutation-results`), and
each surviving mutant's name (`mutmut show NAME` prints its diff).

    make mutation-sample SEED=17 N=400                  # doq.raft and doq.queues
    make mutation-sample SEED=17 N=400 PACKAGES=doq.raft
    python -m tools.mutation_sample score --seed 17 --n 400
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # type: ignore[import-untyped]

KILLED = ("killed", "timeout", "caught by type check")
DEFAULT_PACKAGES = ("doq.raft", "doq.queues")


def verdicts(mutants: Path) -> dict[str, str]:
    """Every mutant's name with its status ("not checked" if it has no verdict yet)."""
    out: dict[str, str] = {}
    for meta in sorted(mutants.glob("doq/**/*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            out[name] = status_by_exit_code[code]
    return out


def pick(names: list[str], package: str, seed: int, n: int) -> list[str]:
    """``n`` mutants of ``package`` drawn uniformly without replacement, by seed."""
    population = sorted(m for m in names if m.startswith(package + "."))
    rng = random.Random(f"{seed}:{package}")  # str seeds are hashed deterministically
    return sorted(rng.sample(population, min(n, len(population))))


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for the share killed (95 % for z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = killed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _sample(args: argparse.Namespace, status: dict[str, str]) -> dict[str, list[str]]:
    names = list(status)
    return {pkg: pick(names, pkg, args.seed, args.n) for pkg in args.packages}


def run(args: argparse.Namespace) -> int:
    status = verdicts(args.mutants)
    todo = [m for ms in _sample(args, status).values() for m in ms
            if status[m] in ("not checked", "survived", "suspicious")]
    print(f"{len(todo)} sampled mutants to run", flush=True)
    if not todo:
        return 0
    env = dict(os.environ, DOQ_MUTATION="1")
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    for i in range(0, len(todo), args.chunk):  # a bounded command line per mutmut run
        cmd = [mutmut, "run", "--max-children", str(args.children), *todo[i : i + args.chunk]]
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0:
            return rc
    return 0


def score(args: argparse.Namespace) -> int:
    status = verdicts(args.mutants)
    for pkg, sample in _sample(args, status).items():
        counts = Counter(status[m] for m in sample)
        checked = len(sample) - counts["not checked"]
        killed = sum(counts[s] for s in KILLED)
        lo, hi = wilson(killed, checked)
        share = f"{100 * killed / checked:.1f} %" if checked else "-"
        print(f"{pkg}: sample {len(sample)} (seed {args.seed}), checked {checked}, killed {killed},"
              f" survived {counts['survived']}, no tests {counts['no tests']};"
              f" score {share}, Wilson 95 % [{100 * lo:.1f} %, {100 * hi:.1f} %]")
        for m in sample:
            if status[m] in ("survived", "no tests", "suspicious"):
                print(f"    {status[m]}: {m}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("pick", "run", "score"))
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--n", type=int, required=True, help="mutants per package")
    parser.add_argument("--packages", nargs="+", default=list(DEFAULT_PACKAGES))
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--children", type=int, default=1, help="mutmut --max-children")
    parser.add_argument("--chunk", type=int, default=500, help="mutants per mutmut run")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "score":
        return score(args)
    for sample in _sample(args, verdicts(args.mutants)).values():
        print("\n".join(sample))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
