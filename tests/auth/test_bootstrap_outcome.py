"""`ensure_admin_key` when the proposal of the generated key has an unknown outcome (the
leader lost its leadership with the key in its log): the file stays, and the key is
announced once it shows up committed — never a committed key whose file was removed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from doq.auth.bootstrap import ADMIN_KEY_FILE, ensure_admin_key
from doq.errors import OutcomeUnknown
from doq.queues.apikeys import KeyRecord
from doq.queues.commands import CreateKey


class _Node:
    """Just what `ensure_admin_key` reads of a node; the first proposal commits but its
    answer is lost (OutcomeUnknown), as after a leader change."""

    is_leader = True

    def __init__(self, commit_first: bool) -> None:
        self.keys: dict[str, Any] = {}
        self.state = SimpleNamespace(keys=lambda: dict(self.keys))
        self.proposed: list[CreateKey] = []
        self.commit_first = commit_first

    def is_ready(self) -> bool:
        return True

    async def propose(self, cmd: CreateKey) -> object:
        self.proposed.append(cmd)
        if len(self.proposed) == 1:
            if self.commit_first:
                self.keys[cmd.id] = cmd
            raise OutcomeUnknown("leadership changed before the proposal committed; it may still be applied")
        self.keys[cmd.id] = cmd
        return KeyRecord(cmd.id, cmd.secret_hash, (), 0)


@pytest.mark.parametrize("commit_first", [True, False])
async def test_an_unknown_outcome_keeps_the_file_and_ends_with_that_key(tmp_path: Path, commit_first: bool,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    node = _Node(commit_first)
    key_id = await ensure_admin_key(node, tmp_path, poll_s=0, print_key=False)  # type: ignore[arg-type]
    token = (tmp_path / ADMIN_KEY_FILE).read_text().strip()
    assert key_id is not None and token.startswith(f"doq_{key_id}_")
    assert list(node.keys) == [key_id]  # one key, the one in the file
    assert {c.id for c in node.proposed} == {key_id}
    assert f"admin key {key_id} written" in capsys.readouterr().out
