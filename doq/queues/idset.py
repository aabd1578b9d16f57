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
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat

PAGE_BITS = 16
PAGE_MASK = (1 << PAGE_BITS) - 1
SPARSE_MAX = 4096  # members of an array page; more: a bitmap (8 KiB = 4096 * 2 bytes)
DENSE_MIN = 1024  # a bitmap page with fewer members goes back to an array
_BITMAP_BYTES = 1 << (PAGE_BITS - 3)
_HOST_LITTLE = array("H", [1]).tobytes()[0] == 1
_NONZERO = bytes([0] + [1] * 255)  # a translate table: 1 for a byte that is not 0
_IS_ZERO = bytes([1]) + bytes(255)  # a translate table: 1 for 0, else 0
_IS_ONE = bytes([0, 1]) + bytes(254)  # a translate table: 1 for 1, else 0


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
        """Replace the content by `ids` (ascending, distinct; not checked): a page at a
        time, by C calls over the page's ids (no Python step per id): a page of at most
        SPARSE_MAX ids as their offsets, a denser one as a bitmap with its holes cleared,
        a Python step per run of missing ids (`_bitmap`)."""
        self.clear()
        if not _HOST_LITTLE:
            self._load_sorted_by_id(ids)
            return
        col = ids if isinstance(ids, array) and ids.typecode == "Q" else array("Q", ids)
        n = len(col)
        pages, counts = self._pages, self._counts
        i = 0
        while i < n:
            hi = col[i] >> PAGE_BITS
            j = bisect_left(col, (hi + 1) << PAGE_BITS, i)
            seg = col[i:j]
            pages[hi] = _offsets_of(seg) if j - i <= SPARSE_MAX else _bitmap(seg)
            counts[hi] = j - i
            i = j
        self._len = n

    def _load_sorted_by_id(self, ids: Sequence[int]) -> None:
        """`load_sorted` (into an empty set) a Python step per id (a big-endian host)."""
        n = len(ids)
        i = 0
        while i < n:
            hi = ids[i] >> PAGE_BITS
            j = bisect_left(ids, (hi + 1) << PAGE_BITS, i)
            count = j - i
            base = hi << PAGE_BITS
            if count <= SPARSE_MAX:
                self._pages[hi] = array("H", [x - base for x in ids[i:j]])
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


def _low16(seg: array[int]) -> bytes:
    """The two low bytes of each id of `seg` (a `'Q'` array; a little-endian host), back
    to back: the ids' offsets in their page, as an `'H'` array's bytes."""
    raw = seg.tobytes()
    out = bytearray(2 * len(seg))
    out[0::2] = raw[0::8]
    out[1::2] = raw[1::8]
    return bytes(out)


def _offsets_of(seg: array[int]) -> array[int]:
    """The offsets of the ids of `seg` (one page's, a `'Q'` array; a little-endian host)
    in their page, as an `'H'` array: two strided byte copies."""
    return array("H", _low16(seg))


def _bitmap(seg: array[int]) -> bytearray:
    """The bitmap page of `seg` (a `'Q'` array of one page's ids, ascending, distinct, at
    least two; a little-endian host). A byte per id is set from the first id to the last,
    the holes between them are cleared (found by C calls: each offset's distance to the
    next less one, as the 16-bit words of one int; a Python step per run of missing ids),
    and the bytes are packed into bits by eight strided slices."""
    m = len(seg)
    offs = _low16(seg)
    lo, hi = seg[0] & PAGE_MASK, seg[-1] & PAGE_MASK
    bm = bytearray(_BITMAP_BYTES)
    if hi - lo == m - 1:  # no holes
        _fill(bm, lo, hi + 1)
        return bm
    per_id = bytearray(1 << PAGE_BITS)
    per_id[lo : hi + 1] = b"\x01" * (hi - lo + 1)
    # word k: offset k + 1 - offset k - 1, the ids missing after id k (borrow-free: the
    # offsets ascend)
    gaps = (int.from_bytes(offs[2:], "little") - int.from_bytes(offs[:-2], "little")
            - int.from_bytes(b"\x01\x00" * (m - 1), "little")).to_bytes(2 * (m - 1), "little")
    low, high = gaps[0::2], gaps[1::2]
    # byte k: 1 iff ids are missing after id k (the gap's two bytes ORed); 1 iff one is
    nz = int.from_bytes((int.from_bytes(low, "little") | int.from_bytes(high, "little")).to_bytes(
        m - 1, "little").translate(_NONZERO), "little")
    one = int.from_bytes(low.translate(_IS_ONE), "little") & int.from_bytes(high.translate(_IS_ZERO), "little")
    # the lone missing ids (most holes): cleared by C calls, at offset k + 1 for each such k
    deque(map(per_id.__setitem__, map((1).__add__, compress(array("H", offs), one.to_bytes(m - 1, "little"))),
              repeat(0)), 0)
    runs = (nz ^ one).to_bytes(m - 1, "little")  # byte k: 1 iff two or more are missing after id k
    k = runs.find(1)
    while k >= 0:
        g = gaps[2 * k] | gaps[2 * k + 1] << 8
        at = (offs[2 * k] | offs[2 * k + 1] << 8) + 1
        per_id[at : at + g] = bytes(g)
        k = runs.find(1, k + 1)
    bits = 0
    for b in range(8):  # byte o of `per_id` -> bit o & 7 of byte o >> 3
        bits |= int.from_bytes(per_id[b::8], "little") << b
    bm[:] = bits.to_bytes(_BITMAP_BYTES, "little")
    return bm


def _offsets(bm: bytearray) -> list[int]:
    """The set bits of a bitmap page, ascending."""
    out: list[int] = []
    for j, v in enumerate(bm):
        if v:
            base = j << 3
            out.extend(base | b for b in range(8) if v >> b & 1)
    return out
