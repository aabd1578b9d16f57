"""`IdSet`: a compact set of unsigned 64-bit ids (message ids of one queue).

Ids are grouped in pages of 2**16 consecutive ids; a page holds its members either as a
sorted `array('H')` of offsets (2 bytes a member, while at most SPARSE_MAX) or as a
bitmap of 8 KiB (1 bit an id: a dense run of ids, as enqueues make). So a queue's ids
cost ~1 bit each when they are dense and ~2 bytes when they are spread, instead of a dict
slot and an int object (~80 bytes). Membership tests are safe from any thread while the
single writer changes the set (each step is one C operation under the GIL; a page
changing form is replaced in one dict assignment). Pure, deterministic, no I/O.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

PAGE_BITS = 16
PAGE_MASK = (1 << PAGE_BITS) - 1
SPARSE_MAX = 4096  # members of an array page; more: a bitmap (8 KiB = 4096 * 2 bytes)
DENSE_MIN = 1024  # a bitmap page with fewer members goes back to an array
_BITMAP_BYTES = 1 << (PAGE_BITS - 3)


class IdSet:
    __slots__ = ("_pages", "_counts", "_len")

    def __init__(self) -> None:
        self._pages: dict[int, array[int] | bytearray] = {}
        self._counts: dict[int, int] = {}  # members per page
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, id_: object) -> bool:
        if type(id_) is not int or id_ < 0:
            return False
        p = self._pages.get(id_ >> PAGE_BITS)
        if p is None:
            return False
        o = id_ & PAGE_MASK
        if type(p) is bytearray:
            return bool((p[o >> 3] >> (o & 7)) & 1)
        i = bisect_left(p, o)
        return i < len(p) and p[i] == o

    def add(self, id_: int) -> None:
        """Add `id_` (no-op if present)."""
        self.update_sorted((id_,))

    def update_sorted(self, ids: Iterable[int]) -> None:
        """Add each of `ids` (ascending), present ones ignored."""
        cur_hi = -1
        offs: list[int] = []
        for id_ in ids:
            hi = id_ >> PAGE_BITS
            if hi != cur_hi:
                if offs:
                    self._add_offsets(cur_hi, offs)
                cur_hi, offs = hi, []
            offs.append(id_ & PAGE_MASK)
        if offs:
            self._add_offsets(cur_hi, offs)

    def load_sorted(self, ids: Sequence[int]) -> None:
        """Replace the content by `ids` (ascending, distinct): a page at a time, a dense
        run of ids as a bitmap filled by bytes."""
        self.clear()
        n = len(ids)
        i = 0
        while i < n:
            hi = ids[i] >> PAGE_BITS
            j = bisect_left(ids, (hi + 1) << PAGE_BITS, i)
            count = j - i
            base = hi << PAGE_BITS
            if count <= SPARSE_MAX:
                self._pages[hi] = array("H", [x - base for x in ids[i:j]])
            elif ids[j - 1] - ids[i] == count - 1:
                bm = bytearray(_BITMAP_BYTES)
                _fill(bm, ids[i] - base, ids[j - 1] - base + 1)
                self._pages[hi] = bm
            else:
                bm = bytearray(_BITMAP_BYTES)
                for x in ids[i:j]:
                    o = x - base
                    bm[o >> 3] |= 1 << (o & 7)
                self._pages[hi] = bm
            self._counts[hi] = count
            i = j
        self._len = n

    def add_range(self, first: int, n: int) -> None:
        """Add ids first .. first+n-1."""
        end = first + n
        while first < end:
            hi = first >> PAGE_BITS
            stop = min(end, (hi + 1) << PAGE_BITS)
            self._add_offsets(hi, list(range(first & PAGE_MASK, ((stop - 1) & PAGE_MASK) + 1)))
            first = stop

    def _add_offsets(self, hi: int, offs: list[int]) -> None:
        p = self._pages.get(hi)
        count = self._counts.get(hi, 0)
        if not isinstance(p, bytearray):
            if p is None:
                arr = array("H", offs)
                added = len(offs)
            elif offs[0] > p[-1]:  # appending, as enqueues do
                arr = p
                added = len(offs)
                arr.extend(offs)
            else:
                arr = p
                added = 0
                for o in offs:
                    i = bisect_left(arr, o)
                    if i == len(arr) or arr[i] != o:
                        arr.insert(i, o)
                        added += 1
            count += added
            self._len += added
            self._counts[hi] = count
            if count <= SPARSE_MAX:
                if p is None:
                    self._pages[hi] = arr
                return
            bm = bytearray(_BITMAP_BYTES)
            for o in arr:
                bm[o >> 3] |= 1 << (o & 7)
            self._pages[hi] = bm
            return
        bm = p
        added = 0
        for o in offs:
            j, bit = o >> 3, 1 << (o & 7)
            v = bm[j]
            if not v & bit:
                bm[j] = v | bit
                added += 1
        self._counts[hi] = count + added
        self._len += added

    def discard(self, id_: int) -> None:
        """Remove `id_` if present."""
        self.discard_many((id_,))

    def discard_many(self, ids: Iterable[int]) -> None:
        """Remove each of `ids` that is present (any order)."""
        pages, counts = self._pages, self._counts
        for id_ in ids:
            hi = id_ >> PAGE_BITS
            p = pages.get(hi)
            if p is None:
                continue
            o = id_ & PAGE_MASK
            if type(p) is bytearray:
                j, bit = o >> 3, 1 << (o & 7)
                v = p[j]
                if not v & bit:
                    continue
                p[j] = v & ~bit
            else:
                i = bisect_left(p, o)
                if i == len(p) or p[i] != o:
                    continue
                del p[i]
            self._len -= 1
            c = counts[hi] - 1
            if not c:
                del pages[hi], counts[hi]
                continue
            counts[hi] = c
            if type(p) is bytearray and c < DENSE_MIN:
                pages[hi] = array("H", _offsets(p))

    def first(self) -> int | None:
        """The lowest id (None: empty); O(pages) plus one page. Safe from any thread while
        the writer changes the set: the answer is then an id present at some moment of
        the call (None if the set emptied meanwhile)."""
        pages = self._pages
        for _ in range(64):  # a retry per page the writer empties under us
            if not pages:
                return None
            try:
                hi = min(pages)  # one C call: the writer cannot run in between
            except ValueError:
                return None
            p = pages.get(hi)
            if p is None:
                continue  # emptied and dropped since the min
            if type(p) is bytearray:
                j = len(p) - len(p.lstrip(b"\x00"))
                if j == len(p):
                    continue
                v = p[j]
                return (hi << PAGE_BITS) | (j << 3) | ((v & -v).bit_length() - 1)
            if len(p):
                try:
                    return (hi << PAGE_BITS) | p[0]
                except IndexError:
                    continue
        return None

    def __iter__(self) -> Iterator[int]:
        """The ids in ascending order."""
        for hi in sorted(self._pages):
            p = self._pages[hi]
            base = hi << PAGE_BITS
            for o in (_offsets(p) if type(p) is bytearray else p):
                yield base | o

    def clear(self) -> None:
        self._pages, self._counts, self._len = {}, {}, 0

    def nbytes(self) -> int:
        """Bytes held by the pages' items (not counting headers)."""
        return sum(len(p) if type(p) is bytearray else 2 * len(p) for p in self._pages.values())


def _fill(bm: bytearray, lo: int, hi: int) -> None:
    """Set the bits lo .. hi-1 of a bitmap page."""
    while lo < hi and lo & 7:
        bm[lo >> 3] |= 1 << (lo & 7)
        lo += 1
    full = (hi - lo) >> 3
    bm[lo >> 3 : (lo >> 3) + full] = b"\xff" * full
    lo += full << 3
    while lo < hi:
        bm[lo >> 3] |= 1 << (lo & 7)
        lo += 1


def _offsets(bm: bytearray) -> list[int]:
    """The set bits of a bitmap page, ascending."""
    out: list[int] = []
    for j, v in enumerate(bm):
        if v:
            base = j << 3
            out.extend(base | b for b in range(8) if v >> b & 1)
    return out
