"""A supported hook for tools that time a proposal's path through a node.

`observer` is None in a server: each hook point then costs one test of a module attribute
per Ready or per frame, never per message. A tool that measures where the time goes
(`bench/e2e_stages.py`) sets it in the process it measures, before the node starts, to an
object with the methods of `StageObserver`. The hooks see the node's own values and must
not change them; `write_started` and `write_ended` run on the writer thread, the others on
the event loop, so an observer records without locks only into structures that are safe
from both (e.g. `list.append`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StageObserver(Protocol):
    """The points of a message's path, in the order it meets them."""

    def frame_received(self, contents: Sequence[bytes]) -> None:
        """The service read a producer's frame carrying these message contents."""

    def proposed(self, commands: Sequence[object]) -> None:
        """The driver took these commands (from any number of callers) into the log."""

    def write_started(self, write_id: int, commands: Sequence[object]) -> None:
        """Writer thread: a write starts that applies `commands` (those this node proposed
        among its committed entries; the write also persists whatever else its Ready had)."""

    def write_ended(self, write_id: int, notes: Sequence[str]) -> None:
        """Writer thread: that write committed (fsync). `notes` name what else it did:
        "RaftSnapshot" (this node's snapshot recorded), "RaftCompact" (log entries
        discarded)."""

    def back_on_loop(self, write_id: int) -> None:
        """The event loop resumed after that write."""

    def resolved(self, results: Sequence[Sequence[object]]) -> None:
        """The results of the applied commands (per entry, per command) reached their
        callers."""

    def frame_built(self, messages: Sequence[object]) -> None:
        """The service put these delivered messages (each with a `content`) in a frame."""


observer: StageObserver | None = None
