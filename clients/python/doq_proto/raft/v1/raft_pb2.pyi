from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("messages", "cluster_ids")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_IDS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    cluster_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, messages: _Optional[_Iterable[bytes]] = ..., cluster_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SendSummary(_message.Message):
    __slots__ = ("frames", "messages")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    frames: int
    messages: int
    def __init__(self, frames: _Optional[int] = ..., messages: _Optional[int] = ...) -> None: ...
