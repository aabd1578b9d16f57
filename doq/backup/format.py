"""The doq backup file format (byte layout documented in docs/backup.md).

    preamble (16 B) | header (protobuf) | header CRC-32 (4 B)
    frame 0 | frame 1 | ...           each an independent zstd frame of length-delimited
                                      `BackupRecord` protobufs
    footer (protobuf: frame index, totals)
    trailer (32 B): footer offset, footer length, footer CRC-32, format version, end magic

`BackupWriter` streams (memory bounded by one frame); `BackupReader` validates every
checksum and count and raises `BackupFormatError` (an `InvalidArgument`) with a stable
reason; `read_frame(file, entry)` decodes one frame given only its index entry, so a job
can split a file across tasks by frame.

A record is a tuple `(key, value, version)` where `value is None` means a tombstone.
"""

from __future__ import annotations

import concurrent.futures
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import zstandard
from doq_proto.v1 import backup_pb2 as pb

from doq.storage import digest
from doq.storage.recordio import (
    _NVAR,
    _VAR,
    MAX_FRAME_BYTES,
    BackupFormatError,
    Record,
    _decode_records,
    _strip_len,
    _varint,
    encode_record,
)

MAGIC = b"DOQBAK1\n"
END_MAGIC = b"DOQBAKE\n"
FORMAT_VERSION = 1
COMPRESSION = "zstd"
PREAMBLE = struct.Struct("<8sHHI")  # magic, format version, flags, header length
TRAILER = struct.Struct("<QQIHH8s")  # footer offset, footer length, footer crc, version, reserved, end magic
CRC = struct.Struct("<I")
DEFAULT_FRAME_BYTES = 2 * 1024 * 1024  # uncompressed bytes per frame (target)
MAX_HEADER_BYTES = 1024 * 1024
DEFAULT_LEVEL = 3


@dataclass(frozen=True, slots=True)
class BackupHeader:
    """What a file says about itself (from the header)."""

    cluster_id: str
    node_id: str
    from_version: int  # records with version >= from_version (the request's `since`)
    to_version: int  # snapshot point: every change with version <= to_version is covered
    created_at_ms: int
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class FrameEntry:
    """One frame of the index: enough to read and verify the frame on its own."""

    offset: int
    length: int
    uncompressed_length: int
    record_count: int
    first_version: int
    last_version: int
    crc32: int


@dataclass(frozen=True, slots=True)
class BackupSummary:
    """Totals of a file (from the footer; `BackupWriter.close` returns the same)."""

    header: BackupHeader
    frames: tuple[FrameEntry, ...]
    record_count: int
    tombstone_count: int
    last_version: int  # greatest version contained; max(from_version - 1, 0) if empty
    uncompressed_bytes: int
    file_bytes: int
    # doq.storage.digest of the node's whole state at header.to_version; None when the
    # file does not record one (written before digests existed, or by a caller without one)
    state_digest: int | None = None
    footer_offset: int = 0


