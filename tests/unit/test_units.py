"""Byte sizes as operators write them (`doq.units`), and the serve flags that take them."""

from __future__ import annotations

import argparse

import pytest

from doq.config import add_serve_arguments, load_config
from doq.errors import InvalidArgument
from doq.units import format_size, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("4096", 4096), ("16MiB", 16 << 20), ("64GiB", 64 << 30), ("512KiB", 512 << 10), ("1TiB", 1 << 40),
    ("16mib", 16 << 20), ("2M", 2 << 20), ("1GB", 10**9), ("1.5GiB", 3 << 29), (" 8 MiB ", 8 << 20), (0, 0),
])
def test_sizes_in_binary_and_decimal_units(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "16 parsecs", "-1", "16MiBs", "1e9", -5])
def test_anything_else_is_refused_naming_the_setting(text: str | int) -> None:
    with pytest.raises(InvalidArgument, match="--max-data-size"):
        parse_size(text, what="--max-data-size")


def test_format_size() -> None:
    assert (format_size(512), format_size(16 << 20), format_size(3 << 29)) == ("512 B", "16.0 MiB", "1.5 GiB")


def _load(*argv: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return load_config(p.parse_args(list(argv)), env or {})


def test_max_data_size_and_disk_free_limit_flags_env_and_bounds() -> None:
    c = _load("--max-data-size", "16MiB", "--disk-free-limit", "0")
    assert (c.max_data_size, c.disk_free_limit) == (16 << 20, 0)
    assert _load(env={"DOQ_MAX_DATA_SIZE": "64GiB"}).max_data_size == 64 << 30
    assert _load().max_data_size == 64 << 30 and _load().disk_free_limit == 64 << 20
    with pytest.raises(InvalidArgument, match="--max-data-size must be within 2.0 MiB"):
        _load("--max-data-size", "1MiB")
    with pytest.raises(InvalidArgument, match="--disk-free-limit must be a size"):
        _load("--disk-free-limit", "lots")
