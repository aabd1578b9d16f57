"""`SegmentLog`: an append-only log of numbered records in preallocated segment files,
made durable with ONE `fdatasync` per batch (the Raft log's write-ahead log; the state
machine stays in LMDB).

A record is `(index, term, kind, data)`; indexes are consecutive. The log holds records
`first_index() .. last_index()` (empty when `last_index() == first_index() - 1`).

Files, in one directory (0700; every file 0600):
- `<seq:016x>.seg`: a segment. A 32-byte header (magic, format version, the segment's
  sequence number, the index of its first record, flags, CRC-32 of the header), then
  records back to back, then zeros to the end of the file. A segment is created at its
  full size (a new log's first 1 MiB, each next one twice its predecessor up to
  `segment_bytes`, more for a record that does not fit: `posix_fallocate`,
  reading as zeros) and synced before its first record is written (under a temporary
  name, renamed, the directory synced), so writing a record inside it changes no file
  size: the `fdatasync` after a batch flushes the data (and at most the filesystem's
  note that a preallocated block is now written; measured as cheap as writing into a
  zero-filled file: docs/benchmarks.md, "sixth pass").
- A record: u32 BE length of the body, u32 BE CRC-32 of the body, then the body: u64 BE
  index, u64 BE term, u8 kind, data. A length of 0 ends the segment's records.

Invariants (what `open` relies on, what every mutator keeps):
- Segments are ordered by sequence number; each one's first index is the previous one's
  last + 1, except at a *base* segment (flag 1), which starts the log afresh (`reset`):
  older segments are leftovers of the log it replaced and are deleted at open.
- Past its last record, a segment holds zeros to its end: a truncation zeroes the bytes
  it cuts (after deleting, and syncing the deletion of, the newer segments), and a torn
  tail found at open is zeroed likewise.

- `<seq:016x>.idx`: a sealed segment's index, written when the log moves on to a newer
  segment (after the sealed one's records were synced): magic, the segment's sequence
  number, first index, record count and end offset, each record's offset, CRC-32 of it all.
  An open trusts it only for a segment that is not the newest, whose index checks (CRC,
  sequence, first index, offsets within the file, its last record read and checked): else
  the segment is scanned and its index written again. A truncation deletes the index of
  the segment it cuts before cutting it.

At open, the newest segment's records are read up to the first one that is torn or
corrupt (bad length, CRC, or index not the next one): that one and everything after it
were never acknowledged (a batch is acknowledged only after its `fdatasync` returned), so
they are cut. An older segment (complete and synced before a newer one was created) is
not read at open when its index checks (above): a restart reads the newest segment, at
most `segment_bytes`, not the whole log. A bad record in an older segment is damage:
`SegmentLogCorrupt`, at open when the segment is scanned, else when the record is read
(every read checks each record's CRC and index).

Compaction (`drop_before`) deletes whole segments, the oldest first, whose records are
all below the given index; the log's `first_index()` is then the oldest kept segment's
first index (a caller's own compaction point may be past it).

Not thread-safe: one thread mutates; reads must not run during a mutation.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from doq.storage.files import open_private, private_dir

MAGIC = b"DOQWAL\x00\x01"
_HEADER = struct.Struct(">8sQQB3xI")  # magic+version, seq, first index, flags, crc of the rest
HEADER_BYTES = 32
_REC = struct.Struct(">II")  # body length, crc32 of the body
_BODY = struct.Struct(">QQB")  # index, term, kind
FLAG_BASE = 1
DEFAULT_SEGMENT_BYTES = 64 << 20
FIRST_SEGMENT_BYTES = 1 << 20  # a log's first segment; each next one twice the size
_ZEROS = bytes(1 << 20)
SUFFIX = ".seg"
IDX_SUFFIX = ".idx"
IDX_MAGIC = b"DOQWIX\x00\x01"
_IDX = struct.Struct(">8sQQQQ")  # magic+version, seq, first index, record count, end offset
_CRC = struct.Struct(">I")

Record = tuple[int, int, int, bytes]  # index, term, kind, data


class SegmentLogCorrupt(Exception):
    """A segment other than the newest one, or a segment header, is damaged (not a torn
    tail): the log cannot be trusted as it is."""


@dataclass(slots=True)
class _Segment:
    seq: int
    first: int
    base: bool
    path: Path
    fd: int
    size: int  # the file's size (preallocated)
    end: int  # byte offset just past the last record
    offsets: array = field(default_factory=lambda: array("Q"))  # offset of record first+i

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 1

    @property
    def idx_path(self) -> Path:
        return self.path.with_suffix(IDX_SUFFIX)


def _be_offsets(offsets: array) -> bytes:
    """`offsets` as u64 big-endian."""
    out = array("Q", offsets)
    if sys.byteorder == "little":
        out.byteswap()
    return out.tobytes()


def _encode_index(s: _Segment) -> bytes:
    raw = _IDX.pack(IDX_MAGIC, s.seq, s.first, len(s.offsets), s.end) + _be_offsets(s.offsets)
    return raw + _CRC.pack(zlib.crc32(raw))


def _decode_index(raw: bytes, s: _Segment) -> array | None:
    """The record offsets `raw` (an index file) holds for `s`, or None if it does not fit
    `s` (damaged, stale or another segment's)."""
    if len(raw) < _IDX.size + _CRC.size or zlib.crc32(raw[:-_CRC.size]) != _CRC.unpack_from(raw, len(raw) - 4)[0]:
        return None
    magic, seq, first, count, end = _IDX.unpack_from(raw)
    if magic != IDX_MAGIC or seq != s.seq or first != s.first or count == 0 \
            or len(raw) != _IDX.size + 8 * count + _CRC.size or not HEADER_BYTES < end <= s.size:
        return None
    offsets = array("Q")
    offsets.frombytes(raw[_IDX.size : -_CRC.size])
    if sys.byteorder == "little":
        offsets.byteswap()
    if offsets[0] != HEADER_BYTES or offsets[-1] >= end:
        return None
    return offsets


def encode_record(index: int, term: int, kind: int, data: bytes) -> bytes:
    body = _BODY.pack(index, term, kind) + data
    return _REC.pack(len(body), zlib.crc32(body)) + body


def _header(seq: int, first: int, base: bool) -> bytes:
    flags = FLAG_BASE if base else 0
    raw = _HEADER.pack(MAGIC, seq, first, flags, 0)
    crc = zlib.crc32(raw[: _HEADER.size - 4])
    return _HEADER.pack(MAGIC, seq, first, flags, crc).ljust(HEADER_BYTES, b"\0")


def _parse_header(raw: bytes, path: Path) -> tuple[int, int, bool]:
    if len(raw) < HEADER_BYTES:
        raise SegmentLogCorrupt(f"{path.name}: short header")
    magic, seq, first, flags, crc = _HEADER.unpack_from(raw)
    if magic != MAGIC or zlib.crc32(raw[: _HEADER.size - 4]) != crc:
        raise SegmentLogCorrupt(f"{path.name}: bad segment header")
    return seq, first, bool(flags & FLAG_BASE)


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _check_records(buf: bytes, off: int, first: int, count: int, s: _Segment) -> int:
    """The offset in `buf` just past `count` whole records from `off`, the first of index
    `first`, each with its CRC; -1 if one is cut, damaged or out of order."""
    view = memoryview(buf)
    for expect in range(first, first + count):
        if off + _REC.size > len(buf):
            return -1
        length, crc = _REC.unpack_from(buf, off)
        start = off + _REC.size
        if length < _BODY.size or start + length > len(buf) or zlib.crc32(view[start : start + length]) != crc \
                or _BODY.unpack_from(buf, start)[0] != expect:
            return -1
        off = start + length
    return off


def _write_index(s: _Segment) -> None:
    """Write `s`'s index file (under a temporary name, synced, renamed). Best effort: an
    index that could not be written (a full disk), or is lost or damaged, only makes the
    next open scan the segment."""
    tmp = s.idx_path.with_name(s.idx_path.name + ".tmp")
    try:
        fd = open_private(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            _write_all(fd, _encode_index(s), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, s.idx_path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _remove(s: _Segment) -> None:
    """Close and delete segment `s` and its index (not synced)."""
    os.close(s.fd)
    s.idx_path.unlink(missing_ok=True)
    s.path.unlink()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentLog:
    """See the module docstring. `open` the directory (created if missing); an empty
    directory gives an empty log whose first record will be `start_index`."""

    def __init__(self, path: str | os.PathLike[str], *, start_index: int = 1,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.path = private_dir(path)
        self.segment_bytes = max(segment_bytes, HEADER_BYTES + 4096)
        self._segs: list[_Segment] = []
        self._dirty: set[int] = set()  # seqs of segments written since the last sync
        self.synced_last = 0  # the last index made durable by `sync` (or found at open)
        self.cut_records = 0  # torn or corrupt tail records cut at open (for tests, logs)
        self._open(start_index)

    # -- open --------------------------------------------------------------------------
    def _open(self, start_index: int) -> None:
        for p in self.path.iterdir():
            if p.name.endswith(".tmp"):  # a segment or index being created when the process died
                p.unlink()
        names = sorted(p for p in self.path.iterdir() if p.name.endswith(SUFFIX))
        seg_names = {p.with_suffix(IDX_SUFFIX).name for p in names}
        for p in self.path.iterdir():
            if p.name.endswith(IDX_SUFFIX) and p.name not in seg_names:  # its segment was deleted
                p.unlink()
        found: list[_Segment] = []
        for p in names:
            fd = open_private(p, os.O_RDWR)
            try:
                seq, first, base = _parse_header(os.pread(fd, HEADER_BYTES, 0), p)
            except BaseException:
                os.close(fd)
                raise
            found.append(_Segment(seq, first, base, p, fd, os.fstat(fd).st_size, HEADER_BYTES))
        found.sort(key=lambda s: s.seq)
        # keep the newest run of segments back to the newest base segment
        keep_from = 0
        for i in range(len(found) - 1, -1, -1):
            if found[i].base:
                keep_from = i
                break
        for s in found[:keep_from]:
            _remove(s)
        segs = found[keep_from:]
        for i, s in enumerate(segs):
            newest = i == len(segs) - 1
            if newest:
                s.idx_path.unlink(missing_ok=True)  # (a truncated segment's, if its deletion was lost)
                self._scan(s, newest=True)
            elif not self._load_index(s):
                self._scan(s, newest=False)
                _write_index(s)
            if i > 0 and s.first != segs[i - 1].last + 1:
                raise SegmentLogCorrupt(f"{s.path.name}: starts at {s.first}, after {segs[i - 1].last}")
        self._segs = segs
        if not segs:
            self._new_segment(start_index, base=True)
        elif keep_from:
            _fsync_dir(self.path)
        self.synced_last = self.last_index()

    def _load_index(self, s: _Segment) -> bool:
        """Take `s`'s record offsets from its index file if that fits `s` (its last record
        read back and checked too); False if it is missing or does not fit."""
        try:
            raw = s.idx_path.read_bytes()
        except FileNotFoundError:
            return False
        offsets = _decode_index(raw, s)
        if offsets is None:
            return False
        _, end = _IDX.unpack_from(raw)[3:5]
        last = s.first + len(offsets) - 1
        tail = os.pread(s.fd, end - offsets[-1], offsets[-1])
        if _check_records(tail, 0, last, 1, s) != len(tail):
            return False
        s.offsets = offsets
        s.end = end
        return True

    def _scan(self, s: _Segment, *, newest: bool) -> None:
        """Index `s`'s records; cut (zero) a torn tail of the newest segment."""
        with open(s.path, "rb") as f:
            buf = f.read()
        view = memoryview(buf)
        off = HEADER_BYTES
        expect = s.first
        offsets = s.offsets
        n = len(buf)
        bad = False
        while off + _REC.size <= n:
            length, crc = _REC.unpack_from(view, off)
            if length == 0:
                break
            start = off + _REC.size
            if length < _BODY.size or start + length > n:
                bad = True
                break
            body = view[start : start + length]
            if zlib.crc32(body) != crc or _BODY.unpack_from(body)[0] != expect:
                bad = True
                break
            offsets.append(off)
            off = start + length
            expect += 1
        s.end = off
        # zeros expected past the last record (counted in place: no copy of the segment)
        dirty_end = off if buf.count(0, off) == n - off else len(buf.rstrip(b"\0"))
        if bad or dirty_end > off:
            if not newest:
                raise SegmentLogCorrupt(f"{s.path.name}: damaged record at byte {off}")
            self.cut_records += 1
            self._zero_from(s, off, dirty_end)
            os.fdatasync(s.fd)

    def _zero_from(self, s: _Segment, off: int, end: int) -> None:
        """Zero bytes [off, end) of `s` (not synced)."""
        while off < end:
            chunk = min(len(_ZEROS), end - off)
            _write_all(s.fd, _ZEROS[:chunk], off)
            off += chunk

    def _new_segment(self, first: int, *, base: bool, min_bytes: int = 0) -> _Segment:
        """Create the next segment (zero-filled to its full size and synced under a
        temporary name, renamed, the directory synced)."""
        seq = self._segs[-1].seq + 1 if self._segs else 1
        if self._segs and not base:  # twice the previous one's size, up to segment_bytes
            nominal = min(self.segment_bytes, 2 * self._segs[-1].size)
        else:  # a new log starts small: an idle node, a small disk hold little
            nominal = min(self.segment_bytes, FIRST_SEGMENT_BYTES)
        size = max(nominal, HEADER_BYTES + min_bytes)
        path = self.path / f"{seq:016x}{SUFFIX}"
        tmp = path.with_name(path.name + ".tmp")
        fd = open_private(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            os.posix_fallocate(fd, 0, size)
            _write_all(fd, _header(seq, first, base), 0)
            os.fsync(fd)
            os.rename(tmp, path)
            _fsync_dir(self.path)
        except BaseException:
            os.close(fd)
            raise
        s = _Segment(seq, first, base, path, fd, size, HEADER_BYTES)
        self._segs.append(s)
        return s

    # -- read side ---------------------------------------------------------------------
    def first_index(self) -> int:
        return self._segs[0].first

    def last_index(self) -> int:
        return self._segs[-1].last

    def segment_count(self) -> int:
        return len(self._segs)

    def _seg_of(self, index: int) -> int:
        """Position in `_segs` of the segment holding `index` (which must be held)."""
        segs = self._segs
        lo, hi = 0, len(segs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if segs[mid].first <= index:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Record]:
        """Records `[lo, hi)` (clipped to what the log holds), stopping before the data
        would exceed `max_bytes` (at least one record)."""
        lo = max(lo, self.first_index())
        hi = min(hi, self.last_index() + 1)
        out: list[Record] = []
        total = 0
        i = self._seg_of(lo) if lo < hi else len(self._segs)
        while lo < hi and i < len(self._segs):
            s = self._segs[i]
            stop = min(hi, s.last + 1)
            if stop > lo:
                a = s.offsets[lo - s.first]
                b = s.offsets[stop - s.first] if stop <= s.last else s.end
                buf = os.pread(s.fd, b - a, a)
                view = memoryview(buf)
                off = 0
                for expect in range(lo, stop):
                    length, crc = _REC.unpack_from(buf, off)
                    start = off + _REC.size
                    index, term, kind = _BODY.unpack_from(buf, start)
                    if index != expect or zlib.crc32(view[start : start + length]) != crc:
                        raise SegmentLogCorrupt(f"{s.path.name}: damaged record {expect} at byte {a + off}")
                    data = buf[start + _BODY.size : start + length]
                    total += len(data)
                    if out and max_bytes is not None and total > max_bytes:
                        return out
                    out.append((index, term, kind, data))
                    off = start + length
                lo = stop
            i += 1
        return out

    def kinds(self, lo: int, hi: int) -> bytes:
        """The kind of each record `[lo, hi)` (clipped as `read`), one byte per record,
        each read alone at its offset: no record's data is read (a restarted core's check
        for a membership change among the entries since its snapshot)."""
        lo = max(lo, self.first_index())
        hi = min(hi, self.last_index() + 1)
        out = bytearray()
        at = _REC.size + _BODY.size - 1  # the kind: the body's last fixed byte
        i = self._seg_of(lo) if lo < hi else len(self._segs)
        while lo < hi and i < len(self._segs):
            s = self._segs[i]
            stop = min(hi, s.last + 1)
            for k in range(lo - s.first, stop - s.first):
                out += os.pread(s.fd, 1, s.offsets[k] + at)
            lo = max(lo, stop)
            i += 1
        return bytes(out)

    # -- write side --------------------------------------------------------------------
    def append(self, records: Sequence[Record]) -> None:
        """Write `records` (consecutive indexes), after cutting every record at or after
        the first one's index (a conflicting suffix); not durable until `sync`. The first
        index must be within `first_index() .. last_index() + 1`."""
        if not records:
            return
        start = records[0][0]
        if start < self.first_index() or start > self.last_index() + 1:
            raise ValueError(f"append at {start}: the log holds {self.first_index()}..{self.last_index()}")
        if start <= self.last_index():
            self.truncate_from(start)
        s = self._segs[-1]
        batch: list[bytes] = []
        batch_start = s.end
        pos = s.end
        for index, term, kind, data in records:
            rec = encode_record(index, term, kind, data)
            if pos + len(rec) > s.size:
                if batch:
                    self._write(s, batch, batch_start)
                    batch = []
                self._dirty.add(s.seq)
                self.sync()  # the full segment's records are durable before a newer one exists
                _write_index(s)  # (synced by the new segment's directory sync)
                s = self._new_segment(index, base=False, min_bytes=len(rec))
                batch_start = pos = s.end
            batch.append(rec)
            s.offsets.append(pos)
            pos += len(rec)
        self._write(s, batch, batch_start)

    def _write(self, s: _Segment, batch: list[bytes], offset: int) -> None:
        data = b"".join(batch)
        _write_all(s.fd, data, offset)
        s.end = offset + len(data)
        self._dirty.add(s.seq)

    def sync(self) -> None:
        """Make every record appended so far durable (one `fdatasync` per segment written
        since the last sync: one, unless a batch crossed into a new segment)."""
        if not self._dirty:
            return
        for s in self._segs:
            if s.seq in self._dirty:
                os.fdatasync(s.fd)
        self._dirty.clear()
        self.synced_last = self.last_index()

    def truncate_from(self, index: int) -> None:
        """Remove records `index ..` (durably: the newer segments' deletion is synced,
        then the cut bytes are zeroed and synced). `index` at `first_index()` empties the
        log (its next record is then `index`)."""
        if index > self.last_index():
            return
        if index < self.first_index():
            raise ValueError(f"truncate at {index}: the log starts at {self.first_index()}")
        i = self._seg_of(index)
        gone = self._segs[i + 1 :]
        s = self._segs[i]
        if gone or s.idx_path.exists():
            for g in reversed(gone):  # the newest first: a crash leaves a contiguous prefix
                _remove(g)
                self._dirty.discard(g.seq)
            del self._segs[i + 1 :]
            s.idx_path.unlink(missing_ok=True)  # before its records are cut
            _fsync_dir(self.path)
        cut = s.offsets[index - s.first]
        old_end = s.end
        del s.offsets[index - s.first :]
        s.end = cut
        self._zero_from(s, cut, old_end)
        os.fdatasync(s.fd)
        self._dirty.discard(s.seq)
        self.synced_last = min(self.synced_last, self.last_index())

    def reset(self, next_index: int) -> None:
        """Replace the whole log by an empty one whose next record is `next_index` (a
        snapshot installed): a new base segment first (synced), then the old ones go."""
        old = list(self._segs)
        self._new_segment(next_index, base=True)
        for s in old:
            _remove(s)
            self._dirty.discard(s.seq)
        del self._segs[: len(old)]
        _fsync_dir(self.path)
        self.synced_last = self.last_index()

    def used_bytes(self) -> int:
        """Bytes of records (and headers) in the segment files."""
        return sum(s.end for s in self._segs)

    def droppable_before(self, index: int) -> int:
        """How many segments `drop_before(index)` would delete."""
        n = 0
        while n < len(self._segs) - 1 and self._segs[n].last < index:
            n += 1
        return n

    def drop_before(self, index: int) -> int:
        """Delete the oldest segments whose records are all below `index` (never the
        newest); returns how many were deleted."""
        n = 0
        while len(self._segs) > 1 and self._segs[0].last < index:
            s = self._segs.pop(0)
            _remove(s)
            self._dirty.discard(s.seq)
            n += 1
        if n:
            _fsync_dir(self.path)
        return n

    def close(self) -> None:
        for s in self._segs:
            os.close(s.fd)
        self._segs = []

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