# -- writer -------------------------------------------------------------------------------
class BackupWriter:
    """Stream records into a backup file; call `close()` to write the footer.

    Records must come in non-decreasing version order, each with
    from_version <= version <= to_version. `out` needs only `write` (no seek).
    Memory is bounded by one frame (`frame_bytes` uncompressed).
    """

    def __init__(
        self,
        out: BinaryIO,
        *,
        from_version: int,
        to_version: int,
        cluster_id: str = "",
        node_id: str = "",
        created_at_ms: int | None = None,
        frame_bytes: int = DEFAULT_FRAME_BYTES,
        level: int = DEFAULT_LEVEL,
        state_digest: int | None = None,
    ) -> None:
        """`state_digest`: the digest (doq.storage.digest) of the source's whole state at
        `to_version`, recorded in the footer (None: not recorded)."""
        if from_version < 0 or to_version < 0:
            raise ValueError("versions must be >= 0")
        if state_digest is not None and not 0 <= state_digest < 2**256:
            raise ValueError("state_digest must be within 0..2**256-1")
        self._state_digest = state_digest
        if not 0 < frame_bytes <= MAX_FRAME_BYTES // 2:
            raise ValueError(f"frame_bytes must be in (0, {MAX_FRAME_BYTES // 2}]")
        self._out = out
        self._frame_bytes = frame_bytes
        self._offset = 0
        self._cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
        self.header = BackupHeader(
            cluster_id, node_id, from_version, to_version,
            int(time.time() * 1000) if created_at_ms is None else created_at_ms,
        )
        body = pb.BackupHeader(
            cluster_id=cluster_id, node_id=node_id, from_version=from_version,
            to_version=to_version, created_at_ms=self.header.created_at_ms, compression=COMPRESSION,
        ).SerializeToString()
        head = PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(body)) + body
        self._header_crc = zlib.crc32(head)
        self._write(head + CRC.pack(self._header_crc))
        self._parts: list[bytes] = []
        self._size = 0
        self._count = 0
        self._first = 0
        self._last_seen = from_version
        self._frames: list[FrameEntry] = []
        self._records = 0
        self._tombstones = 0
        self._uncompressed = 0
        self._last_version = max(from_version - 1, 0)
        self._closed = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: tuple[concurrent.futures.Future[tuple[bytes, int]], tuple[int, int, int, int]] | None = None

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._offset += len(data)

    def add(self, key: bytes, value: bytes | None, version: int) -> None:
        """Append one record (value None = tombstone)."""
        self.add_many(((key, value, version),))

    def add_many(self, records: Iterable[Record]) -> None:
        """Append records in order. The hot loop of a backup: kept flat on purpose."""
        var = _VAR
        parts = self._parts
        app = parts.append
        size, count, tombs = self._size, self._count, self._tombstones
        last, top, limit = self._last_seen, self.header.to_version, self._frame_bytes
        vv = _varint(last)
        try:
            for key, value, version in records:
                if version != last or version > top:
                    if version < last or version > top:
                        raise ValueError(
                            f"record version {version} out of order or outside "
                            f"[{self.header.from_version}, {top}]"
                        )
                    last = version
                    vv = var[version] if version < _NVAR else _varint(version)
                if not count:
                    self._first = version
                lk = len(key)
                if value is None:
                    tombs += 1
                    if lk and lk < _NVAR and version:
                        body = b"\x0a%b%b\x18%b\x20\x01" % (var[lk], key, vv)
                    else:
                        body = _strip_len(encode_record(key, value, version))
                else:
                    lv = len(value)
                    if lk and lv and lk < _NVAR and lv < _NVAR and version:
                        body = b"\x0a%b%b\x12%b%b\x18%b" % (var[lk], key, var[lv], value, vv)
                    else:
                        body = _strip_len(encode_record(key, value, version))
                n = len(body)
                head = var[n] if n < _NVAR else _varint(n)
                app(head)
                app(body)
                size += len(head) + n
                count += 1
                if size >= limit:
                    self._size, self._count, self._tombstones, self._last_seen = size, count, tombs, last
                    self._flush()
                    parts = self._parts
                    app = parts.append
                    size = count = 0
        finally:
            self._size, self._count, self._tombstones, self._last_seen = size, count, tombs, last

    def _flush(self) -> None:
        """Hand the current frame to the compressor thread; write the previous one.

        zstd and CRC-32 release the GIL, so compressing frame N overlaps encoding frame
        N+1; at most two frames are in memory.
        """
        if not self._count:
            return
        raw = b"".join(self._parts)
        meta = (len(raw), self._count, self._first, self._last_seen)
        self._records += self._count
        self._uncompressed += len(raw)
        self._last_version = self._last_seen
        self._parts = []
        self._size = 0
        self._count = 0
        self._drain()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="doq-backup-zstd")
        self._pending = (self._pool.submit(self._compress, raw), meta)

    def _compress(self, raw: bytes) -> tuple[bytes, int]:
        comp = self._cctx.compress(raw)
        return comp, zlib.crc32(comp)

    def _drain(self) -> None:
        """Write the frame being compressed, if any."""
        if self._pending is None:
            return
        fut, (raw_len, count, first, last) = self._pending
        self._pending = None
        comp, crc = fut.result()
        self._frames.append(FrameEntry(self._offset, len(comp), raw_len, count, first, last, crc))
        self._write(comp)

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def close(self, *, state_digest: int | None = None) -> BackupSummary:
        """Flush the last frame, write footer and trailer; returns the file's totals.
        `state_digest`: as for the constructor, when it is known only after the records."""
        if self._closed:
            raise ValueError("backup writer already closed")
        if state_digest is not None:
            if not 0 <= state_digest < 2**256:
                raise ValueError("state_digest must be within 0..2**256-1")
            self._state_digest = state_digest
        try:
            self._flush()
            self._drain()
        finally:
            self._shutdown()
        self._closed = True
        footer = pb.BackupFooter(
            frames=[pb.FrameIndexEntry(
                offset=f.offset, length=f.length, uncompressed_length=f.uncompressed_length,
                record_count=f.record_count, first_version=f.first_version,
                last_version=f.last_version, crc32=f.crc32,
            ) for f in self._frames],
            record_count=self._records, tombstone_count=self._tombstones,
            last_version=self._last_version, uncompressed_bytes=self._uncompressed,
            header_crc32=self._header_crc,
            state_digest=b"" if self._state_digest is None else digest.to_bytes(self._state_digest),
        ).SerializeToString()
        footer_offset = self._offset
        self._write(footer)
        self._write(TRAILER.pack(footer_offset, len(footer), zlib.crc32(footer), FORMAT_VERSION, 0, END_MAGIC))
        return BackupSummary(
            self.header, tuple(self._frames), self._records, self._tombstones,
            self._last_version, self._uncompressed, self._offset, self._state_digest, footer_offset,
        )

    def __enter__(self) -> BackupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and not self._closed:
            self.close()
        else:
            self._shutdown()


