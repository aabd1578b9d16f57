"""The client README's examples ("Unary calls" and "asyncio"), run twice in a row as
written against a real `doq serve` (only the address changes to the test node's): a user
can paste them and run them again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration
README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"


def example(heading: str) -> str:
    """The first ```python block after `## heading`."""
    text = README.read_text()
    section = text[text.index(f"\n## {heading}\n"):]
    found = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert found is not None, heading
    return found.group(1)


@pytest.mark.parametrize("heading", ["Unary calls", "asyncio"])
def test_example_runs_twice(doq_node: NodeProc, heading: str) -> None:
    code = example(heading).replace("127.0.0.1:10000", doq_node.grpc_addr)
    for run in (1, 2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"run {run}:\n{r.stdout}\n{r.stderr}"
        assert r.stdout.strip(), f"run {run} printed nothing"


def test_worker_example_runs_until_sigterm_twice(doq_node: NodeProc) -> None:
    """The "Worker" example handles its message, then stops gracefully on SIGTERM (exit 0);
    run again, it handles the message the second run enqueued."""
    import os
    import signal

    code = example("Worker").replace("127.0.0.1:10000", doq_node.grpc_addr)
    for run in (1, 2):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            line = p.stdout.readline()  # blocks until the handler ran (or the script ended)
            assert line == "sending to hello@example.com\n", f"run {run}: {line!r}\n{p.stderr.read() if p.poll() is not None else ''}"
            os.kill(p.pid, signal.SIGTERM)  # our child, by pid
            assert p.wait(120) == 0, f"run {run}:\n{p.stderr.read()}"
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
