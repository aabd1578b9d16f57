"""The guard that keeps server-starting tests marked `integration` recognizes the commands
that start a doq server, and only those."""

from __future__ import annotations

import pytest

from tests.support.marker_guard import _starts_a_server


@pytest.mark.parametrize("args", [
    ["/usr/bin/python3", "-m", "doq", "serve", "--node-id", "a"],
    ["doq", "serve"],
    "/bin/sh -c 'exec doq k8s-start'",
    ["/bin/sh", "-c", "exec doq k8s-start\n"],
])
def test_server_commands_are_recognized(args: object) -> None:
    assert _starts_a_server(args)


@pytest.mark.parametrize("args", [
    ["python", "-m", "doq", "bench", "--count", "10"],
    ["python", "bench/keys_cost.py"],
    ["python", "-m", "doq", "backup", "-o", "serve.bak"],
    ["git", "status"],
])
def test_other_commands_are_not(args: object) -> None:
    assert not _starts_a_server(args)
