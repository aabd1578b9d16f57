"""Command-line flag helpers shared by every `doq` command (argparse only)."""

from __future__ import annotations

from typing import Any


class FlagDefault(str):
    """A flag's default as argparse holds it (so `--help` can show it) while marking the value
    as "not given on the command line": an environment variable or the config file may still
    set it (flags > DOQ_* environment > config file > defaults)."""


def shown_default(value: Any) -> FlagDefault:
    if isinstance(value, tuple):
        value = ",".join(value)
    return FlagDefault(value if value != "" else "none")


def given(value: Any) -> bool:
    """Was this flag given on the command line (rather than left at its shown default)?"""
    return value is not None and not isinstance(value, FlagDefault)
