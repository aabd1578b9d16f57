"""A supported hook for tools that time a message's path through the client.

`observer` is None in an application: each hook point then costs one test of a module
attribute per frame. A tool that measures where the time goes (`bench/e2e_stages.py`)
sets it in the process it measures to an object with the methods of `StageObserver`.
The hooks see the client's own values and must not change them; they run on the threads
or tasks that send and receive frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StageObserver(Protocol):
    def frame_taken(self, contents: Sequence[bytes]) -> None:
        """A producer took these message contents into the frame it sends next."""

    def frame_received(self, messages: Sequence[object]) -> None:
        """A batched consumer received a frame of these messages (each with a `content`)."""


observer: StageObserver | None = None