def write_records(out: BinaryIO, records: Iterable[Record], **header: object) -> BackupSummary:
    """Write a whole file from an iterable (keyword arguments as for `BackupWriter`)."""
    w = BackupWriter(out, **header)  # type: ignore[arg-type]
    w.add_many(records)
    return w.close()


# -- reader -------------------------------------------------------------------------------
def _read_exact(f: BinaryIO, offset: int, n: int, what: str) -> bytes:
    f.seek(offset)
    data = f.read(n)
    if len(data) != n:
        raise BackupFormatError("TRUNCATED", f"truncated backup file: {what} ends past end of file",
                                offset=offset + len(data))
    return data


def read_frame(f: BinaryIO, entry: FrameEntry) -> list[Record]:
    """Read, verify (CRC, sizes, counts, versions) and decode one frame (random access)."""
    where = f"frame at offset {entry.offset}"
    at = entry.offset
    comp = _read_exact(f, entry.offset, entry.length, where)
    if zlib.crc32(comp) != entry.crc32:
        raise BackupFormatError("CHECKSUM_MISMATCH", f"{where}: CRC-32 mismatch (corrupted data)", offset=at)
    if entry.uncompressed_length > MAX_FRAME_BYTES:
        raise BackupFormatError("CORRUPT", f"{where}: frame too large ({entry.uncompressed_length} B)", offset=at)
    try:
        raw = zstandard.ZstdDecompressor().decompress(comp, max_output_size=entry.uncompressed_length)
    except zstandard.ZstdError as e:
        raise BackupFormatError("CORRUPT", f"{where}: zstd decompression failed: {e}", offset=at) from e
    if len(raw) != entry.uncompressed_length:
        raise BackupFormatError("CORRUPT", f"{where}: decompressed size differs from the index", offset=at)
    try:
        records = list(_decode_records(raw, where))
    except BackupFormatError as e:
        e.offset = at
        raise
    if len(records) != entry.record_count:
        raise BackupFormatError("CORRUPT", f"{where}: {len(records)} records, index says {entry.record_count}",
                                offset=at)
    versions = [r[2] for r in records]
    if versions and (versions[0] != entry.first_version or versions[-1] != entry.last_version
                     or any(a > b for a, b in zip(versions, versions[1:], strict=False))):
        raise BackupFormatError("CORRUPT", f"{where}: record versions disagree with the index", offset=at)
    return records


def read_header(f: BinaryIO) -> BackupHeader:
    """Only the preamble and header of a file (checked: magic, version, header CRC), e.g. to
    check a chain's order when a file's footer is damaged. Raises BackupFormatError."""
    f.seek(0, 2)
    return _read_header(f, f.tell())[0]


