"""Cheaper, deterministic property tests for mutation runs (`make mutation`).

A mutation run (mutmut, docs/testing.md) runs the tests that cover a mutated function once per
mutant, thousands of times. With `DOQ_MUTATION=1` in the environment, `cap_examples` (called
by the root conftest) lowers every Hypothesis test's example budget to at most
`GIVEN_EXAMPLES` (stateful machines: `STATEFUL_EXAMPLES` runs of at most `STATEFUL_STEPS`
steps), derandomized, without the example database (a mutant's verdict is the same on every
run), without a deadline (wall time) and without shrinking (a failing example is enough to kill a mutant). Tests that read `MUTATION` (the simulator's seed budgets) shrink the same way.
`cheap_first` orders the tests so a mutant is killed by the cheapest failing test (mutmut
stops at the first failure): example-based tests, then property tests, then the simulator.
While a mutant runs (not in mutmut's traced coverage run), `cpu_limit` fails a test that
spends more than `MUTANT_CPU_S` seconds of CPU (a mutant that loops, or makes the simulator
spin, then costs seconds, not mutmut's own limit of minutes); CPU time, not wall time, so a
loaded machine does not fail a slow but correct test. The default run (no variable) keeps each test's own settings and order.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest
from hypothesis import Phase, settings

MUTATION = os.environ.get("DOQ_MUTATION") == "1"
GIVEN_EXAMPLES = 25
STATEFUL_EXAMPLES = 10
STATEFUL_STEPS = 40
MUTANT_CPU_S = 10.0  # the slowest selected test takes ~1 s of CPU in a mutation run


class MutantTooSlow(Exception):
    """The test under a mutant spent more than MUTANT_CPU_S seconds of CPU."""


def _running_a_mutant() -> bool:
    return MUTATION and "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")  # set by mutmut


@contextmanager
def cpu_limit() -> Iterator[None]:
    """Raise MutantTooSlow in the test after MUTANT_CPU_S of process CPU (only under a mutant)."""
    if not _running_a_mutant():
        yield
        return

    def over(signum: int, frame: FrameType | None) -> None:
        raise MutantTooSlow(f"more than {MUTANT_CPU_S} s of CPU under a mutant")

    old = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, MUTANT_CPU_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def _capped(s: settings, examples: int, steps: int | None = None) -> settings:
    changes: dict[str, object] = {
        "max_examples": min(s.max_examples, examples), "derandomize": True, "database": None,
        "phases": [p for p in s.phases if p != Phase.shrink],
        "deadline": None,  # wall time: on a loaded machine it failed correct code (false kills)
    }
    if steps is not None:
        changes["stateful_step_count"] = min(s.stateful_step_count, steps)
    return settings(s, **changes)  # type: ignore[arg-type]


SLOWEST_MODULES = ("test_sim.py", "test_sim_queues.py")


def _cost_rank(item: pytest.Item) -> int:
    if item.path.name in SLOWEST_MODULES:
        return 2
    fn = getattr(item, "obj", None)
    if hasattr(fn, "_hypothesis_internal_use_settings") or isinstance(
        getattr(getattr(item, "cls", None), "settings", None), settings
    ):
        return 1
    return 0


def cheap_first(items: list[pytest.Item]) -> None:
    """Reorder the collected tests cheapest kind first (only with DOQ_MUTATION=1)."""
    if MUTATION:
        items.sort(key=_cost_rank)  # stable: each kind keeps its collection order


def cap_examples(items: list[pytest.Item]) -> None:
    """Lower the example budgets of the collected Hypothesis tests (only with DOQ_MUTATION=1)."""
    if not MUTATION:
        return
    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if isinstance(own, settings):
            fn._hypothesis_internal_use_settings = _capped(own, GIVEN_EXAMPLES)  # type: ignore[union-attr]
        cls = getattr(item, "cls", None)
        machine = getattr(cls, "settings", None)
        if isinstance(machine, settings):
            cls.settings = _capped(machine, STATEFUL_EXAMPLES, STATEFUL_STEPS)  # type: ignore[union-attr]
