"""Runs of canonical dedup ids: a producer's consecutive ids remembered as one range (pure).

A dedup id of the *canonical form* `<producer>-<sequence>` (exactly 16 lowercase hex
digits, "-", 12 lowercase hex digits: what doq's producers stamp on messages that have no
dedup id of their own) is remembered as part of a *run*: consecutive sequence numbers of
one producer, stored with consecutive message ids and one expiry (like Kafka's idempotent
producer, which keeps a producer's sequence ranges). A run is one record and one entry of
the expiry index, so a frame of 1,000 stamped messages costs one record, not 1,000.
Runs of one producer in one queue never overlap. Any other dedup id is remembered alone.

The form is only a storage layout: the id `P-s` is found whether it was remembered alone
or in a run, and every id still expires by its own window, so what dedup means does not
change (a user may choose canonical ids too).
"""

from __future__ import annotations

import re
import struct

from sortedcontainers import SortedList

_CANONICAL = re.compile(r"[0-9a-f]{16}-[0-9a-f]{12}")
CANONICAL_LEN = 29
PRODUCER_LEN = 17  # the producer part with its "-"
_LOW4 = struct.pack(">65536H", *range(65536)).hex()  # "0000" "0001" ... "ffff"


def parse(did: str) -> tuple[str, int] | None:
    """(producer with its "-", sequence) of a canonical dedup id, else None."""
    if len(did) != CANONICAL_LEN or _CANONICAL.fullmatch(did) is None:
        return None
    return did[:PRODUCER_LEN], int(did[PRODUCER_LEN:], 16)


def run_id(producer: str, seq: int) -> str:
    """The canonical dedup id of `seq` (0 <= seq < 16**12) of `producer`."""
    return f"{producer}{seq:012x}"


def one_run(dids: list[str]) -> tuple[str, int] | None:
    """(producer, first sequence) when `dids` (non-empty) are the canonical ids of
    consecutive sequences of one producer, else None. No formatting per id: the ids are
    compared column by column (character k of every id) in C."""
    n = len(dids)
    d0 = dids[0]
    p = parse(d0) if type(d0) is str else None
    if p is None or n == 1:
        return p
    producer, first = p
    last = first + n - 1
    if last >= 1 << 48:
        return None
    try:
        joined = "".join(dids)
    except TypeError:
        return None
    if set(map(len, dids)) != {CANONICAL_LEN}:
        return None
    if first >> 16 != last >> 16:  # the upper digits change within the run: id by id
        return p if [f"{producer}{s:012x}" for s in range(first, last + 1)] == dids else None
    step = CANONICAL_LEN
    for k, ch in enumerate(f"{producer}{first >> 16:08x}"):  # the 25 characters all ids share
        if joined[k::step] != ch * n:
            return None
    lo = first & 0xFFFF
    for k in range(4):  # the last 4 digits count up
        if joined[25 + k :: step] != _LOW4[4 * lo + k : 4 * (lo + n) : 4]:
            return None
    return p


class Run:
    """Sequences `first .. first+count-1` of one producer, stored as message ids
    `id0 .. id0+count-1`, remembered until `exp` (replicated ms)."""

    __slots__ = ("first", "count", "id0", "exp")

    def __init__(self, first: int, count: int, id0: int, exp: int) -> None:
        self.first = first
        self.count = count
        self.id0 = id0
        self.exp = exp


class Runs:
    """The runs of one producer in one queue, by first sequence (they never overlap)."""

    __slots__ = ("firsts", "by_first")

    def __init__(self) -> None:
        self.firsts: SortedList = SortedList()
        self.by_first: dict[int, Run] = {}

    def __len__(self) -> int:
        return len(self.by_first)

    def floor(self, seq: int) -> Run | None:
        """The run with the greatest first sequence <= `seq` (None if none)."""
        firsts = self.firsts
        if not firsts:
            return None
        f = firsts[-1]
        if seq < f:
            i = firsts.bisect_right(seq)
            if not i:
                return None
            f = firsts[i - 1]
        return self.by_first[f]

    def find(self, seq: int) -> Run | None:
        """The run that holds `seq`, if any."""
        r = self.floor(seq)
        return r if r is not None and seq < r.first + r.count else None

    def overlaps(self, first: int, n: int) -> bool:
        """Whether any run holds one of the sequences `first .. first+n-1`."""
        r = self.floor(first + n - 1)
        return r is not None and r.first + r.count > first

    def add(self, run: Run) -> None:
        """Add a run that overlaps none (the caller checked)."""
        self.firsts.add(run.first)
        self.by_first[run.first] = run

    def remove(self, first: int) -> Run:
        """Remove and return the run starting at `first` (KeyError if none)."""
        run = self.by_first.pop(first)
        self.firsts.remove(first)
        return run