def _bytes_after_end(f: BinaryIO, size: int, frames_start: int, window: int = 1 << 20) -> int:
    """How many bytes follow the last whole trailer in the last `window` bytes of the file
    (0 if there is none: the file was cut, not appended to)."""
    lo = max(frames_start, size - window)
    f.seek(lo)
    tail = f.read(size - lo)
    at = tail.rfind(END_MAGIC)
    while at != -1:
        end = lo + at + len(END_MAGIC)
        start = end - TRAILER.size
        if start >= frames_start:
            foff, flen, _, _, _, _ = TRAILER.unpack(tail[start - lo:end - lo])
            if foff >= frames_start and foff + flen + TRAILER.size == end:
                return size - end
        at = tail.rfind(END_MAGIC, 0, at)
    return 0


def _read_header(f: BinaryIO, size: int) -> tuple[BackupHeader, int, int]:
    """(header, header CRC-32, offset of the first frame) of a file of `size` bytes."""
    f.seek(0)
    pre = f.read(PREAMBLE.size)
    if len(pre) < len(MAGIC) or pre[: len(MAGIC)] != MAGIC:
        if MAGIC.startswith(pre[: len(MAGIC)]) and len(pre) < len(MAGIC):
            raise BackupFormatError("TRUNCATED", f"truncated backup file ({size} bytes)", offset=size)
        raise BackupFormatError("BAD_MAGIC", "not a doq backup file (wrong magic)", offset=0)
    if len(pre) < PREAMBLE.size:
        raise BackupFormatError("TRUNCATED", f"truncated backup file ({size} bytes)", offset=size)
    _, version, flags, hlen = PREAMBLE.unpack(pre)
    if version != FORMAT_VERSION:
        raise BackupFormatError("UNSUPPORTED_VERSION", f"unsupported backup format version {version}",
                                offset=len(MAGIC))
    if flags != 0 or hlen > MAX_HEADER_BYTES:
        raise BackupFormatError("CORRUPT", "corrupt backup header (flags or length)", offset=len(MAGIC) + 2)
    rest = _read_exact(f, PREAMBLE.size, hlen + CRC.size, "header")
    body = rest[:hlen]
    header_crc = zlib.crc32(pre + body)
    if CRC.unpack(rest[hlen:])[0] != header_crc:
        raise BackupFormatError("CHECKSUM_MISMATCH", "backup header CRC-32 mismatch", offset=0)
    try:
        h = pb.BackupHeader.FromString(body)
    except Exception as e:
        raise BackupFormatError("CORRUPT", f"undecodable backup header: {e}", offset=PREAMBLE.size) from e
    if h.compression != COMPRESSION:
        raise BackupFormatError("CORRUPT", f"unknown compression {h.compression!r}", offset=PREAMBLE.size)
    header = BackupHeader(h.cluster_id, h.node_id, h.from_version, h.to_version, h.created_at_ms, version)
    return header, header_crc, PREAMBLE.size + hlen + CRC.size


