"""Tests that start real doq servers carry the `integration` marker (`-m 'not integration'`
then selects the in-process tests, and no server-starting test hides among them).

`install()` (from the root conftest) notes every `doq serve` / `doq k8s-start` process any
test starts through `subprocess` (the harnesses' NodeProc and LocalPod, and a test's own
`subprocess.run`), with the test that was running (`PYTEST_CURRENT_TEST`: a module-scoped
fixture starts its server during its module's first test). `violation(item)` names such a
start by a test without the marker; the root conftest fails that test.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest

STARTED_BY: set[str] = set()  # node ids of the tests that started a doq server


_SERVER = re.compile(r"\bdoq\b.*\s(serve|k8s-start)(?=[\s'\"]|$)")


def _starts_a_server(args: Any) -> bool:
    line = args if isinstance(args, str) else " ".join(str(a) for a in args)
    return _SERVER.search(line) is not None


def install() -> None:
    real_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        current = os.environ.get("PYTEST_CURRENT_TEST", "")
        if current and _starts_a_server(args):
            STARTED_BY.add(current.rsplit(" (", 1)[0])
        real_init(self, args, *rest, **kw)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


def violation(item: pytest.Item) -> str | None:
    if item.nodeid in STARTED_BY and item.get_closest_marker("integration") is None:
        return (f"{item.nodeid} started a doq server but is not marked integration: add "
                "`pytestmark = pytest.mark.integration` to its module")
    return None
