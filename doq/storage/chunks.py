"""Records of an online restore in bounded chunks: the payloads of `RestoreChunk` entries.

A chunk is ONE zstd frame (content size in its frame header) whose bytes are
length-delimited `BackupRecord`s, exactly the body of a backup frame (docs/backup.md,
"File format"): records are encoded and decoded by `doq.storage.recordio`, as a backup's,
so there is no second record format. `iter_chunks` cuts a record stream into chunks of
about `max_bytes` uncompressed bytes (at least one record each), so a log entry stays far
below the peer transport's message limit; `decode_chunk` is what every replica runs when
the restore commits. Both are pure functions of their input (deterministic).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

import zstandard

from doq.storage.recordio import (
    MAX_FRAME_BYTES,
    BackupFormatError,
    Record,
    _decode_records,
    encode_record,
)

DEFAULT_CHUNK_BYTES = 1 << 20  # uncompressed record bytes per chunk (target)
_LEVEL = 3


def iter_chunks(records: Iterable[Record], max_bytes: int = DEFAULT_CHUNK_BYTES,
                ) -> Generator[tuple[bytes, int], None, None]:
    """(payload, record count) per chunk, in record order; a chunk closes once it holds
    `max_bytes` or more (a larger record alone makes a larger chunk)."""
    if max_bytes <= 0:
        raise ValueError("max_bytes must be > 0")
    cctx = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=False, write_content_size=True)
    parts: list[bytes] = []
    size = 0
    for key, value, version in records:
        rec = encode_record(key, value, version)
        parts.append(rec)
        size += len(rec)
        if size >= max_bytes:
            yield cctx.compress(b"".join(parts)), len(parts)
            parts, size = [], 0
    if parts:
        yield cctx.compress(b"".join(parts)), len(parts)


def decode_chunk(payload: bytes) -> list[Record]:
    """The records of one chunk. Raises `BackupFormatError` (reason BACKUP_CORRUPT) on bytes
    that are not a chunk."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_FRAME_BYTES)
    except zstandard.ZstdError as e:
        raise BackupFormatError("CORRUPT", f"restore chunk: zstd decompression failed: {e}") from e
    return list(_decode_records(raw, "restore chunk"))
