"""Letting go of the data file's pages the process mapped by reading them.

LMDB reads through a shared, read-only map of its data file: every page a reader touches
stays in the process's page tables, so it counts in the process's RSS (`RssFile`) until
the process exits. A rebuild reads every record once (a restart of a node with millions
of messages queued maps the whole file), and those pages are then rarely read again.
`release_mapped_pages` drops the process's mappings of the file's pages (Linux
`madvise(MADV_DONTNEED)` over the map's address ranges, found in `/proc/self/maps`): the
pages stay in the page cache (clean, reclaimable, nothing is written or lost), and the
next read of one maps it again from there. On a shared read-only file map this is
harmless at any time, for any thread (a concurrent reader refaults the page).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _libc_madvise() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise = _libc_madvise()


def mapped_ranges(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """The (start, end) address ranges of this process's maps of the file `path` ([] if
    none, or not Linux)."""
    try:
        target = os.stat(path)
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return []
    dev = f"{os.major(target.st_dev):02x}:{os.minor(target.st_dev):02x}"
    out = []
    for line in lines:
        parts = line.split(None, 5)
        # address perms offset dev inode [path]: matched by device and inode (a path may be relative)
        if len(parts) < 5 or parts[4] != str(target.st_ino) or parts[3] != dev:
            continue
        start, _, end = parts[0].partition("-")
        out.append((int(start, 16), int(end, 16)))
    return out


def release_mapped_pages(path: str | os.PathLike[str]) -> int:
    """Drop this process's page mappings of the file `path` (see the module docstring);
    the bytes of address range advised (0 where not supported). Never raises: this only
    lowers the RSS the process is charged with."""
    if _madvise is None:
        return 0
    done = 0
    for start, end in mapped_ranges(path):
        if _madvise(start, end - start, _MADV_DONTNEED) == 0:  # type: ignore[operator]
            done += end - start
    return done
