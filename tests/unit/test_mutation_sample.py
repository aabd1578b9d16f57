"""tools.mutation_sample: the same seed picks the same mutants, uniformly, per package; the
score's interval is the Wilson 95 % interval."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from tools.mutation_sample import main, pick, prepare, wilson, with_mutmut_table

NAMES = [f"doq.raft.log.x_f__mutmut_{i}" for i in range(300)] + [
    f"doq.queues.fair.x_g__mutmut_{i}" for i in range(100)
]


def test_a_seed_picks_the_same_mutants_of_one_package_without_repeats() -> None:
    first = pick(NAMES, "doq.raft", seed=17, n=50)
    assert first == pick(list(reversed(NAMES)), "doq.raft", seed=17, n=50)  # order-free
    assert len(set(first)) == 50 and all(m.startswith("doq.raft.") for m in first)
    assert first != pick(NAMES, "doq.raft", seed=18, n=50)
    assert len(pick(NAMES, "doq.queues", seed=17, n=500)) == 100  # at most the package


def test_the_pick_is_uniform_over_the_package() -> None:
    seen: Counter[str] = Counter()
    for seed in range(400):
        seen.update(pick(NAMES, "doq.queues", seed=seed, n=10))
    # each of 100 mutants is expected 40 times; a fixed-seed check, far from the tails
    assert len(seen) == 100 and min(seen.values()) > 15 and max(seen.values()) < 70


def test_wilson_matches_the_textbook_interval() -> None:
    lo, hi = wilson(380, 400)  # p = 0.95: centre 0.95480/1.00960, half 0.02189/1.00960
    assert (round(lo, 4), round(hi, 4)) == (0.924, 0.9674)
    assert wilson(10, 10)[1] == 1.0 and wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_score_counts_the_sample_and_lists_its_survivors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes = {m: (1 if i % 10 else 0) for i, m in enumerate(NAMES[:300])}  # 0: survived
    meta = tmp_path / "doq" / "raft" / "log.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    assert main(["score", "--seed", "1", "--n", "300", "--packages", "doq.raft",
                 "--mutants", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the first 300 of 300 drawn checked: killed 270, survived 30" in out and "score 90.0 %" in out
    assert out.count("    survived: ") == 30


def test_score_counts_only_the_checked_prefix_of_the_draw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run stopped midway leaves a prefix of the draw checked: the score is over it."""
    drawn = pick(NAMES, "doq.raft", seed=1, n=20)
    codes: dict[str, int | None] = {m: 1 for m in NAMES[:300]}
    codes[drawn[5]] = None  # the sixth drawn has no verdict yet
    meta = tmp_path / "doq" / "raft" / "log.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    main(["score", "--seed", "1", "--n", "20", "--packages", "doq.raft", "--mutants", str(tmp_path)])
    assert "the first 5 of 20 drawn checked: killed 5," in capsys.readouterr().out


def test_a_second_mutmut_config_replaces_only_the_mutmut_table() -> None:
    pyproject = '[project]\nname = "doq"\n\n[tool.mutmut]\nonly_mutate = ["doq/raft/*"]\n\n[tool.ruff]\nline-length = 100\n'
    out = with_mutmut_table(pyproject, '# the service\n[tool.mutmut]\nonly_mutate = ["doq/service/*"]\n')
    assert out.count("[tool.mutmut]") == 1 and "doq/raft/*" not in out
    assert '[project]\nname = "doq"' in out and "[tool.ruff]\nline-length = 100" in out
    assert out.endswith('only_mutate = ["doq/service/*"]\n')


def test_the_service_run_has_its_own_project_directory_and_in_process_tests(tmp_path: Path) -> None:
    """Its verdicts never mix with the cores' (their own mutants/), and it selects no test
    that starts doq processes (they import the unmutated package and kill nothing)."""
    config = Path(__file__).resolve().parents[2] / "tools" / "mutmut-service.toml"
    prepare(tmp_path, config)
    prepare(tmp_path, config)  # again: nothing to redo
    table = tomllib.loads((tmp_path / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert table["only_mutate"] == ["doq/service/*"]
    selection = table["pytest_add_cli_args_test_selection"]
    assert "not integration" in selection[selection.index("-m") + 1]
    root = config.parents[1]
    for name in ("doq", "tests", "tools", "clients"):
        assert (tmp_path / name).resolve() == root / name


def test_score_shows_what_the_wall_clock_timeouts_add(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A timeout counts as killed, but on a loaded machine a slow survivor times out too:
    the score without them is printed beside it."""
    names = NAMES[:300]
    codes = {m: (36 if i < 30 else 1) for i, m in enumerate(names)}  # 36: mutmut's timeout
    meta = tmp_path / "doq" / "raft" / "log.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    main(["score", "--seed", "1", "--n", "300", "--packages", "doq.raft", "--mutants", str(tmp_path)])
    out = capsys.readouterr().out
    assert "score 100.0 %" in out and "of the killed, 30 by mutmut's wall-clock timeout; without them 90.0 %" in out
    assert out.count("    timeout: ") == 30
