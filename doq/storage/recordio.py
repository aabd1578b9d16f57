"""The record stream codec: how state records travel as bytes (pure; protobuf only).

A record is `(key, value or None for a tombstone, version)`. Encoded, it is one
length-delimited `doq.v1.BackupRecord` protobuf (identical to protobuf's own
serialization, hand-rolled for speed). Streams of them are the body of a backup file's
frames (`doq.backup.format`), of an online restore's chunks (`doq.storage.chunks`) and
of a Raft snapshot's data: one record format everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator

from doq_proto.v1 import backup_pb2 as pb

from doq.errors import InvalidArgument

Record = tuple[bytes, bytes | None, int]
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a reader refuses larger frames (corruption guard)


class BackupFormatError(InvalidArgument):
    """A backup file is not valid. `reason`: BAD_MAGIC, UNSUPPORTED_VERSION, TRUNCATED,
    CHECKSUM_MISMATCH or CORRUPT (all prefixed BACKUP_). `offset`: the byte offset in the
    file of the part found bad (the start of the frame, footer, trailer, ...), when known."""

    def __init__(self, reason: str, message: str, *, offset: int | None = None) -> None:
        super().__init__(message, reason=f"BACKUP_{reason}")
        self.offset = offset


_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_NVAR = 1 << 14
_VAR = [_varint(i) for i in range(_NVAR)]  # varints of 0 .. 16383


def _strip_len(record: bytes) -> bytes:
    """A length-delimited record without its length prefix."""
    pos = 0
    while record[pos] & 0x80:
        pos += 1
    return record[pos + 1 :]


def encode_record(key: bytes, value: bytes | None, version: int) -> bytes:
    """Length-delimited `BackupRecord` bytes, identical to protobuf's own serialization."""
    return b"".join(_record_parts(key, value, version)[0])


def _record_parts(key: bytes, value: bytes | None, version: int) -> tuple[list[bytes], int]:
    """The pieces of one length-delimited record and their total length."""
    # Hand-rolled proto3 encoding (fields in number order, defaults omitted): several
    # times faster than building a message object per record.
    parts: list[bytes] = [b""]
    size = 0
    if key:
        lk = _varint(len(key))
        parts += (b"\x0a", lk, key)
        size += 1 + len(lk) + len(key)
    if value:
        lv = _varint(len(value))
        parts += (b"\x12", lv, value)
        size += 1 + len(lv) + len(value)
    if version:
        vv = _varint(version)
        parts += (b"\x18", vv)
        size += 1 + len(vv)
    if value is None:
        parts.append(b"\x20\x01")
        size += 2
    head = _varint(size)
    parts[0] = head
    return parts, size + len(head)


def _decode_records(data: bytes, where: str) -> Iterator[Record]:
    """Records of one decompressed frame; raises BackupFormatError on malformed bytes."""
    pos, end = 0, len(data)
    mv = memoryview(data)
    parse = pb.BackupRecord.FromString
    while pos < end:
        n = 0
        shift = 0
        while True:
            if pos >= end or shift > 63:
                raise BackupFormatError("CORRUPT", f"{where}: malformed record length")
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        if pos + n > end:
            raise BackupFormatError("CORRUPT", f"{where}: record runs past the end of the frame")
        try:
            msg = parse(mv[pos : pos + n])
        except Exception as e:  # protobuf raises DecodeError (a Message error)
            raise BackupFormatError("CORRUPT", f"{where}: undecodable record: {e}") from e
        pos += n
        if msg.tombstone:
            if msg.value:
                raise BackupFormatError("CORRUPT", f"{where}: tombstone with a value")
            yield (msg.key, None, msg.version)
        else:
            yield (msg.key, msg.value, msg.version)
