"""Score per module of a mutmut run (`make mutation-results`, docs/testing.md).

Reads mutmut's results in mutants/**/*.py.meta and prints, per mutated file: mutants,
checked, killed (a timeout counts as killed), survived, without tests, not yet checked,
and the score = killed / checked (a mutant without tests counts as not killed); with
`--survivors`, the name of each mutant that survived or has no test (`mutmut show NAME`
prints its diff).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # type: ignore[import-untyped]

KILLED = ("killed", "timeout", "caught by type check")


def module_counts(meta: Path) -> tuple[Counter[str], list[tuple[str, str]]]:
    results: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    counts: Counter[str] = Counter()
    left: list[tuple[str, str]] = []
    for name, code in results.items():
        status = status_by_exit_code[code]
        counts[status] += 1
        if status in ("survived", "no tests", "suspicious"):
            left.append((status, name))
    return counts, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--survivors", action="store_true", help="list each survivor")
    args = parser.parse_args(argv)
    print(f"{'module':30} {'mutants':>7} {'checked':>7} {'killed':>6} {'survived':>8} "
          f"{'no tests':>8} {'left':>5} {'score':>6}")
    for meta in sorted(args.mutants.glob("doq/**/*.py.meta")):
        counts, left = module_counts(meta)
        total = sum(counts.values())
        if total == 0:
            continue
        checked = total - counts["not checked"]
        killed = sum(counts[s] for s in KILLED)
        score = f"{100 * killed / checked:5.1f}%" if checked else "     -"
        module = str(meta.relative_to(args.mutants))[: -len(".meta")]
        print(f"{module:30} {total:7} {checked:7} {killed:6} {counts['survived']:8} "
              f"{counts['no tests']:8} {counts['not checked']:5} {score:>6}")
        if args.survivors:
            for status, name in left:
                print(f"    {status}: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
