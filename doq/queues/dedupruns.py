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

from sortedcontainers import SortedList

_CANONICAL = re.compile(r"[0-9a-f]{16}-[0-9a-f]{12}")
CANONICAL_LEN = 29
PRODUCER_LEN = 17  # the producer part with its "-"


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
    consecutive sequences of one producer, else None."""
    d0 = dids[0]
    p = parse(d0) if type(d0) is str else None
    if p is None or len(dids) == 1:
        return p
    producer, first = p
    if dids[-1] != f"{producer}{first + len(dids) - 1:012x}":  # cheap refusal first
        return None
    if [f"{producer}{s:012x}" for s in range(first, first + len(dids))] != dids:
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