class BackupReader:
    """Open a backup from a seekable binary file; validates preamble, header and footer.

    Frames are verified when read (`records()`, `frames()` or `read_frame`). `verify()`
    reads everything and checks the totals.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        f.seek(0, 2)
        size = f.tell()
        self.header, header_crc, frames_start = _read_header(f, size)
        version = self.header.format_version

        if size < frames_start + TRAILER.size:
            raise BackupFormatError("TRUNCATED", "truncated backup file: no trailer", offset=size)
        at = size - TRAILER.size
        tr = _read_exact(f, at, TRAILER.size, "trailer")
        foff, flen, fcrc, tversion, reserved, end = TRAILER.unpack(tr)
        if end != END_MAGIC:
            extra = _bytes_after_end(f, size, frames_start)
            if extra:
                raise BackupFormatError("CORRUPT", f"{extra} bytes of other data after the end of the backup "
                                                   "(appended to the file?)", offset=size - extra)
            raise BackupFormatError("TRUNCATED", "truncated backup file: no trailer (end magic missing)", offset=at)
        # each condition its own message: the one real cause
        if tversion != version:
            raise BackupFormatError("CORRUPT", f"backup trailer's format version {tversion} differs from the "
                                               f"header's {version}", offset=at + 20)
        if reserved != 0:
            raise BackupFormatError("CORRUPT", f"backup trailer's reserved field is {reserved}, not 0", offset=at + 22)
        if foff < frames_start or foff + flen + TRAILER.size != size:
            raise BackupFormatError("CORRUPT", f"backup trailer points outside the file: footer at {foff}, "
                                               f"{flen} bytes, in a file of {size} bytes", offset=at)
        fbytes = _read_exact(f, foff, flen, "footer")
        if zlib.crc32(fbytes) != fcrc:
            raise BackupFormatError("CHECKSUM_MISMATCH", "backup footer CRC-32 mismatch", offset=foff)
        try:
            ft = pb.BackupFooter.FromString(fbytes)
        except Exception as e:
            raise BackupFormatError("CORRUPT", f"undecodable backup footer: {e}", offset=foff) from e
        if ft.header_crc32 != header_crc:
            raise BackupFormatError("CORRUPT", "footer does not belong to this header", offset=foff)
        try:
            state_digest = digest.from_bytes(ft.state_digest) if ft.state_digest else None
        except ValueError as e:
            raise BackupFormatError("CORRUPT", f"footer state digest: {e}", offset=foff) from e
        frames = tuple(FrameEntry(e.offset, e.length, e.uncompressed_length, e.record_count,
                                  e.first_version, e.last_version, e.crc32) for e in ft.frames)
        pos = frames_start
        for fr in frames:  # frames tile [frames_start, footer) exactly, in version order
            if fr.offset != pos or fr.record_count == 0:
                raise BackupFormatError("CORRUPT", f"frame index inconsistent at offset {fr.offset}", offset=pos)
            pos += fr.length
        if pos != foff:
            raise BackupFormatError("CORRUPT", "frame index does not cover the frames section", offset=foff)
        if sum(fr.record_count for fr in frames) != ft.record_count:
            raise BackupFormatError("CORRUPT", "footer record count disagrees with the frame index", offset=foff)
        self.summary = BackupSummary(
            self.header, frames, ft.record_count, ft.tombstone_count, ft.last_version,
            ft.uncompressed_bytes, size, state_digest, foff,
        )

    @property
    def frames(self) -> tuple[FrameEntry, ...]:
        return self.summary.frames

    def read_frame(self, entry: FrameEntry) -> list[Record]:
        return read_frame(self._f, entry)

    def iter_frames(self) -> Iterator[tuple[FrameEntry, list[Record]]]:
        """Each frame with its records, in order; checks version order across frames."""
        check_frame_order(self.header, self.summary.frames)
        for entry in self.summary.frames:
            yield entry, self.read_frame(entry)

    def records(self) -> Iterator[Record]:
        """All records in file order, each frame verified before any of its records is yielded."""
        for _, recs in self.iter_frames():
            yield from recs

    def verify(self) -> BackupSummary:
        """Read every frame; check totals. Returns the summary or raises BackupFormatError."""
        count = tombs = raw = 0
        last = max(self.header.from_version - 1, 0)
        for entry, recs in self.iter_frames():
            count += len(recs)
            tombs += sum(1 for r in recs if r[1] is None)
            raw += entry.uncompressed_length
            last = entry.last_version
        s = self.summary
        if (count, tombs, raw, last) != (s.record_count, s.tombstone_count, s.uncompressed_bytes, s.last_version):
            raise BackupFormatError("CORRUPT", "footer totals disagree with the frames", offset=s.footer_offset)
        return s


def check_frame_order(header: BackupHeader, frames: Sequence[FrameEntry]) -> None:
    """The index alone (no frame read): every frame's versions lie in
    [header.from_version, header.to_version] and frames follow each other in version order.
    Raises BackupFormatError (CORRUPT) naming the first frame out of place."""
    prev = header.from_version
    for entry in frames:
        if (entry.first_version < prev or entry.last_version < entry.first_version
                or entry.last_version > header.to_version):
            raise BackupFormatError("CORRUPT", f"frame at offset {entry.offset}: versions out of range "
                                    f"({entry.first_version}..{entry.last_version} after {prev}, file "
                                    f"{header.from_version}..{header.to_version})", offset=entry.offset)
        prev = entry.last_version


def open_backup(path: str) -> tuple[BinaryIO, BackupReader]:
    """Open a file and its reader; the caller closes the returned file."""
    f = open(path, "rb")  # noqa: SIM115 - returned to the caller
    try:
        return f, BackupReader(f)
    except BaseException:
        f.close()
        raise
