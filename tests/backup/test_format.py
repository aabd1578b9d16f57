"""The backup file format: round trip, canonical encoding, corruption, random access."""

from __future__ import annotations

import io
import struct

import pytest
import zstandard
from doq_proto.v1 import backup_pb2 as pb
from hypothesis import given, settings
from hypothesis import strategies as st

from doq.backup.format import (
    MAGIC,
    TRAILER,
    BackupFormatError,
    BackupReader,
    BackupWriter,
    encode_record,
    read_frame,
    write_records,
)

record = st.tuples(
    st.binary(max_size=40),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.integers(min_value=0, max_value=2**64 - 1),
)


def _file(records, *, from_version=0, to_version=None, frame_bytes=512, **kw) -> io.BytesIO:
    buf = io.BytesIO()
    top = max([r[2] for r in records], default=0)
    write_records(buf, records, from_version=from_version,
                  to_version=top if to_version is None else to_version, frame_bytes=frame_bytes, **kw)
    buf.seek(0)
    return buf


@settings(max_examples=150, deadline=None)
@given(st.lists(record, max_size=200).map(lambda rs: sorted(rs, key=lambda r: r[2])),
       st.integers(min_value=1, max_value=4096))
def test_round_trip(records, frame_bytes):
    buf = _file(records, frame_bytes=frame_bytes, cluster_id="c1", node_id="n1")
    r = BackupReader(buf)
    assert list(r.records()) == records
    s = r.verify()
    assert s.record_count == len(records)
    assert s.tombstone_count == sum(1 for x in records if x[1] is None)
    assert s.last_version == (records[-1][2] if records else 0)
    assert (r.header.cluster_id, r.header.node_id) == ("c1", "n1")
    # every frame decodes on its own, and the frames in order give all the records
    assert [x for e in r.frames for x in read_frame(buf, e)] == records
    # the writer's fast path emits protobuf's canonical bytes
    raw = b"".join(
        zstandard.ZstdDecompressor().decompress(buf.getvalue()[e.offset : e.offset + e.length])
        for e in r.frames
    )
    assert raw == b"".join(encode_record(*x) for x in records)


def test_large_keys_values_and_versions_round_trip():
    recs = [(b"k" * 20000, b"v" * 70000, 1), (b"", b"", 2), (b"x", None, 2**40),
            (b"k" * 17000, None, 2**63)]
    buf = _file(recs, frame_bytes=1024)
    r = BackupReader(buf)
    assert list(r.records()) == recs
    raw = b"".join(zstandard.ZstdDecompressor().decompress(buf.getvalue()[e.offset : e.offset + e.length])
                   for e in r.frames)
    assert raw == b"".join(encode_record(*x) for x in recs)


@given(record)
def test_encoding_is_protobufs_own(rec):
    key, value, version = rec
    msg = pb.BackupRecord(key=key, value=value or b"", version=version, tombstone=value is None)
    body = msg.SerializeToString()
    encoded = encode_record(key, value, version)
    assert encoded.endswith(body)
    assert len(encoded) - len(body) in (1, 2, 3)  # varint length prefix


def test_empty_file_is_valid_and_last_version_is_since_minus_one():
    buf = io.BytesIO()
    s = BackupWriter(buf, from_version=11, to_version=10).close()
    assert s.last_version == 10 and s.record_count == 0 and s.frames == ()
    buf.seek(0)
    r = BackupReader(buf)
    assert r.verify().last_version == 10
    assert list(r.records()) == []
    assert (r.header.from_version, r.header.to_version) == (11, 10)


def test_writer_refuses_out_of_order_and_out_of_range_versions():
    w = BackupWriter(io.BytesIO(), from_version=5, to_version=9)
    w.add(b"a", b"1", 5)
    with pytest.raises(ValueError):
        w.add(b"b", b"1", 4)
    with pytest.raises(ValueError):
        w.add(b"b", b"1", 10)


