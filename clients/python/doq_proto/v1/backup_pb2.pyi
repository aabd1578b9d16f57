from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BackupRecord(_message.Message):
    __slots__ = ("key", "value", "version", "tombstone")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    version: int
    tombstone: bool
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ..., tombstone: _Optional[bool] = ...) -> None: ...

class BackupHeader(_message.Message):
    __slots__ = ("cluster_id", "node_id", "from_version", "to_version", "created_at_ms", "compression")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    node_id: str
    from_version: int
    to_version: int
    created_at_ms: int
    compression: str
    def __init__(self, cluster_id: _Optional[str] = ..., node_id: _Optional[str] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., compression: _Optional[str] = ...) -> None: ...

class FrameIndexEntry(_message.Message):
    __slots__ = ("offset", "length", "uncompressed_length", "record_count", "first_version", "last_version", "crc32")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    uncompressed_length: int
    record_count: int
    first_version: int
    last_version: int
    crc32: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ..., uncompressed_length: _Optional[int] = ..., record_count: _Optional[int] = ..., first_version: _Optional[int] = ..., last_version: _Optional[int] = ..., crc32: _Optional[int] = ...) -> None: ...

class BackupFooter(_message.Message):
    __slots__ = ("frames", "record_count", "tombstone_count", "last_version", "uncompressed_bytes", "header_crc32", "state_digest")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADER_CRC32_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[FrameIndexEntry]
    record_count: int
    tombstone_count: int
    last_version: int
    uncompressed_bytes: int
    header_crc32: int
    state_digest: bytes
    def __init__(self, frames: _Optional[_Iterable[_Union[FrameIndexEntry, _Mapping]]] = ..., record_count: _Optional[int] = ..., tombstone_count: _Optional[int] = ..., last_version: _Optional[int] = ..., uncompressed_bytes: _Optional[int] = ..., header_crc32: _Optional[int] = ..., state_digest: _Optional[bytes] = ...) -> None: ...
