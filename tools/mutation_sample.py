"""A seeded uniform random sample of mutants, and its score with a 95 % interval.

`make mutation` on all of doq/raft and doq/queues (10 000 mutants) takes many hours on a
small machine. A uniform random sample of the mutants of one package estimates its score
honestly: `pick` lists the mutants of each package (mutmut's names, from
``mutants/**/*.py.meta``, sorted) and draws ``n`` of them with ``random.Random(seed)``, so
the same seed and the same source give the same names, in the same order, on every machine.
Every prefix of that draw is itself a uniform sample: `run` hands the draw to `mutmut run`
in that order, a chunk per package in turn (mutants with a verdict are not run again: rerun
a survivor after writing its test with `make mutation MUTANTS=NAME`), so a run stopped at
any point has checked a prefix of each package's draw;
`score` prints, per package, killed / checked over the longest prefix that has verdicts,
with its Wilson 95 % interval (a mutant that spun past the CPU limit counts as killed, as
in `make mutation-results`), and each surviving mutant's name (`mutmut show NAME` prints
its diff).

    make mutation-sample SEED=17 N=400                  # doq.raft and doq.queues
    make mutation-sample SEED=17 N=400 PACKAGES=doq.raft
    python -m tools.mutation_sample score --seed 17 --n 400

Another package with another test selection (the service layer) needs its own ``mutants/``:
mutmut drops every verdict when its test selection changes. ``--config FILE`` (a toml file
with a ``[tool.mutmut]`` table, e.g. tools/mutmut-service.toml) and ``--workdir DIR`` make
DIR a mutmut project of its own: its pyproject.toml is the repository's with the
``[tool.mutmut]`` table replaced by FILE's, and doq/, tests/, tools/, clients/ are links to
the checkout's, so mutmut's ``mutants/`` (the verdicts) lives in DIR.

    make mutation-sample-service SEED=17 SERVICE_N=200  # doq.service, in build/mutation-service
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
ROOT = Path(__file__).resolve().parents[1]
LINKED = ("doq", "tests", "tools", "clients")


def verdicts(mutants: Path) -> dict[str, str]:
    """Every mutant's name with its status ("not checked" if it has no verdict yet)."""
    out: dict[str, str] = {}
    for meta in sorted(mutants.glob("doq/**/*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            out[name] = status_by_exit_code[code]
    return out


def pick(names: list[str], package: str, seed: int, n: int) -> list[str]:
    """``n`` mutants of ``package`` drawn uniformly without replacement, by seed, in the
    order drawn (each prefix is a uniform sample too)."""
    population = sorted(m for m in names if m.startswith(package + "."))
    rng = random.Random(f"{seed}:{package}")  # str seeds are hashed deterministically
    return rng.sample(population, min(n, len(population)))


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


def _module(mutant: str) -> str:
    """`doq.raft.log.xǁRaftLogǁslice__mutmut_8` -> `doq/raft/log.py`."""
    return "/".join(mutant.split(".x", 1)[0].split(".")) + ".py"


def _checked_prefix(sample: list[str], status: dict[str, str]) -> list[str]:
    for i, m in enumerate(sample):
        if status[m] == "not checked":
            return sample[:i]
    return sample


def with_mutmut_table(pyproject: str, table: str) -> str:
    """``pyproject`` (toml text) with its ``[tool.mutmut]`` table replaced by ``table``."""
    kept: list[str] = []
    inside = False
    for line in pyproject.splitlines(keepends=True):
        if line.startswith("["):
            inside = line.strip() == "[tool.mutmut]"
        if not inside:
            kept.append(line)
    return "".join(kept).rstrip("\n") + "\n\n" + table.strip("\n") + "\n"


def prepare(workdir: Path, config: Path) -> None:
    """Make ``workdir`` a mutmut project of its own (links to the checkout, own config)."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = with_mutmut_table((ROOT / "pyproject.toml").read_text(), config.read_text())
    target = workdir / "pyproject.toml"
    if not target.exists() or target.read_text() != text:  # mutmut watches its hash
        target.write_text(text)
    for name in LINKED:
        link = workdir / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)


def _mutmut(args: argparse.Namespace, *names: str) -> int:
    env = dict(os.environ, DOQ_MUTATION="1")
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    cmd = [mutmut, "run", "--max-children", str(args.children), *names]
    return subprocess.run(cmd, env=env, cwd=args.workdir).returncode


def run(args: argparse.Namespace) -> int:
    if args.config is not None:
        prepare(args.workdir, args.config)
    if not verdicts(args.mutants):  # a new directory: mutmut names its mutants first
        print("generating the mutants (and mutmut's test stats)", flush=True)
        _mutmut(args, "doq.none-such")  # matches no mutant: mutmut stops after generating
    status = verdicts(args.mutants)
    todo = {pkg: [m for m in ms if status[m] == "not checked"]
            for pkg, ms in _sample(args, status).items()}
    print(f"{sum(map(len, todo.values()))} sampled mutants to run", flush=True)
    start = 0
    while any(len(ms) > start for ms in todo.values()):  # a chunk of each package in turn
        for pkg, ms in todo.items():
            chunk = ms[start : start + args.chunk]
            if not chunk:
                continue
            print(f"{pkg}: mutants {start + 1}-{start + len(chunk)} of {len(ms)} to run", flush=True)
            rc = _mutmut(args, *chunk)
            if rc != 0:
                return rc
        start += args.chunk
    return 0


def score(args: argparse.Namespace) -> int:
    status = verdicts(args.mutants)
    for pkg, drawn in _sample(args, status).items():
        sample = _checked_prefix(drawn, status)
        counts = Counter(status[m] for m in sample)
        killed = sum(counts[s] for s in KILLED)
        lo, hi = wilson(killed, len(sample))
        share = f"{100 * killed / len(sample):.1f} %" if sample else "-"
        print(f"{pkg}: seed {args.seed}, the first {len(sample)} of {len(drawn)} drawn checked:"
              f" killed {killed}, survived {counts['survived']}, no tests {counts['no tests']};"
              f" score {share}, Wilson 95 % [{100 * lo:.1f} %, {100 * hi:.1f} %]")
        if counts["timeout"]:  # counted as killed; on a loaded machine some are only slow
            strict = killed - counts["timeout"]
            slo, shi = wilson(strict, len(sample))
            print(f"  of the killed, {counts['timeout']} by mutmut's wall-clock timeout; without them"
                  f" {100 * strict / len(sample):.1f} %, Wilson 95 % [{100 * slo:.1f} %, {100 * shi:.1f} %]")
        for module in sorted({_module(m) for m in sample}):
            mine = [m for m in sample if _module(m) == module]
            k = sum(status[m] in KILLED for m in mine)
            print(f"  {module:28} {len(mine):4} checked {k:4} killed")
        for m in sorted(sample):
            if status[m] in ("survived", "no tests", "suspicious", "timeout"):
                print(f"    {status[m]}: {m}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("pick", "run", "score"))
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--n", type=int, required=True, help="mutants per package")
    parser.add_argument("--packages", nargs="+", default=list(DEFAULT_PACKAGES))
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="where mutmut runs (its mutants/ directory is there)")
    parser.add_argument("--config", type=Path,
                        help="a toml file with the [tool.mutmut] table for --workdir")
    parser.add_argument("--mutants", type=Path, help="default: WORKDIR/mutants")
    parser.add_argument("--children", type=int, default=1, help="mutmut --max-children")
    parser.add_argument("--chunk", type=int, default=80, help="mutants per mutmut run")
    args = parser.parse_args(argv)
    if args.mutants is None:
        args.mutants = args.workdir / "mutants"
    if args.command == "run":
        return run(args)
    if args.command == "score":
        return score(args)
    for sample in _sample(args, verdicts(args.mutants)).values():
        print("\n".join(sample))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
