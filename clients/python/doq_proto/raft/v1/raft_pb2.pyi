from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("messages", "cluster_ids", "alarms")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_IDS_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    cluster_ids: _containers.RepeatedScalarFieldContainer[str]
    alarms: _containers.RepeatedCompositeFieldContainer[StorageAlarm]
    def __init__(self, messages: _Optional[_Iterable[bytes]] = ..., cluster_ids: _Optional[_Iterable[str]] = ..., alarms: _Optional[_Iterable[_Union[StorageAlarm, _Mapping]]] = ...) -> None: ...

class StorageAlarm(_message.Message):
    __slots__ = ("reason", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    message: str
    def __init__(self, reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
