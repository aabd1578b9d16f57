"""`PairList`: a sorted list of distinct (a, b) integer pairs kept in packed arrays.

a is a signed 64-bit integer, b an unsigned 64-bit one; pairs sort by a, then b. Each
pair costs ~16 bytes (two array slots) instead of a Python int object and a pointer
(~60 bytes for a packed 128-bit key in a `SortedList`). Like sortedcontainers' SortedList
the pairs are held in chunks (here: two arrays each, `'q'` for a and `'Q'` for b, up to
2 * LOAD pairs), found by bisecting the a's of the chunks' largest pairs (among equal ones,
their b's) and then, in C, the chunk's a-array and, among equal a's, its b-array. Pure,
deterministic, no I/O.

Bulk adds (`add_many`) do not put each pair in its place: a pair is appended to the chunk
whose key range holds it, and the chunk is marked unsorted; a chunk is sorted (and cut into
chunks of LOAD to 2 * LOAD pairs) when it is next read (`_fix`) or when it grows past
UNSORTED_LOADS * LOAD pairs. A random pair's insert in place reads ~10 cold cache lines of a
chunk (the bisect) and moves half of it; an append touches its end, and a chunk's sort reads
it in order. The chunk's key range and largest
pair (`_maxa`, `_maxb`) are kept exact either way, so where a pair belongs never depends on the
order inside a chunk.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import compress, islice, pairwise, repeat
from operator import eq, itemgetter, le, lt
from typing import Any

LOAD = 256  # pairs a sorted chunk is cut to (at most twice that): 1024 cost a third more per insert at 5M (cache misses, memmove)
# an unsorted chunk (appended to by `add_many`) grows to UNSORTED_LOADS * LOAD pairs before it is
# sorted and cut: fewer, larger chunks take a batch's appends (their ends stay in the CPU's
# caches), and each pair is sorted about once
UNSORTED_LOADS = 16


_append = array.append  # called as `_append(chunk, x)` by `map`: no bytecode per pair
_first, _second = itemgetter(0), itemgetter(1)


_FLOAT_BITS_MAX = 62  # packed keys below 2**62, plus 2**52, are the bit patterns of finite positive floats
_NORMAL = 1 << 52  # the bit pattern of the smallest positive normal float (no subnormals sorted)
_SIGN = 1 << 63
_I64_MIN, _I64_MAX, _U64_MAX = -_SIGN, _SIGN - 1, (1 << 64) - 1  # a pair's a and b columns (`q`, `Q`)
_RUN = 1 << 14  # floats sorted apart before the merge (`_sort_floats`)
# pairs packed or unpacked at a time: a block's ints (2 MiB) stay below glibc's mmap threshold,
# so their memory is reused, not mapped and faulted in afresh for every temporary
_BLOCK = 1 << 18
_HOST_LITTLE = array("H", [1]).tobytes()[0] == 1
# LOADs of pairs a chunk of `PairList.from_unsorted` aims at (a's spread evenly: half to all
# of that), sorted when first read (a chunk of 1.5-3k pairs: ~2 ms)
BUCKET_LOADS = 12
# `pair_ranges` refuses a grid of more ranges than twice its pairs plus this many
RANGES_SLACK = 4096


def _ones(n: int) -> int:
    """An int of `n` 64-bit words each 1: `word * _ones(n)` is `n` copies of `word`."""
    return int.from_bytes((1).to_bytes(8, "little") * n, "little")


def _words(col: array[int]) -> int:
    """The column's 64-bit words (`'q'`: two's complement) as one int, item i at bit 64 * i."""
    return int.from_bytes(col, "little")


def _rel_words(col: array[int], amin: int, ones: int) -> int:
    """The words of `_words(col)` less `amin` each (as unsigned: no borrow across words),
    for a `'q'` column whose items are all >= `amin`; `ones` is `_ones(len(col))`."""
    if amin >= 0:  # a - amin per word, borrow-free
        return _words(col) - amin * ones
    # the words in offset binary (sign bit flipped) order as a does: then borrow-free
    return (_words(col) ^ (_SIGN * ones)) - (amin + _SIGN) * ones


def _unpack(keys: int, m: int, ones: int, shift: int, a_bits: int, amin: int, bmin: int,
            a_out: array[int], b_out: array[int]) -> None:
    """Append to `a_out` and `b_out` the pairs of the `m` packed keys `(a - amin) << shift |
    (b - bmin)` held as the 64-bit words of `keys` (`ones`: `_ones(m)`)."""
    a_rel = ((keys >> shift) & (((1 << a_bits) - 1) * ones)) if a_bits else 0
    a_words = a_rel + amin * ones if amin >= 0 else (a_rel + (amin + _SIGN) * ones) ^ (_SIGN * ones)
    a_out.frombytes(a_words.to_bytes(8 * m, "little"))
    b_out.frombytes(((keys & (((1 << shift) - 1) * ones)) + bmin * ones).to_bytes(8 * m, "little"))


def _sort_floats(floats: array[float]) -> array[float]:
    """The floats sorted. Runs of `_RUN` are sorted first (each run's objects fit in the
    CPU's cache) and laid out again in their sorted order (new float objects, allocated
    in that order); one sort then merges the runs, reading each run's objects in memory
    order. A single sort of the whole list reads them in random memory order: measured
    ~1.3x the CPU for 4.75M floats."""
    runs = array("d")
    for i in range(0, len(floats), _RUN):
        run = floats[i : i + _RUN].tolist()
        run.sort()
        runs.extend(run)
    fl = runs.tolist()
    del runs
    fl.sort()  # merges the sorted runs (timsort finds them)
    return array("d", fl)


def sorted_pairs(a: Sequence[int], b: Sequence[int]) -> tuple[array[int], array[int]]:
    """The pairs `zip(a, b)` in ascending (a, b) order, as a `'q'` array of a's and a `'Q'`
    array of b's (any input order; a as in a `PairList`: signed 64-bit, b unsigned).

    Each pair is packed into one number, `(a - min a) << bits(b's span) | (b - min b)`, and
    the numbers are sorted. When they fit in 62 bits they are sorted as the floats whose
    bit patterns they are (plus 2**52: positive normal floats order as their bit patterns
    do), whose comparison CPython's sort does inline; packing, the reinterpretation and
    the unpacking are done on `_BLOCK` pairs at a time, as the 64-bit words of one int
    (shifts, masks and carry-free adds of a repeated word), so no Python object is made
    per pair but the floats the sort needs. Wider keys are sorted as ints. The result does not
    depend on the input order.
    """
    n = len(a)
    if n != len(b):
        raise ValueError("a and b differ in length")
    if not n:
        return array("q"), array("Q")
    amin, bmin = min(a), min(b)
    shift = (max(b) - bmin).bit_length()
    mask = (1 << shift) - 1
    a_bits = (max(a) - amin).bit_length()
    if a_bits + shift <= _FLOAT_BITS_MAX and _HOST_LITTLE:
        a_col = a if isinstance(a, array) and a.typecode == "q" else array("q", a)
        b_col = b if isinstance(b, array) and b.typecode == "Q" else array("Q", b)
        floats = array("d")
        for i in range(0, n, _BLOCK):
            m = min(_BLOCK, n - i)
            ones = _ones(m)
            rel = _rel_words(a_col[i : i + m], amin, ones)
            # a word's a part stays below bit 62; + 2**52: a normal float's bit pattern
            keys = ((rel << shift) | (_words(b_col[i : i + m]) - bmin * ones)) + _NORMAL * ones
            floats.frombytes(keys.to_bytes(8 * m, "little"))
        del rel, keys
        back = _sort_floats(floats)
        del floats
        a_out, b_out = array("q"), array("Q")
        view = memoryview(back)
        for i in range(0, n, _BLOCK):
            m = min(_BLOCK, n - i)
            ones = _ones(m)
            keys = int.from_bytes(view[i : i + m], "little") - _NORMAL * ones
            _unpack(keys, m, ones, shift, a_bits, amin, bmin, a_out, b_out)
        view.release()
        return a_out, b_out
    ikeys = [((x - amin) << shift) | (y - bmin) for x, y in zip(a, b, strict=True)]
    ikeys.sort()
    a_out = array("q", map(amin.__add__, map(shift.__rrshift__, ikeys)) if amin else map(shift.__rrshift__, ikeys))
    b_out = array("Q", map(bmin.__add__, map(mask.__and__, ikeys)) if bmin else map(mask.__and__, ikeys))
    return a_out, b_out


class PairRanges:
    """Pairs distributed into the ranges of a of one absolute grid: range `r` holds the
    pairs whose `a >> shift == r`, unsorted, as an a-array (`'q'`) and a b-array (`'Q'`)
    with its largest pair. Two processes of a start each distribute their own part
    (`pair_ranges`, with a shift each picks from its own pairs and a shared estimate of
    their number), and `PairList.from_ranges` joins the parts range by range (a coarser
    grid's range is the finer grid's ranges it covers: `coarsened`): the same list as
    `PairList.from_unsorted` of all the pairs, its bulk distribution done apart."""

    __slots__ = ("shift", "rs", "as_", "bs", "tops")

    def __init__(self, shift: int, rs: list[int], as_: list[array[int]], bs: list[array[int]],
                 tops: list[tuple[int, int]]) -> None:
        self.shift = shift
        self.rs = rs  # range numbers, ascending
        self.as_ = as_
        self.bs = bs
        self.tops = tops  # each range's largest pair

    def __len__(self) -> int:
        return sum(map(len, self.as_))

    def columns(self) -> tuple[array[int], array[int]]:
        """Every pair, as (a's, b's), range after range (unsorted within one)."""
        a, b = array("q"), array("Q")
        for ca, cb in zip(self.as_, self.bs, strict=True):
            a.extend(ca)
            b.extend(cb)
        return a, b

    def to_wire(self) -> tuple[int, list[int], list[bytes], list[bytes], list[int], list[int]]:
        """The ranges as plain values (for `marshal`); `from_wire` reads them back."""
        return (self.shift, self.rs, [x.tobytes() for x in self.as_], [x.tobytes() for x in self.bs],
                [t[0] for t in self.tops], [t[1] for t in self.tops])

    @classmethod
    def from_wire(cls, wire: object) -> PairRanges:
        """`to_wire`'s value back; ValueError if it is not one: a part of the wrong shape,
        ranges not ascending, arrays of unequal lengths or empty, a largest pair outside
        its range or not of the columns' types (the pairs themselves are not checked: their
        producer is this code)."""
        try:
            shift: Any
            rs: Any
            a_bs: Any
            b_bs: Any
            top_as: Any
            top_bs: Any
            shift, rs, a_bs, b_bs, top_as, top_bs = wire  # type: ignore[misc]
            if not (type(shift) is int and 0 <= shift < 128 and isinstance(rs, list)
                    and len(rs) == len(a_bs) == len(b_bs) == len(top_as) == len(top_bs)):
                raise ValueError("pair ranges of the wrong shape")
            as_, bs = [], []
            for ab, bb in zip(a_bs, b_bs, strict=True):
                ca, cb = array("q"), array("Q")
                ca.frombytes(ab)
                cb.frombytes(bb)
                if not ca or len(ca) != len(cb):
                    raise ValueError("a pair range of unequal or no columns")
                as_.append(ca)
                bs.append(cb)
            if any(type(r) is not int for r in rs) or any(map(le, rs[1:], rs)):
                raise ValueError("pair ranges out of order")
            if any(type(t) is not int or t >> shift != r or not _I64_MIN <= t <= _I64_MAX
                   for t, r in zip(top_as, rs, strict=True)):
                raise ValueError("a pair range's largest pair outside it")
            if any(type(t) is not int or not 0 <= t <= _U64_MAX for t in top_bs):
                raise ValueError("a pair range's largest id not an unsigned 64-bit integer")
            return cls(shift, rs, as_, bs, list(zip(top_as, top_bs, strict=True)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed pair ranges: {e}") from None

    def coarsened(self, shift: int) -> PairRanges:
        """The same pairs on the grid of `shift` (>= this one's): each range the ranges of
        this grid it covers, joined (their arrays taken over: this object is spent)."""
        d = shift - self.shift
        if d <= 0:
            return self
        rs: list[int] = []
        as_: list[array[int]] = []
        bs: list[array[int]] = []
        tops: list[tuple[int, int]] = []
        for r, ca, cb, top in zip(self.rs, self.as_, self.bs, self.tops, strict=True):
            r >>= d
            if rs and rs[-1] == r:
                as_[-1].extend(ca)
                bs[-1].extend(cb)
                tops[-1] = max(tops[-1], top)
            else:
                rs.append(r)
                as_.append(ca)
                bs.append(cb)
                tops.append(top)
        return PairRanges(shift, rs, as_, bs, tops)


def range_shift(a_span: int, n: int, per_range: int) -> int:
    """The grid's shift for pairs spread over `a_span` (max a - min a), about `n` of them:
    a range of width 2**shift then holds half to all of `per_range` when they are spread
    evenly."""
    return max(0, (a_span * per_range // max(1, n)).bit_length() - 1)


def _distribute(a_col: array[int], b_col: array[int], a_lo: int, b_lo: int, b_bits: int, shift: int,
                nb: int) -> list[array[int]]:
    """The pairs of the columns as 64-bit keys (a - a_lo above b - b_lo's `b_bits` bits)
    appended, in the columns' order, to the `nb` ranges of the grid of `shift` (a range
    per 2**shift of a - a_lo): packed `_BLOCK` pairs at a time as the words of one int,
    each key's range found by shifts of those words, the appends done by C calls."""
    n = len(a_col)
    mask = (1 << (nb - 1).bit_length()) - 1  # the range's bits, within the key's 64
    keys, idx = array("Q"), array("Q")
    for i in range(0, n, _BLOCK):
        m = min(_BLOCK, n - i)
        ones = _ones(m)
        packed = (_rel_words(a_col[i : i + m], a_lo, ones) << b_bits) | (_words(b_col[i : i + m]) - b_lo * ones)
        keys.frombytes(packed.to_bytes(8 * m, "little"))
        idx.frombytes(((packed >> (b_bits + shift)) & (mask * ones)).to_bytes(8 * m, "little"))
        del packed
    chunks: list[array[int]] = [array("Q") for _ in range(nb)]
    deque(map(_append, map(chunks.__getitem__, idx), keys), 0)
    return chunks


def pair_ranges(a: Sequence[int], b: Sequence[int], shift: int, a_bounds: tuple[int, int] | None = None,
                b_bounds: tuple[int, int] | None = None) -> PairRanges | None:
    """The pairs `zip(a, b)` (distinct, any order) distributed into the ranges of the grid
    of `shift` (`PairRanges`), as `PairList.from_unsorted` distributes them: each pair
    packed into one 64-bit key relative to the start of the lowest range, the range of
    each found by shifts of the keys packed as the words of one int, the keys appended to
    their ranges by C calls, each range unpacked as words again. None if a key would need
    more than 64 bits, if the grid has more than 2 * n + RANGES_SLACK ranges over the pairs'
    span (or on a big-endian host). `a_bounds`, `b_bounds`: as for
    `from_unsorted`."""
    n = len(a)
    if n != len(b):
        raise ValueError("a and b differ in length")
    if not n:
        return PairRanges(shift, [], [], [], [])
    if not _HOST_LITTLE:
        return None
    amin, amax = a_bounds if a_bounds is not None else (min(a), max(a))
    bmin, bmax = b_bounds if b_bounds is not None else (min(b), max(b))
    base = amin >> shift  # the lowest range (floor: a's below 0 too)
    lo = base << shift
    a_span, b_bits = amax - lo, (bmax - bmin).bit_length()
    if a_span.bit_length() + b_bits > 64:
        return None
    a_col = a if isinstance(a, array) and a.typecode == "q" else array("q", a)
    b_col = b if isinstance(b, array) and b.typecode == "Q" else array("Q", b)
    nb = (a_span >> shift) + 1
    if nb > 2 * n + RANGES_SLACK:  # a grid far too fine for these pairs: mostly empty ranges
        return None
    chunks = _distribute(a_col, b_col, lo, bmin, b_bits, shift, nb)
    a_bits, b_mask = a_span.bit_length(), (1 << b_bits) - 1
    out = PairRanges(shift, [], [], [], [])
    for j, ck in enumerate(chunks):
        if not ck:
            continue
        m = len(ck)
        ca, cb = array("q"), array("Q")
        _unpack(_words(ck), m, _ones(m), b_bits, a_bits, lo, bmin, ca, cb)
        top = max(ck)
        out.rs.append(base + j)
        out.as_.append(ca)
        out.bs.append(cb)
        out.tops.append(((top >> b_bits) + lo, (top & b_mask) + bmin))
    return out


class PairList:
    """Sorted distinct (a, b) pairs; `add`/`remove` O(log n + LOAD) (memmove; a chunk left
    unsorted by `add_many` is sorted first: O(LOAD log LOAD)), `add_many` O(log n) per pair
    plus the chunk sorts it causes (about two per pair), bulk front pops linear in the
    pairs taken."""

    __slots__ = ("_as", "_bs", "_maxa", "_maxb", "_len", "_unsorted")

    def __init__(self) -> None:
        self._as: list[array[int]] = []
        self._bs: list[array[int]] = []
        # each chunk's largest pair (its last one once sorted), as two lists: `_chunk_of`
        # bisects the a's (ints, no packing), the b's only among equal a's
        self._maxa: list[int] = []
        self._maxb: list[int] = []
        self._len = 0
        # per chunk: pairs appended out of order by `add_many` (its pairs still above the
        # previous chunk's largest and at most its own)
        self._unsorted: list[bool] = []

    @classmethod
    def from_sorted(cls, a: Sequence[int], b: Sequence[int]) -> PairList:
        """The list of pairs `zip(a, b)`, which must be in ascending order (not checked)."""
        pl = cls()
        pl._append_sorted(a, b)
        return pl

    @classmethod
    def from_unsorted(cls, a: Sequence[int], b: Sequence[int], a_bounds: tuple[int, int] | None = None,
                      b_bounds: tuple[int, int] | None = None) -> PairList:
        """The list of the distinct pairs `zip(a, b)`, in any order: the same list as
        `from_sorted(*sorted_pairs(a, b))`, without sorting it here (a rebuild's bulk load).

        Each pair is packed into one 64-bit key, `(a - min a) << bits(b's span) | (b - min
        b)`, and the keys are split by ranges of a of one width (a power of two: about
        BUCKET_LOADS * LOAD pairs a range when the a's are spread evenly) into unsorted
        chunks, each sorted when it is first read (`_fix`), as `add_many` leaves them.
        Packing, the ranges (shifts of the keys) and each chunk's unpacking are done on
        the 64-bit words of one int at a time, and the keys are appended to their chunks by
        C calls over the column: no sort and no Python bytecode per pair. A range holding
        more than UNSORTED_LOADS * LOAD pairs (a's bunched) is sorted here; a list of at
        most that many pairs, or whose keys need more than 64 bits, is sorted whole
        (`sorted_pairs`). `a_bounds`, `b_bounds`: (lowest, highest) that every a, every b
        lies within (not checked; the same list whatever bounds hold them, the chunks cut
        by them), if the caller knows them: no pass over the column to find them."""
        return cls._build(a, b, None, a_bounds, b_bounds)[0]

    @classmethod
    def split_unsorted(cls, a: Sequence[int], b: Sequence[int], split_a: int,
                       a_bounds: tuple[int, int] | None = None,
                       b_bounds: tuple[int, int] | None = None) -> tuple[PairList, PairList]:
        """(the list of the pairs of `zip(a, b)` whose a is <= `split_a`, the list of the
        others), each the list `from_unsorted` makes of its pairs (in any order, distinct).
        Built as `from_unsorted` builds one list, the pairs distributed once: the ranges
        below `split_a`'s go to the first list whole, those above to the second, and the
        one range holding `split_a` is sorted and cut (a rebuild's ready and delayed
        messages of a queue of timestamp priorities, told apart by one comparison).
        `a_bounds`, `b_bounds`: as for `from_unsorted` (of all the pairs)."""
        return cls._build(a, b, split_a, a_bounds, b_bounds)

    @classmethod
    def _build(cls, a: Sequence[int], b: Sequence[int], split_a: int | None,
               a_bounds: tuple[int, int] | None, b_bounds: tuple[int, int] | None) -> tuple[PairList, PairList]:
        """`split_unsorted` (`split_a` None: every pair in the first list)."""
        n = len(a)
        if n != len(b):
            raise ValueError("a and b differ in length")
        cap = UNSORTED_LOADS * LOAD
        if n <= cap or not _HOST_LITTLE:
            return cls._split_sorted(*sorted_pairs(a, b), split_a)
        amin, amax = a_bounds if a_bounds is not None else (min(a), max(a))
        bmin, bmax = b_bounds if b_bounds is not None else (min(b), max(b))
        a_span, b_bits = amax - amin, (bmax - bmin).bit_length()
        if a_span.bit_length() + b_bits > 64:
            return cls._split_sorted(*sorted_pairs(a, b), split_a)
        a_col = a if isinstance(a, array) and a.typecode == "q" else array("q", a)
        b_col = b if isinstance(b, array) and b.typecode == "Q" else array("Q", b)
        shift = max(0, (a_span * BUCKET_LOADS * LOAD // n).bit_length() - 1)  # a range's width: 2**shift
        nb = (a_span >> shift) + 1  # ranges: n / (BUCKET_LOADS * LOAD) to twice that, + 1
        chunks = _distribute(a_col, b_col, amin, bmin, b_bits, shift, nb)
        # the range holding split_a (-1: every pair above it; nb: none) and, within it, the
        # largest key whose a is split_a's
        at = nb if split_a is None or split_a >= amax else -1 if split_a < amin else (split_a - amin) >> shift
        top_key = ((split_a - amin) << b_bits | ((1 << b_bits) - 1)) if 0 <= at < nb and split_a is not None else 0
        a_bits = a_span.bit_length()
        low, high = cls(), cls()
        for r, ck in enumerate(chunks):
            if not ck:
                continue
            if r == at:
                ck = array("Q", sorted(ck))
                k = bisect_right(ck, top_key)
                low._push_keys(ck[:k], True, cap, b_bits, a_bits, amin, bmin)
                high._push_keys(ck[k:], True, cap, b_bits, a_bits, amin, bmin)
            else:
                (low if r < at else high)._push_keys(ck, False, cap, b_bits, a_bits, amin, bmin)
        return low, high

    @classmethod
    def from_ranges(cls, parts: Sequence[PairRanges], split_a: int | None = None) -> tuple[PairList, PairList]:
        """(the list of the pairs of every part whose a is <= `split_a`, the list of the
        others; `split_a` None: every pair in the first), each the list `from_unsorted`
        makes of its pairs (the parts' pairs distinct): the parts brought to the coarsest
        grid among them, their ranges joined range by range (C copies of the arrays) and
        pushed as unsorted chunks in range order; a range past UNSORTED_LOADS * LOAD pairs
        is sorted here, and the range holding `split_a` sorted and cut. The parts are
        spent (their arrays taken over)."""
        parts = [p for p in parts if p.rs]
        low, high = cls(), cls()
        if not parts:
            return low, high
        shift = max(p.shift for p in parts)
        merged: dict[int, list[Any]] = {}
        for p in parts:
            p = p.coarsened(shift)
            for r, ca, cb, top in zip(p.rs, p.as_, p.bs, p.tops, strict=True):
                cur = merged.get(r)
                if cur is None:
                    merged[r] = [ca, cb, top]
                else:
                    cur[0].extend(ca)
                    cur[1].extend(cb)
                    if top > cur[2]:
                        cur[2] = top
        at = None if split_a is None else split_a >> shift
        cap = UNSORTED_LOADS * LOAD
        for r in sorted(merged):
            ca, cb, top = merged.pop(r)
            if r == at and split_a is not None:
                sa, sb = sorted_pairs(ca, cb)
                k = bisect_right(sa, split_a)
                low._push_sorted(sa[:k], sb[:k])
                high._push_sorted(sa[k:], sb[k:])
                continue
            dst = low if at is None or r < at else high
            dst._push_range(ca, cb, top, shift, cap)
        return low, high

    def _push_range(self, ca: array[int], cb: array[int], top: tuple[int, int], shift: int, cap: int) -> None:
        """Append the pairs of one range (unsorted, all after the list's largest; `top`
        the largest): one unsorted chunk if at most `cap`, else the range cut by the next
        bits of a into finer ranges (two parts' ranges joined on a grid coarser than
        either's hold up to four times a bulk build's), each so pushed; sorted chunks if
        its a's are too close for that."""
        if len(ca) <= cap:
            self._push(ca, cb, top[0], top[1], True)
            return
        finer = pair_ranges(ca, cb, shift - 2) if shift >= 2 else None
        if finer is None or len(finer.rs) < 2:
            self._push_sorted(*sorted_pairs(ca, cb))
            return
        for fa, fb, ftop in zip(finer.as_, finer.bs, finer.tops, strict=True):
            self._push_range(fa, fb, ftop, finer.shift, cap)

    def _push_sorted(self, a: array[int], b: array[int]) -> None:
        """Append sorted pairs, all after the list's largest, as sorted chunks of LOAD."""
        m = len(a)
        for j in range(0, m, LOAD):
            e = min(m, j + LOAD)
            self._push(a[j:e], b[j:e], a[e - 1], b[e - 1], False)

    @classmethod
    def _split_sorted(cls, a: array[int], b: array[int], split_a: int | None) -> tuple[PairList, PairList]:
        """(`from_sorted` of the sorted pairs whose a is <= `split_a`, of the others)."""
        k = len(a) if split_a is None else bisect_right(a, split_a)
        return cls.from_sorted(a[:k], b[:k]), cls.from_sorted(a[k:], b[k:])

    def _push_keys(self, ck: array[int], in_order: bool, cap: int, b_bits: int, a_bits: int, amin: int,
                   bmin: int) -> None:
        """Append the pairs of the packed keys `ck` (`(a - amin) << b_bits | (b - bmin)`), all
        after the list's largest pair: one unsorted chunk if there are at most `cap` of them
        and `in_order` is false, else sorted chunks of LOAD (sorted here if not `in_order`)."""
        if not ck:
            return
        unsorted = not in_order and len(ck) <= cap
        if not unsorted and not in_order:
            ck = array("Q", sorted(ck))
        m = len(ck)
        ca, cb = array("q"), array("Q")
        _unpack(_words(ck), m, _ones(m), b_bits, a_bits, amin, bmin, ca, cb)
        if unsorted:
            top = max(ck)
            self._push(ca, cb, (top >> b_bits) + amin, (top & ((1 << b_bits) - 1)) + bmin, True)
        else:
            for j in range(0, m, LOAD):  # sorted chunks of LOAD (the last one: at most)
                self._push(ca[j : j + LOAD], cb[j : j + LOAD], ca[min(m, j + LOAD) - 1], cb[min(m, j + LOAD) - 1], False)

    def scale_a(self, factor: int) -> None:
        """Multiply every a by `factor` (>= 1: the pairs' order is kept). ValueError, the
        list unchanged, if an a * factor would not fit in a signed 64-bit integer. Each
        chunk of a's >= 0 is multiplied as the 64-bit words of one int (no carry: every
        product fits in its word), others item by item."""
        if factor < 1:
            raise ValueError("factor must be >= 1")
        if not self._as or factor == 1:
            return
        lowest = min(self._as[0]) if self._unsorted[0] else self._as[0][0]
        if not (-_SIGN <= lowest * factor and self._maxa[-1] * factor < _SIGN):
            raise ValueError("a * factor out of the signed 64-bit range")
        for i, ca in enumerate(self._as):
            if _HOST_LITTLE and (ca[0] >= 0 if not self._unsorted[i] else min(ca) >= 0):
                self._as[i] = array("q")
                self._as[i].frombytes((_words(ca) * factor).to_bytes(8 * len(ca), "little"))
            else:
                self._as[i] = array("q", map(factor.__mul__, ca))
        self._maxa = [x * factor for x in self._maxa]

    def merged_unsorted(self, a: Sequence[int], b: Sequence[int]) -> PairList:
        """A new list of this list's pairs and those of `zip(a, b)` (none of them in this
        list), built as `from_unsorted` builds one: a bulk load's union of two large sets
        of pairs, where `add_many` would pile pairs bunched in a into a few chunks and sort
        them pair by pair (a rebuild's late timestamp pairs and delayed records). The
        columns are joined by C calls; this list is left as it is."""
        all_a, all_b = array("q"), array("Q")
        for ca, cb in zip(self._as, self._bs, strict=True):
            all_a.extend(ca)
            all_b.extend(cb)
        all_a.extend(a)
        all_b.extend(b)
        return PairList.from_unsorted(all_a, all_b)

    def _push(self, ca: array[int], cb: array[int], top_a: int, top_b: int, unsorted: bool) -> None:
        """Append a chunk whose pairs all follow the list's largest pair; (top_a, top_b):
        its largest pair."""
        self._as.append(ca)
        self._bs.append(cb)
        self._maxa.append(top_a)
        self._maxb.append(top_b)
        self._unsorted.append(unsorted)
        self._len += len(ca)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def _chunk_of(self, a: int, b: int) -> int:
        """The chunk whose range holds (a, b): the first whose largest pair is >= it
        (`len(self._maxa)` if none)."""
        maxa = self._maxa
        i = bisect_left(maxa, a)
        if i < len(maxa) and maxa[i] == a:  # among chunks ending with this a, by b
            i = bisect_left(self._maxb, b, i, bisect_right(maxa, a, i))
        return i

    def _fix(self, i: int) -> None:
        """Sort chunk `i` (marked unsorted), and cut it if longer than 2 * LOAD: chunk `i`
        is then the first of its sorted pieces (the caller finds a pair's chunk again)."""
        pairs = sorted(zip(self._as[i], self._bs[i], strict=True))
        self._as[i] = array("q", map(_first, pairs))
        self._bs[i] = array("Q", map(_second, pairs))
        self._unsorted[i] = False
        if len(pairs) > 2 * LOAD:
            self._cut(i)

    def first(self) -> tuple[int, int]:
        """The smallest pair (IndexError if empty)."""
        ca, cb = self._as[0], self._bs[0]
        if self._unsorted[0]:  # found by two scans, not sorted (a queue's next due time, after each batch)
            a = min(ca)
            return a, min(compress(cb, map(eq, ca, repeat(a))))
        return ca[0], cb[0]

    def first_a(self) -> int:
        return min(self._as[0]) if self._unsorted[0] else self._as[0][0]

    def last(self) -> tuple[int, int]:
        return self._maxa[-1], self._maxb[-1]

    def _append_sorted(self, a: Sequence[int], b: Sequence[int]) -> None:
        """Append pairs that are ascending and all after the last one."""
        n = len(a)
        if not n:
            return
        i = 0
        if self._as:  # top the last chunk up to LOAD
            ca, cb = self._as[-1], self._bs[-1]
            i = min(n, max(0, LOAD - len(ca)))
            if i:
                ca.extend(a[:i])
                cb.extend(b[:i])
                self._maxa[-1], self._maxb[-1] = a[i - 1], b[i - 1]
        while i < n:
            ca = array("q", a[i : i + LOAD])
            cb = array("Q", b[i : i + LOAD])
            self._as.append(ca)
            self._bs.append(cb)
            self._maxa.append(ca[-1])
            self._maxb.append(cb[-1])
            self._unsorted.append(False)
            i += LOAD
        self._len += n

    def add(self, a: int, b: int) -> None:
        """Insert the pair (it must not be in the list)."""
        maxa = self._maxa
        if not maxa or a > maxa[-1] or a == maxa[-1] and b > self._maxb[-1]:
            if maxa and len(self._as[-1]) < 2 * LOAD:
                self._as[-1].append(a)  # after the largest pair: a sorted chunk stays sorted
                self._bs[-1].append(b)
                maxa[-1], self._maxb[-1] = a, b
                self._len += 1
            else:
                self._append_sorted([a], [b])
            return
        i = self._chunk_of(a, b)
        ca, cb = self._as[i], self._bs[i]
        if self._unsorted[i]:  # sorted when next read
            ca.append(a)
            cb.append(b)
            self._len += 1
            if len(ca) > UNSORTED_LOADS * LOAD:
                self._fix(i)
            return
        pos = bisect_left(ca, a)
        if pos < len(ca) and ca[pos] == a:  # among equal a's, by b (no second bisect if a is new)
            pos = bisect_left(cb, b, pos, bisect_right(ca, a, pos))
        ca.insert(pos, a)
        cb.insert(pos, b)
        self._len += 1
        if len(ca) > 2 * LOAD:
            self._cut(i)

    def add_many(self, a: Sequence[int], b: Sequence[int]) -> None:
        """Insert the pairs `zip(a, b)`, in any order (distinct, none in the list). Pairs
        ascending after the last one are appended in order; others are appended to the
        chunk whose range holds them, which is then unsorted (see the module's
        docstring). Same list as `add` of each pair."""
        n = len(a)
        if n != len(b):
            raise ValueError("a and b differ in length")
        if not n:
            return
        maxa, maxb = self._maxa, self._maxb
        # ascending (b's too: a's all equal, e.g. a fair queue's group filled as a block, or
        # ascending ids) and after the last pair: appended in order, nothing to sort
        if ((not maxa or a[0] > maxa[-1] or a[0] == maxa[-1] and b[0] > maxb[-1])
                and all(map(le, a, islice(a, 1, None))) and all(map(lt, b, islice(b, 1, None)))):
            self._append_sorted(a, b)
            return
        if not maxa:
            self._append_sorted(*sorted_pairs(a, b))
            return
        if n == 1:
            self.add(a[0], b[0])
            return
        top_a = max(a)
        if top_a >= maxa[-1]:  # pairs after the last one go to the last chunk: it ends with the largest
            top_b = max(compress(b, map(eq, a, repeat(top_a))))
            if top_a > maxa[-1] or top_b > maxb[-1]:
                maxa[-1], maxb[-1] = top_a, top_b
        idx = list(map(bisect_left, repeat(maxa), a))  # the chunk, unless its largest a is the pair's
        pick = itemgetter(*idx)  # each pair's item of a per-chunk list, as a tuple: one C call (n > 1)
        ties = list(map(eq, pick(maxa), a))
        if True in ties:  # those pairs' chunks by their b's too (priorities with ties: timestamps)
            chunk_of = self._chunk_of
            for j in compress(range(n), ties):
                idx[j] = chunk_of(a[j], b[j])
            pick = itemgetter(*idx)
        as_, unsorted = self._as, self._unsorted
        chunks = pick(as_)
        deque(map(_append, chunks, a), 0)
        deque(map(_append, pick(self._bs), b), 0)
        deque(map(unsorted.__setitem__, idx, repeat(True)), 0)  # a chunk per pair: no set of the touched ones
        self._len += n
        cap = UNSORTED_LOADS * LOAD
        if max(map(len, chunks)) > cap:  # some chunk passed the cap (rare)
            touched = sorted(set(idx))
            for i in reversed(list(compress(touched, map(lt, repeat(cap), map(len, map(as_.__getitem__, touched)))))):
                self._fix(i)

    def _cut(self, i: int) -> None:
        """Cut sorted chunk `i` into chunks of LOAD to 2 * LOAD pairs (at least two)."""
        ca, cb = self._as[i], self._bs[i]
        n = len(ca)
        k = max(2, n // LOAD)
        cuts = [n * j // k for j in range(k + 1)]
        self._as[i : i + 1] = [ca[x:y] for x, y in pairwise(cuts)]
        self._bs[i : i + 1] = [cb[x:y] for x, y in pairwise(cuts)]
        self._maxa[i : i + 1] = [ca[y - 1] for y in cuts[1:]]
        self._maxb[i : i + 1] = [cb[y - 1] for y in cuts[1:]]
        self._unsorted[i : i + 1] = [False] * k

    def _locate(self, a: int, b: int) -> tuple[int, int]:
        """(chunk, position) of the pair, or (-1, -1) if absent."""
        i = self._chunk_of(a, b)
        if i == len(self._maxa):
            return -1, -1
        if self._unsorted[i]:
            self._fix(i)
            i = self._chunk_of(a, b)
        ca, cb = self._as[i], self._bs[i]
        lo = bisect_left(ca, a)
        if lo == len(ca) or ca[lo] != a:
            return -1, -1
        hi = bisect_right(ca, a, lo)
        pos = bisect_left(cb, b, lo, hi)
        if pos == hi or cb[pos] != b:
            return -1, -1
        return i, pos

    def __contains__(self, pair: tuple[int, int]) -> bool:
        return self._locate(*pair)[0] >= 0

    def _drop(self, i: int) -> None:
        del self._as[i], self._bs[i], self._maxa[i], self._maxb[i], self._unsorted[i]

    def remove(self, a: int, b: int) -> None:
        """Remove the pair; ValueError (nothing changed) if it is not in the list."""
        i, pos = self._locate(a, b)
        if i < 0:
            raise ValueError(f"({a}, {b}) not in the list")
        ca, cb = self._as[i], self._bs[i]
        del ca[pos]
        del cb[pos]
        self._len -= 1
        if not ca:
            self._drop(i)
        elif pos == len(ca):
            self._maxa[i], self._maxb[i] = ca[-1], cb[-1]

    def pop_front(self, n: int) -> tuple[list[int], list[int]]:
        """Remove and return the `n` smallest pairs (all if fewer) as (a's, b's), in order."""
        outa: list[int] = []
        outb: list[int] = []
        as_, bs, unsorted = self._as, self._bs, self._unsorted
        while n > 0 and as_:
            if unsorted[0]:
                self._fix(0)
            ca, cb = as_[0], bs[0]
            if len(ca) <= n:
                outa.extend(ca.tolist())
                outb.extend(cb.tolist())
                n -= len(ca)
                self._drop(0)
            else:
                outa.extend(ca[:n].tolist())
                outb.extend(cb[:n].tolist())
                del ca[:n]
                del cb[:n]
                n = 0
        self._len -= len(outa)
        return outa, outb

    def pop_first(self) -> tuple[int, int]:
        """Remove and return the smallest pair (IndexError if empty)."""
        if self._unsorted and self._unsorted[0]:
            self._fix(0)
        ca, cb = self._as[0], self._bs[0]
        a, b = ca.pop(0), cb.pop(0)
        if not ca:
            self._drop(0)
        self._len -= 1
        return a, b

    @staticmethod
    def pop_firsts(lists: Sequence[PairList]) -> tuple[list[int], list[int]]:
        """`pop_first()` of each list, in order (a list may come more than once; none may
        run empty before its last pop), as (a's, b's): one call for a round of a fair
        queue's groups, no method call per pair."""
        outa: list[int] = []
        outb: list[int] = []
        apa, apb = outa.append, outb.append
        for pl in lists:
            if pl._unsorted[0]:
                pl._fix(0)
            ca, cb = pl._as[0], pl._bs[0]
            apa(ca.pop(0))
            apb(cb.pop(0))
            if not ca:
                pl._drop(0)
            pl._len -= 1
        return outa, outb

    def pop_through(self, a_max: int) -> tuple[list[int], list[int]]:
        """Remove and return every pair whose a is <= `a_max`, in order, as (a's, b's)."""
        n = 0
        i = 0
        while i < len(self._maxa):
            if self._maxa[i] <= a_max:
                n += len(self._as[i])
            elif self._unsorted[i]:
                self._fix(i)  # then its first piece is looked at again
                continue
            else:
                n += bisect_right(self._as[i], a_max)
                break
            i += 1
        return self.pop_front(n)

    def islice(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The pairs at positions start..stop-1 (clipped), in order."""
        out: list[tuple[int, int]] = []
        pos = 0
        i = 0
        while i < len(self._as):
            n = len(self._as[i])
            if pos + n > start:
                if self._unsorted[i]:
                    self._fix(i)
                    n = len(self._as[i])  # its first piece
                ca, cb = self._as[i], self._bs[i]
                lo = max(0, start - pos)
                hi = min(n, stop - pos)
                out.extend(zip(ca[lo:hi], cb[lo:hi], strict=True))
            pos += n
            if pos >= stop:
                break
            i += 1
        return out

    def _sorted_chunks(self) -> Iterator[int]:
        """Every chunk's index, in order, each sorted before it is yielded."""
        i = 0
        while i < len(self._as):
            if self._unsorted[i]:
                self._fix(i)
            yield i
            i += 1

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for i in self._sorted_chunks():
            yield from zip(self._as[i], self._bs[i], strict=True)

    def bs(self) -> Iterator[int]:
        """Every b, in the pairs' order."""
        for i in self._sorted_chunks():
            yield from self._bs[i]

    def clear(self) -> None:
        self._as, self._bs, self._maxa, self._maxb, self._len, self._unsorted = [], [], [], [], 0, []

    def nbytes(self) -> int:
        """Bytes held by the arrays' items (not counting over-allocation or headers)."""
        return sum(ca.itemsize * len(ca) + cb.itemsize * len(cb) for ca, cb in zip(self._as, self._bs, strict=True))

    def check(self) -> None:
        """Assert the invariants (tests): chunks non-empty, within 2 * LOAD (unsorted ones:
        UNSORTED_LOADS * LOAD); each chunk's
        pairs above the previous chunk's largest, its largest its `_maxa`/`_maxb` entry,
        and in order unless marked unsorted; length right. Sorts nothing."""
        prev: tuple[int, int] | None = None
        n = 0
        chunks = (self._as, self._bs, self._maxa, self._maxb, self._unsorted)
        assert len({len(x) for x in chunks}) == 1
        for ca, cb, ma, mb, unsorted in zip(*chunks, strict=True):
            assert 0 < len(ca) == len(cb) <= (UNSORTED_LOADS if unsorted else 2) * LOAD
            pairs = list(zip(ca, cb, strict=True))
            assert (prev is None or min(pairs) > prev) and max(pairs) == (ma, mb)
            assert len(set(pairs)) == len(pairs)
            if not unsorted:
                assert pairs == sorted(pairs)
            prev = ma, mb
            n += len(ca)
        assert n == self._len
