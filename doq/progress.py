"""Progress of long work (a backup's download, a restore's upload or offline write, a
bench run) on stderr.

Shown only when stderr is a terminal and the command is not printing JSON: a pipe, a log
file or `--json` get nothing but the result. Drawn by rich (bytes done, total when known,
rate, time left); `DOQ_PROGRESS=0` turns it off, `DOQ_PROGRESS=1` forces it on (tests).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

Advance = Callable[[int], None]


def wanted(json_output: bool) -> bool:
    """Whether to show progress: stderr is a terminal (or DOQ_PROGRESS=1) and no `--json`."""
    forced = os.environ.get("DOQ_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1" and not json_output
    return not json_output and sys.stderr.isatty()


@contextlib.contextmanager
def bytes_progress(description: str, total: int | None, *, enabled: bool) -> Iterator[Advance]:
    """A context whose value `advance(n)` reports `n` more bytes done (a no-op when not
    `enabled`). The bar is removed when the work ends; the command prints its result."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, console=_console(), transient=True, refresh_per_second=4) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextlib.contextmanager
def count_progress(description: str, total: int | None, unit: str, *, enabled: bool) -> Iterator[Advance]:
    """As `bytes_progress`, counting things (`unit`: "records", "messages"): done / total,
    the rate per second and the time left."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn()]
    with Progress(*columns, console=_console(), transient=True, refresh_per_second=4) as bar:
        task = bar.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            bar.advance(task, n)
            speed = bar.tasks[0].speed
            if speed:
                bar.update(task, rate=f"{speed:,.0f}/s")

        yield advance


def _console() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr, force_terminal=True if os.environ.get("DOQ_PROGRESS") == "1" else None)
