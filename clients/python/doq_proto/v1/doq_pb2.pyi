from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueSettings(_message.Message):
    __slots__ = ("visibility_timeout_ms", "max_attempts", "dead_letter_queue", "max_unacked_per_group", "dedup_window_ms", "default_group_weight", "default_group_max_per_second")
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_PER_GROUP_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    visibility_timeout_ms: int
    max_attempts: int
    dead_letter_queue: str
    max_unacked_per_group: int
    dedup_window_ms: int
    default_group_weight: int
    default_group_max_per_second: int
    def __init__(self, visibility_timeout_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., dead_letter_queue: _Optional[str] = ..., max_unacked_per_group: _Optional[int] = ..., dedup_window_ms: _Optional[int] = ..., default_group_weight: _Optional[int] = ..., default_group_max_per_second: _Optional[int] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("ready", "delayed", "in_flight", "dead", "total")
    READY_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ready: int
    delayed: int
    in_flight: int
    dead: int
    total: int
    def __init__(self, ready: _Optional[int] = ..., delayed: _Optional[int] = ..., in_flight: _Optional[int] = ..., dead: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "type", "settings", "stats")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    settings: QueueSettings
    stats: QueueStats
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., stats: _Optional[_Union[QueueStats, _Mapping]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "queue_name", "content", "group", "priority", "metadata", "attempts", "deliver_at_ms", "lease_expires_at_ms", "enqueued_at_ms", "state", "lease_id", "dedup_id")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUP_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    queue_name: str
    content: bytes
    group: str
    priority: int
    metadata: _containers.ScalarMap[str, str]
    attempts: int
    deliver_at_ms: int
    lease_expires_at_ms: int
    enqueued_at_ms: int
    state: str
    lease_id: int
    dedup_id: str
    def __init__(self, id: _Optional[int] = ..., queue_name: _Optional[str] = ..., content: _Optional[bytes] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., attempts: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., lease_expires_at_ms: _Optional[int] = ..., enqueued_at_ms: _Optional[int] = ..., state: _Optional[str] = ..., lease_id: _Optional[int] = ..., dedup_id: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "reason", "message", "retryable", "leader_hint")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_HINT_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    retryable: bool
    leader_hint: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., leader_hint: _Optional[str] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("name", "type", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class CreateQueueResponse(_message.Message):
    __slots__ = ("success", "queue")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    queue: Queue
    def __init__(self, success: _Optional[bool] = ..., queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("name", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class UpdateQueueResponse(_message.Message):
    __slots__ = ("success", "queue")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    queue: Queue
    def __init__(self, success: _Optional[bool] = ..., queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("page_token", "max_results")
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    page_token: str
    max_results: int
    def __init__(self, page_token: _Optional[str] = ..., max_results: _Optional[int] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    next_page_token: str
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "ready", "in_flight", "weight", "max_per_second", "throttled", "overridden")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    OVERRIDDEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    ready: int
    in_flight: int
    weight: int
    max_per_second: int
    throttled: bool
    overridden: bool
    def __init__(self, group: _Optional[str] = ..., ready: _Optional[int] = ..., in_flight: _Optional[int] = ..., weight: _Optional[int] = ..., max_per_second: _Optional[int] = ..., throttled: _Optional[bool] = ..., overridden: _Optional[bool] = ...) -> None: ...

class SetGroupPolicyRequest(_message.Message):
    __slots__ = ("queue_name", "group", "weight", "max_per_second", "reset")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    group: str
    weight: int
    max_per_second: int
    reset: bool
    def __init__(self, queue_name: _Optional[str] = ..., group: _Optional[str] = ..., weight: _Optional[int] = ..., max_per_second: _Optional[int] = ..., reset: _Optional[bool] = ...) -> None: ...

class SetGroupPolicyResponse(_message.Message):
    __slots__ = ("success", "group")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    success: bool
    group: GroupInfo
    def __init__(self, success: _Optional[bool] = ..., group: _Optional[_Union[GroupInfo, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("queue_name",)
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    def __init__(self, queue_name: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("queue_name", "content", "group", "priority", "metadata", "dedup_id", "delay_ms")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DEDUP_ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    content: bytes
    group: str
    priority: int
    metadata: _containers.ScalarMap[str, str]
    dedup_id: str
    delay_ms: int
    def __init__(self, queue_name: _Optional[str] = ..., content: _Optional[bytes] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., dedup_id: _Optional[str] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("success", "id", "duplicate", "error", "group", "priority", "deliver_at_ms")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    id: int
    duplicate: bool
    error: Error
    group: str
    priority: int
    deliver_at_ms: int
    def __init__(self, success: _Optional[bool] = ..., id: _Optional[int] = ..., duplicate: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ("messages", "columns")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    columns: EnqueueColumns
    def __init__(self, messages: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., columns: _Optional[_Union[EnqueueColumns, _Mapping]] = ...) -> None: ...

class EnqueueColumns(_message.Message):
    __slots__ = ("queue_name", "contents", "groups", "priorities", "metadata", "dedup_ids", "delays_ms")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DEDUP_IDS_FIELD_NUMBER: _ClassVar[int]
    DELAYS_MS_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    contents: _containers.RepeatedScalarFieldContainer[bytes]
    groups: _containers.RepeatedScalarFieldContainer[str]
    priorities: _containers.RepeatedScalarFieldContainer[int]
    metadata: _containers.RepeatedCompositeFieldContainer[Metadata]
    dedup_ids: _containers.RepeatedScalarFieldContainer[str]
    delays_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_name: _Optional[str] = ..., contents: _Optional[_Iterable[bytes]] = ..., groups: _Optional[_Iterable[str]] = ..., priorities: _Optional[_Iterable[int]] = ..., metadata: _Optional[_Iterable[_Union[Metadata, _Mapping]]] = ..., dedup_ids: _Optional[_Iterable[str]] = ..., delays_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.ScalarMap[str, str]
    def __init__(self, entries: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ("results", "ids", "duplicates", "deliver_at_ms", "error", "error_positions", "errors")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueResponse]
    ids: _containers.RepeatedScalarFieldContainer[int]
    duplicates: _containers.RepeatedScalarFieldContainer[int]
    deliver_at_ms: _containers.RepeatedScalarFieldContainer[int]
    error: Error
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    errors: _containers.RepeatedCompositeFieldContainer[Error]
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueResponse, _Mapping]]] = ..., ids: _Optional[_Iterable[int]] = ..., duplicates: _Optional[_Iterable[int]] = ..., deliver_at_ms: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., error_positions: _Optional[_Iterable[int]] = ..., errors: _Optional[_Iterable[_Union[Error, _Mapping]]] = ...) -> None: ...

class DequeueRequest(_message.Message):
    __slots__ = ("queue_name", "ack", "max_messages", "wait_ms", "visibility_timeout_ms")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    ack: bool
    max_messages: int
    wait_ms: int
    visibility_timeout_ms: int
    def __init__(self, queue_name: _Optional[str] = ..., ack: _Optional[bool] = ..., max_messages: _Optional[int] = ..., wait_ms: _Optional[int] = ..., visibility_timeout_ms: _Optional[int] = ...) -> None: ...

class DequeueResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class DequeueStreamRequest(_message.Message):
    __slots__ = ("queue_name", "ack", "prefetch", "credits", "ack_ids", "nacks", "visibility_timeout_ms", "max_batch", "auto_credit", "ack_lease_ids", "columns")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    ACK_IDS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    AUTO_CREDIT_FIELD_NUMBER: _ClassVar[int]
    ACK_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    ack: bool
    prefetch: int
    credits: int
    ack_ids: _containers.RepeatedScalarFieldContainer[int]
    nacks: _containers.RepeatedCompositeFieldContainer[NackRequest]
    visibility_timeout_ms: int
    max_batch: int
    auto_credit: bool
    ack_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    columns: bool
    def __init__(self, queue_name: _Optional[str] = ..., ack: _Optional[bool] = ..., prefetch: _Optional[int] = ..., credits: _Optional[int] = ..., ack_ids: _Optional[_Iterable[int]] = ..., nacks: _Optional[_Iterable[_Union[NackRequest, _Mapping]]] = ..., visibility_timeout_ms: _Optional[int] = ..., max_batch: _Optional[int] = ..., auto_credit: _Optional[bool] = ..., ack_lease_ids: _Optional[_Iterable[int]] = ..., columns: _Optional[bool] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages", "columns")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    columns: MessageColumns
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., columns: _Optional[_Union[MessageColumns, _Mapping]] = ...) -> None: ...

class MessageColumns(_message.Message):
    __slots__ = ("queue_name", "ids", "contents", "lease_ids", "attempts", "lease_expires_at_ms", "enqueued_at_ms", "dedup_ids", "groups", "priorities", "deliver_at_ms", "metadata")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    contents: _containers.RepeatedScalarFieldContainer[bytes]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    attempts: _containers.RepeatedScalarFieldContainer[int]
    lease_expires_at_ms: _containers.RepeatedScalarFieldContainer[int]
    enqueued_at_ms: _containers.RepeatedScalarFieldContainer[int]
    dedup_ids: _containers.RepeatedScalarFieldContainer[str]
    groups: _containers.RepeatedScalarFieldContainer[str]
    priorities: _containers.RepeatedScalarFieldContainer[int]
    deliver_at_ms: _containers.RepeatedScalarFieldContainer[int]
    metadata: _containers.RepeatedCompositeFieldContainer[Metadata]
    def __init__(self, queue_name: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., contents: _Optional[_Iterable[bytes]] = ..., lease_ids: _Optional[_Iterable[int]] = ..., attempts: _Optional[_Iterable[int]] = ..., lease_expires_at_ms: _Optional[_Iterable[int]] = ..., enqueued_at_ms: _Optional[_Iterable[int]] = ..., dedup_ids: _Optional[_Iterable[str]] = ..., groups: _Optional[_Iterable[str]] = ..., priorities: _Optional[_Iterable[int]] = ..., deliver_at_ms: _Optional[_Iterable[int]] = ..., metadata: _Optional[_Iterable[_Union[Metadata, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("queue_name", "id")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class PeekRequest(_message.Message):
    __slots__ = ("queue_name", "state", "offset", "limit")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    state: str
    offset: int
    limit: int
    def __init__(self, queue_name: _Optional[str] = ..., state: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class PeekResponse(_message.Message):
    __slots__ = ("messages", "next_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    next_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("queue_name", "id", "lease_id")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    lease_id: int
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ..., lease_id: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("queue_name", "id", "lease_id")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    lease_id: int
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ..., lease_id: _Optional[int] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("queue_name", "ids", "lease_ids")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_name: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("id", "success", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    success: bool
    error: Error
    def __init__(self, id: _Optional[int] = ..., success: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("queue_name", "id", "delay_ms", "priority", "lease_id", "release")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    delay_ms: int
    priority: int
    lease_id: int
    release: bool
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ..., delay_ms: _Optional[int] = ..., priority: _Optional[int] = ..., lease_id: _Optional[int] = ..., release: _Optional[bool] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class TouchRequest(_message.Message):
    __slots__ = ("queue_name", "id", "visibility_timeout_ms", "lease_id")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    visibility_timeout_ms: int
    lease_id: int
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ..., visibility_timeout_ms: _Optional[int] = ..., lease_id: _Optional[int] = ...) -> None: ...

class TouchResponse(_message.Message):
    __slots__ = ("success", "lease_expires_at_ms")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    lease_expires_at_ms: int
    def __init__(self, success: _Optional[bool] = ..., lease_expires_at_ms: _Optional[int] = ...) -> None: ...

class UpdatePriorityRequest(_message.Message):
    __slots__ = ("queue_name", "id", "priority")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    id: int
    priority: int
    def __init__(self, queue_name: _Optional[str] = ..., id: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class UpdatePriorityResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: Message
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class Server(_message.Message):
    __slots__ = ("id", "raft_addr", "grpc_addr", "http_addr", "leader", "voter")
    ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    id: str
    raft_addr: str
    grpc_addr: str
    http_addr: str
    leader: bool
    voter: bool
    def __init__(self, id: _Optional[str] = ..., raft_addr: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ..., leader: _Optional[bool] = ..., voter: _Optional[bool] = ...) -> None: ...

class ListServersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListServersResponse(_message.Message):
    __slots__ = ("servers", "leader_id")
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[Server]
    leader_id: str
    def __init__(self, servers: _Optional[_Iterable[_Union[Server, _Mapping]]] = ..., leader_id: _Optional[str] = ...) -> None: ...

class ApiKey(_message.Message):
    __slots__ = ("id", "scopes", "created_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    created_ms: int
    def __init__(self, id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., created_ms: _Optional[int] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ("scopes",)
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ("key_info", "key")
    KEY_INFO_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key_info: ApiKey
    key: str
    def __init__(self, key_info: _Optional[_Union[ApiKey, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class StartRedriveRequest(_message.Message):
    __slots__ = ("queue_name", "to", "max_per_second")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    to: str
    max_per_second: int
    def __init__(self, queue_name: _Optional[str] = ..., to: _Optional[str] = ..., max_per_second: _Optional[int] = ...) -> None: ...

class CancelRedriveRequest(_message.Message):
    __slots__ = ("queue_name",)
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    def __init__(self, queue_name: _Optional[str] = ...) -> None: ...

class GetRedriveRequest(_message.Message):
    __slots__ = ("queue_name",)
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    def __init__(self, queue_name: _Optional[str] = ...) -> None: ...

class RedriveTask(_message.Message):
    __slots__ = ("queue_name", "to", "state", "max_per_second", "moved", "remaining", "total", "started_at_ms", "updated_at_ms", "reason")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    to: str
    state: str
    max_per_second: int
    moved: int
    remaining: int
    total: int
    started_at_ms: int
    updated_at_ms: int
    reason: str
    def __init__(self, queue_name: _Optional[str] = ..., to: _Optional[str] = ..., state: _Optional[str] = ..., max_per_second: _Optional[int] = ..., moved: _Optional[int] = ..., remaining: _Optional[int] = ..., total: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
