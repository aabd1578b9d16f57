from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from doq import ports
from doq_client import _ledger as ledger_mod
from doq_client import _producer_core as producer_mod
from tests.support import marker_guard, mutation
from tests.support.proc import NodeProc, running_node

marker_guard.install()

# No property test depends on the machine's speed: no per-example deadline, no failure
# when generating data is slow (a test's own @settings adds to this, keeping these).
settings.register_profile("doq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("doq")


def _force_apply_thread() -> None:
    """`DOQ_TEST_APPLY_THREAD=1` (or 0) runs the whole suite with the Raft node's apply
    thread on (off): the default of `RaftNodeConfig.apply_thread` for every node built in
    this process (a test that sets it keeps its own), and `DOQ_APPLY_THREAD` for every
    server process a test starts. Read here only, never by doq itself."""
    forced = os.environ.get("DOQ_TEST_APPLY_THREAD", "")
    if forced not in ("0", "1"):
        return
    from doq.node.raft_node import RaftNodeConfig

    names = [f.name for f in dataclasses.fields(RaftNodeConfig)]
    defaults = list(RaftNodeConfig.__init__.__defaults__ or ())
    assert len(defaults) == len(names)  # every field has a default
    defaults[names.index("apply_thread")] = forced == "1"
    RaftNodeConfig.__init__.__defaults__ = tuple(defaults)
    assert RaftNodeConfig().apply_thread is (forced == "1")
    os.environ["DOQ_APPLY_THREAD"] = forced


_force_apply_thread()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers) each worker and the processes it
    starts choose ports from a slice of their own (`doq.ports.worker_slice`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and "DOQ_PORT_RANGE" not in os.environ:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        os.environ["DOQ_PORT_RANGE"] = ports.worker_slice(int(worker[2:]), workers)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Fail a test that started a doq server without the `integration` marker."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and report.passed and (why := marker_guard.violation(item)):
        report.outcome = "failed"
        report.longrepr = why


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Cheaper property tests in mutation runs only (`DOQ_MUTATION=1`, tests/support/mutation.py)."""
    mutation.cap_examples(items)
    mutation.cheap_first(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    """Under a mutant only: a CPU-time limit per test (tests/support/mutation.py)."""
    with mutation.cpu_limit():
        yield


@pytest.fixture
def doq_node(tmp_path: Path) -> Iterator[NodeProc]:
    """A fresh single-node `doq serve` process on free 127.0.0.1 ports."""
    with running_node(tmp_path / "data") as node:
        yield node


@pytest.fixture
def frames(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the column frames the client's producers send (a spy on `columns_frame`)."""
    sizes: list[int] = []
    real = ledger_mod.columns_frame

    def spy(chunks: list[ledger_mod.Chunk]) -> tuple[bytes, ledger_mod.Frame]:
        data, frame = real(chunks)
        sizes.append(frame.size)
        return data, frame

    monkeypatch.setattr(producer_mod, "columns_frame", spy)
    return sizes