def test_frames_are_bounded_and_random_access():
    recs = [(b"key-%06d" % i, b"x" * 100, i + 1) for i in range(5000)]
    buf = _file(recs, frame_bytes=16 * 1024)
    r = BackupReader(buf)
    assert len(r.frames) > 10
    assert all(e.uncompressed_length < 16 * 1024 + 200 for e in r.frames)
    mid = r.frames[len(r.frames) // 2]
    got = read_frame(io.BytesIO(buf.getvalue()), mid)  # a fresh handle, only the entry
    assert got[0][2] == mid.first_version and got[-1][2] == mid.last_version
    assert got == recs[mid.first_version - 1 : mid.last_version]


SAMPLE = [(b"k%d" % i, None if i % 7 == 0 else b"v" * (i % 50), i + 1) for i in range(2000)]


def _corrupt(data: bytes, pos: int) -> io.BytesIO:
    b = bytearray(data)
    b[pos] ^= 0x40
    return io.BytesIO(bytes(b))


def test_flipped_byte_in_a_frame_is_a_checksum_error():
    data = _file(SAMPLE).getvalue()
    entry = BackupReader(io.BytesIO(data)).frames[3]
    r = BackupReader(_corrupt(data, entry.offset + entry.length // 2))  # structure still fine
    with pytest.raises(BackupFormatError) as e:
        r.verify()
    assert e.value.reason == "BACKUP_CHECKSUM_MISMATCH"
    assert f"offset {entry.offset}" in e.value.message


@pytest.mark.parametrize("where", ["header", "footer"])
def test_flipped_byte_in_header_or_footer(where):
    data = _file(SAMPLE).getvalue()
    foff = struct.unpack_from("<Q", data, len(data) - TRAILER.size)[0]
    pos = 20 if where == "header" else foff + 3
    with pytest.raises(BackupFormatError) as e:
        BackupReader(_corrupt(data, pos))
    assert e.value.reason == "BACKUP_CHECKSUM_MISMATCH"


@pytest.mark.parametrize("keep", [0, 5, 16, 100, -1, -32, -33])
def test_truncated_file(keep):
    data = _file(SAMPLE).getvalue()
    cut = data[:keep] if keep >= 0 else data[: len(data) + keep]
    with pytest.raises(BackupFormatError) as e:
        BackupReader(io.BytesIO(cut))
    assert e.value.reason == "BACKUP_TRUNCATED"
    assert "truncated" in e.value.message


def test_wrong_magic():
    data = _file(SAMPLE).getvalue()
    with pytest.raises(BackupFormatError) as e:
        BackupReader(io.BytesIO(b"PK\x03\x04" + data[4:]))
    assert e.value.reason == "BACKUP_BAD_MAGIC"
    assert "not a doq backup" in e.value.message


def test_unsupported_version():
    data = bytearray(_file(SAMPLE).getvalue())
    data[len(MAGIC)] = 9
    with pytest.raises(BackupFormatError) as e:
        BackupReader(io.BytesIO(bytes(data)))
    assert e.value.reason == "BACKUP_UNSUPPORTED_VERSION"


def test_bad_frame_index_is_detected_before_reading_frames():
    # A footer whose frame offsets do not tile the frames section (re-signed, so only the
    # structural check can catch it).
    import zlib

    data = _file(SAMPLE).getvalue()
    foff, flen, _, ver, res, end = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    footer = pb.BackupFooter.FromString(data[foff : foff + flen])
    footer.frames[1].offset += 1
    fb = footer.SerializeToString()
    bad = data[:foff] + fb + TRAILER.pack(foff, len(fb), zlib.crc32(fb), ver, res, end)
    with pytest.raises(BackupFormatError) as e:
        BackupReader(io.BytesIO(bad))
    assert e.value.reason == "BACKUP_CORRUPT"


def _trailer_at(data: bytes) -> int:
    return len(data) - TRAILER.size


@pytest.mark.parametrize(("offset_in_trailer", "says"), [
    (20, "trailer's format version"),  # the version field
    (22, "trailer's reserved field"),  # the reserved field
    (0, "points outside the file"),  # the footer offset
    (8, "points outside the file"),  # the footer length
])
def test_each_damaged_trailer_field_is_named_for_what_it_is(offset_in_trailer: int, says: str) -> None:
    data = _file(SAMPLE).getvalue()
    with pytest.raises(BackupFormatError) as e:
        BackupReader(_corrupt(data, _trailer_at(data) + offset_in_trailer))
    assert e.value.reason == "BACKUP_CORRUPT" and says in e.value.message, e.value.message
    others = {"trailer's format version", "trailer's reserved field", "points outside the file"} - {says}
    assert not any(o in e.value.message for o in others)


def test_data_appended_after_the_end_is_named_as_such_not_as_truncation() -> None:
    data = _file(SAMPLE).getvalue()
    with pytest.raises(BackupFormatError) as e:
        BackupReader(io.BytesIO(data + b"\x17" * 100))
    assert e.value.reason == "BACKUP_CORRUPT"
    assert "100 bytes of other data after the end of the backup" in e.value.message
    assert "truncated" not in e.value.message
