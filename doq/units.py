"""Byte sizes as operators write them: `16MiB`, `64GiB`, `512KiB`, `1GB`, `4096`."""

from __future__ import annotations

import re

from doq.errors import InvalidArgument

_UNITS = {
    "": 1, "B": 1,
    "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
    "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Bytes in `text`: a whole number of bytes, or a number with a unit (KiB, MiB, GiB,
    TiB: powers of 1024, as K, M, G, T; KB, MB, GB, TB: powers of 1000; case-insensitive).
    Raises `InvalidArgument` naming `what` on anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise InvalidArgument(f"{what} must not be negative, got {text}")
        return text
    m = _SIZE.fullmatch(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise InvalidArgument(f"{what} must be a size such as 4096, 512KiB, 16MiB or 64GiB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    """`n` bytes in the largest binary unit that keeps it whole-ish (e.g. 16.0 MiB)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
